"""What consistent_hash hashes (origin.hash_key): the client address, the path, a
header or a cookie, read from a request head; the address when it is missing."""

from __future__ import annotations

import pytest

from origin.hash_key import HashKey, key_for, needs_head

HEAD = (
    b"GET /cart?id=7 HTTP/1.1\r\nHost: shop.test\r\nX-User: alice\r\n"
    b"Cookie: theme=dark; session=s-42; other=1\r\n\r\nbody after the head"
)


def test_each_kind_of_key() -> None:
    def key(spec: str, head: bytes = HEAD) -> bytes:
        return key_for(HashKey.parse(spec), "203.0.113.9", "/cart?id=7", head)

    assert key("client_ip") == b"203.0.113.9"
    assert key("path") == b"/cart"
    assert key("header:X-User") == b"alice"  # names are case-insensitive
    assert key("cookie:session") == b"s-42"
    # Missing: the client address, so the request still lands somewhere stable.
    assert key("header:x-tenant") == b"203.0.113.9"
    assert key("cookie:sess") == b"203.0.113.9"
    assert key("cookie:session", b"GET / HTTP/1.1\r\nHost: a\r\n") == b"203.0.113.9"
    assert needs_head(HashKey.parse("cookie:session"))
    assert not needs_head(HashKey.parse("path"))


@pytest.mark.parametrize("spec", ["", "ip", "header:", "cookie", "header:x y", "url"])
def test_a_bad_spec_names_the_choices(spec: str) -> None:
    with pytest.raises(ValueError, match="client_ip, path, header:<name> or cookie:<name>"):
        HashKey.parse(spec)
