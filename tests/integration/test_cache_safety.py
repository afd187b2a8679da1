"""Nothing private leaks through the edge's cache (DESIGN principle 16).

Two "users" are two separate TLS connections; Node.js (tests/cache_backend.mjs)
counts what reaches it and echoes what it was sent, so a test can tell a
response that came from the cache from one made for the asker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cache_env import CacheStack, cache_stack
from tests.conftest import PkiFiles, scaled
from tests.edge_env import node_available

pytestmark = [
    pytest.mark.timeout(scaled(120)),
    pytest.mark.skipif(not node_available(), reason="needs Node.js (make node)"),
]

KEYS = """
bypass_path_prefixes = ["/account/"]
bypass_headers = ["X-Debug"]
[cache.key]
cookies = ["lang"]
ignore_query_params = ["utm_*"]
"""


@pytest.fixture(scope="module")
def chain(test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CacheStack]:
    with cache_stack(
        test_pki, tmp_path_factory.mktemp("safety"), cache_keys=KEYS, compression=True
    ) as s:
        yield s


def echo(body: bytes) -> dict[str, object]:
    return json.loads(body)  # type: ignore[no-any-return]


def test_a_private_response_is_never_served_to_another_user(chain: CacheStack) -> None:
    path = "/private?cc=private,max-age=600"
    alice = chain.fetch(path, {"Cookie": "session=alice"})
    bob = chain.fetch(path, {"Cookie": "session=bob"})
    assert echo(alice.body)["count"] == 1 and echo(bob.body)["count"] == 2
    assert chain.count("/private") == 2


def test_a_response_that_sets_a_cookie_is_never_stored(chain: CacheStack) -> None:
    path = "/set-cookie?cc=public,max-age=600&cookie=session%3Dalice"
    alice = chain.fetch(path)
    bob = chain.fetch(path)
    assert alice.field("Set-Cookie") == "session=alice"
    assert echo(bob.body)["count"] == 2  # made for Bob, not Alice's copy
    assert chain.count("/set-cookie") == 2


def test_a_response_to_an_authorized_request_is_not_stored_unless_public(
    chain: CacheStack,
) -> None:
    personal = "/authz?cc=max-age=600"
    chain.fetch(personal, {"Authorization": "Bearer alice"})
    chain.fetch(personal)
    assert chain.count("/authz") == 2
    shared = "/authz-public?cc=public,max-age=600"
    chain.fetch(shared, {"Authorization": "Bearer alice"})
    chain.fetch(shared)
    assert chain.count("/authz-public") == 1  # the origin said it is for everyone


def test_a_client_forwarding_field_cannot_poison_the_stored_response(chain: CacheStack) -> None:
    path = "/poison?cc=public,max-age=600&echo=x-forwarded-host,x-forwarded-for,forwarded"
    attacker = chain.fetch(
        path,
        {
            "X-Forwarded-Host": "evil.example",
            "X-Forwarded-For": "6.6.6.6",
            "Forwarded": "host=evil.example",
        },
    )
    seen = echo(attacker.body)["echo"]
    assert isinstance(seen, dict)
    assert seen["x-forwarded-host"] == "localhost"
    assert "6.6.6.6" not in str(seen["x-forwarded-for"])
    assert "evil" not in str(seen["forwarded"])
    victim = chain.fetch(path)
    assert b"evil" not in victim.body and b"6.6.6.6" not in victim.body
    assert "hit" in (victim.field("Cache-Status") or "")


def test_the_host_is_part_of_the_key(chain: CacheStack) -> None:
    path = "/host?cc=public,max-age=600&echo=host"
    one = chain.fetch(path, {"Host": "localhost"})
    other = chain.fetch(path, {"Host": "other.example"})
    assert echo(one.body)["count"] == 1 and echo(other.body)["count"] == 2


def test_vary_keeps_variants_apart_and_vary_star_is_never_served(chain: CacheStack) -> None:
    path = "/vary?cc=public,max-age=600&vary=X-Lang"
    fr = chain.fetch(path, {"X-Lang": "fr"})
    de = chain.fetch(path, {"X-Lang": "de"})
    fr_again = chain.fetch(path, {"X-Lang": "fr"})
    assert echo(fr.body)["count"] == 1 and echo(de.body)["count"] == 2
    assert fr_again.body == fr.body
    star = "/vary-star?cc=public,max-age=600&vary=*"
    chain.fetch(star)
    chain.fetch(star)
    assert chain.count("/vary-star") == 2


def test_a_configured_cookie_is_in_the_key_and_other_cookies_are_not(chain: CacheStack) -> None:
    path = "/lang?cc=public,max-age=600"
    en = chain.fetch(path, {"Cookie": "lang=en; session=alice"})
    en_bob = chain.fetch(path, {"Cookie": "session=bob; lang=en"})
    fr = chain.fetch(path, {"Cookie": "lang=fr"})
    assert en_bob.body == en.body
    assert echo(fr.body)["count"] == 2
    assert chain.count("/lang") == 2


def test_ignored_query_parameters_share_an_entry_and_others_do_not(chain: CacheStack) -> None:
    chain.fetch("/query?cc=public,max-age=600&utm_source=a")
    chain.fetch("/query?cc=public,max-age=600&utm_source=b&utm_medium=c")
    assert chain.count("/query") == 1
    chain.fetch("/query?cc=public,max-age=600&page=2")
    assert chain.count("/query") == 2


def test_bypass_by_path_prefix_and_by_request_field(chain: CacheStack) -> None:
    for _ in range(2):
        reply = chain.fetch("/account/me?cc=public,max-age=600")
        assert "fwd=bypass" in (reply.field("Cache-Status") or "")
        chain.fetch("/debugged?cc=public,max-age=600", {"X-Debug": "1"})
    assert chain.count("/account/me") == 2
    assert chain.count("/debugged") == 2


def test_secrets_are_never_compressed_beside_reflected_text(chain: CacheStack) -> None:
    """BREACH: a private response or one that sets a cookie goes out as it came."""
    for path in (
        "/breach-private?cc=private&size=5000&type=text/html",
        "/breach-cookie?size=5000&type=text/html&cookie=s%3D1",
    ):
        reply = chain.fetch(path, {"Accept-Encoding": "gzip, br, zstd"})
        assert reply.field("Content-Encoding") is None
        assert len(reply.body) == 5000
