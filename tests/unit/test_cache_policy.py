"""The cache's pure decisions as tables (edge.cache.directives, .freshness,
.policy, .conditions, .keys, .compress): no sockets, no clock but ``now``."""

from __future__ import annotations

import math

import pytest

from edge.cache.compress import compressible, negotiate
from edge.cache.conditions import UNSATISFIABLE, byte_range, freshened_fields, not_modified
from edge.cache.config import CacheKeyConfig, CompressionConfig
from edge.cache.directives import INVALID, delta_seconds, parse_age, parse_directives
from edge.cache.entry import StoredResponse
from edge.cache.freshness import ResponseFacts, freshness_lifetime, initial_age
from edge.cache.keys import KeyMaker, normalise_url
from edge.cache.policy import (
    RequestFacts,
    Reuse,
    accepted_codings,
    invalidates,
    not_storable,
    reuse,
    stale_on_error,
    variant_matches,
    vary_values,
)

NOW = 1_800_000_000.0
DATE = b"Fri, 15 Jan 2027 08:00:00 GMT"


def facts(status: int = 200, **fields: str) -> ResponseFacts:
    return ResponseFacts.of(
        status, [(k.replace("_", "-").encode(), v.encode()) for k, v in fields.items()]
    )


def entry(
    *,
    lifetime: float = 60,
    age: float = 0,
    status: int = 200,
    body: bytes = b"0123456789",
    **fields: str,
) -> StoredResponse:
    headers = [(k.replace("_", "-").encode(), v.encode()) for k, v in fields.items()]
    return StoredResponse(
        key="k",
        url="https://h/p",
        status=status,
        reason=b"OK",
        headers=headers,
        body=body,
        vary=(),
        request_time=NOW,
        response_time=NOW,
        initial_age=age,
        lifetime=lifetime,
        facts=ResponseFacts.of(status, headers),
    )


GET = RequestFacts.of(b"GET", [])


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([b"max-age=60"], {b"max-age": b"60"}),
        ([b"MAX-AGE=60, No-Store"], {b"max-age": b"60", b"no-store": None}),
        ([b'extension="max-age=1", max-age=5'], {b"extension": b"max-age=1", b"max-age": b"5"}),
        ([b'max-age="30"'], {b"max-age": b"30"}),
        ([b"max-age=1", b"max-age=99"], {b"max-age": b"1"}),  # the first occurrence wins
        ([b'private="set-cookie, x", public'], {b"private": b"set-cookie, x", b"public": None}),
        ([b",, ,max-age=3"], {b"max-age": b"3"}),
    ],
)
def test_cache_control_directives(values: list[bytes], expected: dict[bytes, bytes | None]) -> None:
    assert parse_directives(values).values == expected


def test_a_surrogate_control_directive_for_another_device_is_not_ours() -> None:
    parsed = parse_directives([b"max-age=60;other-device, no-store"], targeted=True)
    assert parsed.values == {b"no-store": None}


@pytest.mark.parametrize(
    ("value", "expected"),
    [(b"0", 0), (b"003600", 3600), (b"-1", INVALID), (b"'60'", INVALID), (b"1.5", INVALID),
     (b"99999999999", 2**31), (None, INVALID)],
)  # fmt: skip
def test_delta_seconds(value: bytes | None, expected: int) -> None:
    assert delta_seconds(value) == expected


@pytest.mark.parametrize(
    ("lines", "expected"),
    [([], None), ([b"30"], 30), ([b"0, 0"], INVALID), ([b"0", b"0"], INVALID),
     ([b"7200.0"], INVALID), ([b"1;a=b"], INVALID)],
)  # fmt: skip
def test_age_is_one_line_of_digits_or_invalid(lines: list[bytes], expected: int | None) -> None:
    assert parse_age(lines) == expected


@pytest.mark.parametrize(
    ("fields", "lifetime"),
    [
        ({"cache_control": "max-age=60"}, 60),
        ({"cache_control": "max-age=600, s-maxage=10"}, 10),  # a shared cache takes s-maxage
        ({"cache_control": "max-age=-5"}, 0),
        ({"cache_control": "max-age=60", "cdn_cache_control": "max-age=5"}, 5),  # RFC 9213
        ({"surrogate_control": "max-age=7", "cache_control": "no-store"}, 7),
        ({"date": "Fri, 15 Jan 2027 08:00:00 GMT", "expires": "Fri, 15 Jan 2027 08:01:00 GMT"}, 60),
        ({"expires": "0"}, 0),  # an invalid Expires has expired
        # heuristic: 10% of the 10 days since Last-Modified, capped at a day
        ({"date": "Fri, 15 Jan 2027 08:00:00 GMT", "last_modified": "Tue, 05 Jan 2027 08:00:00 GMT"},  # noqa: E501
         86_400),
        ({"date": "Fri, 15 Jan 2027 08:00:00 GMT", "last_modified": "Fri, 15 Jan 2027 07:00:00 GMT"},  # noqa: E501
         360),
        ({}, 0),
    ],
)  # fmt: skip
def test_freshness_lifetime(fields: dict[str, str], lifetime: float) -> None:
    assert freshness_lifetime(facts(**fields), NOW) == pytest.approx(lifetime)


def test_heuristic_freshness_only_for_heuristically_cacheable_statuses() -> None:
    modified = {
        "date": "Fri, 15 Jan 2027 08:00:00 GMT",
        "last_modified": "Fri, 15 Jan 2027 07:00:00 GMT",
    }
    assert freshness_lifetime(facts(404, **modified), NOW) > 0
    assert freshness_lifetime(facts(502, **modified), NOW) == 0


def test_age_counts_the_upstream_age_and_the_delay_of_the_round_trip() -> None:
    response = facts(age="10")
    # sent at NOW-0.5, received at NOW: 10 s old upstream plus the 0.5 s on the way
    assert initial_age(response, NOW - 0.5, NOW) == pytest.approx(10.5)
    assert initial_age(facts(age="x"), NOW, NOW) == math.inf
    # a Date 30 s before it was received says it is 30 s old already
    dated = ResponseFacts.of(200, [(b"date", b"Thu, 15 Jan 2027 07:59:30 GMT")])
    received = dated.date + 30 if dated.date else 0
    assert initial_age(dated, received, received) == pytest.approx(30)


@pytest.mark.parametrize(
    ("method", "request_fields", "status", "response_fields", "reason"),
    [
        (b"GET", {}, 200, {"cache_control": "max-age=60"}, None),
        (b"POST", {}, 200, {"cache_control": "max-age=60"}, "method"),
        (b"GET", {}, 206, {"cache_control": "max-age=60"}, "status"),
        (b"GET", {}, 200, {"cache_control": "no-store, max-age=60"}, "no-store"),
        (b"GET", {}, 200, {"cache_control": "private, max-age=60"}, "private"),
        (b"GET", {"cache-control": "no-store"}, 200, {"cache_control": "max-age=60"}, "request no-store"),  # noqa: E501
        (b"GET", {"authorization": "x"}, 200, {"cache_control": "max-age=60"}, "authorization"),
        (b"GET", {"authorization": "x"}, 200, {"cache_control": "public, max-age=60"}, None),
        (b"GET", {"authorization": "x"}, 200, {"cache_control": "s-maxage=60"}, None),
        (b"GET", {}, 200, {"cache_control": "max-age=60", "set_cookie": "a=b"}, "set-cookie"),
        (b"GET", {}, 200, {"cache_control": "max-age=60", "vary": "*"}, "vary *"),
        (b"GET", {}, 200, {}, "no freshness"),
        (b"GET", {}, 200, {"etag": '"v"'}, None),  # stored, revalidated each time
        (b"GET", {}, 599, {"cache_control": "max-age=60, must-understand"}, "must-understand"),
        (b"GET", {}, 200, {"cache_control": "no-store, must-understand, max-age=60"}, None),
        (b"GET", {}, 200, {"surrogate_control": "max-age=60", "cache_control": "no-store"}, None),
    ],
)  # fmt: skip
def test_what_may_be_stored(
    method: bytes,
    request_fields: dict[str, str],
    status: int,
    response_fields: dict[str, str],
    reason: str | None,
) -> None:
    request = RequestFacts.of(method, [(k.encode(), v.encode()) for k, v in request_fields.items()])
    assert not_storable(request, facts(status, **response_fields)) == reason


@pytest.mark.parametrize(
    ("stored", "request_fields", "decision"),
    [
        (dict(lifetime=60, age=10), {}, Reuse.FRESH),
        (dict(lifetime=60, age=61), {}, Reuse.VALIDATE),
        (dict(lifetime=60, age=10, cache_control="no-cache"), {}, Reuse.VALIDATE),
        (dict(lifetime=60, age=10), {"cache-control": "no-cache"}, Reuse.VALIDATE),
        (dict(lifetime=60, age=10), {"pragma": "no-cache"}, Reuse.VALIDATE),
        (dict(lifetime=60, age=10), {"cache-control": "max-age=5"}, Reuse.VALIDATE),
        (dict(lifetime=60, age=50), {"cache-control": "min-fresh=20"}, Reuse.VALIDATE),
        (dict(lifetime=60, age=70), {"cache-control": "max-stale=20"}, Reuse.FRESH),
        (dict(lifetime=60, age=70, cache_control="max-age=60, stale-while-revalidate=30"), {},
         Reuse.STALE_WHILE_REVALIDATE),
        (dict(lifetime=60, age=95, cache_control="max-age=60, stale-while-revalidate=30"), {},
         Reuse.VALIDATE),
        (dict(lifetime=60, age=70, cache_control="max-age=60, must-revalidate, stale-while-revalidate=30"),  # noqa: E501
         {}, Reuse.VALIDATE),
    ],
)  # fmt: skip
def test_when_a_stored_response_may_be_reused(
    stored: dict[str, object], request_fields: dict[str, str], decision: Reuse
) -> None:
    request = RequestFacts.of(b"GET", [(k.encode(), v.encode()) for k, v in request_fields.items()])
    assert reuse(entry(**stored), request, NOW) is decision  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stored", "allowed"),
    [
        (dict(lifetime=60, age=70), True),  # within the configured 60 s
        (dict(lifetime=60, age=200), False),
        (dict(lifetime=60, age=200, cache_control="max-age=60, stale-if-error=300"), True),
        (dict(lifetime=60, age=70, cache_control="max-age=60, must-revalidate"), False),
        (dict(lifetime=60, age=70, cache_control="max-age=60, proxy-revalidate"), False),
        (dict(lifetime=60, age=70, cache_control="s-maxage=60"), False),
    ],
)  # fmt: skip
def test_when_a_stale_response_may_stand_in_for_a_failed_origin(
    stored: dict[str, object], allowed: bool
) -> None:
    assert stale_on_error(entry(**stored), NOW, 60.0) is allowed  # type: ignore[arg-type]


def test_accept_encoding_is_reduced_to_the_set_of_codings_accepted() -> None:
    assert accepted_codings([(b"accept-encoding", b"gzip, deflate, br")]) == b"br,deflate,gzip"
    assert accepted_codings([(b"accept-encoding", b"br;q=1.0, gzip ,x-foo")]) == b"br,gzip"
    assert accepted_codings([(b"accept-encoding", b"gzip;q=0, br")]) == b"br"
    assert accepted_codings([]) is None


def test_a_variant_is_chosen_by_the_normalised_values_of_what_vary_names() -> None:
    stored = entry(lifetime=60)
    stored.vary = vary_values([b"accept-language", b"x-a"], [(b"accept-language", b"fr,  de")])
    assert variant_matches(stored, [(b"accept-language", b"fr, de")])
    assert not variant_matches(stored, [(b"accept-language", b"fr")])
    assert not variant_matches(stored, [(b"accept-language", b"fr, de"), (b"x-a", b"1")])
    starred = entry(lifetime=60)
    starred.vary = ((b"*", None),)
    assert not variant_matches(starred, [])


@pytest.mark.parametrize(
    ("method", "status", "fields", "urls"),
    [
        (b"GET", 200, {}, []),
        (b"POST", 500, {}, []),
        (b"POST", 201, {}, ["https://h/a/b"]),
        (b"PUT", 200, {"location": "/x", "content-location": "c"}, ["https://h/a/b", "https://h/x", "https://h/a/c"]),
        (b"DELETE", 204, {"location": "https://other/x"}, ["https://h/a/b"]),  # another origin: never  # noqa: E501
        (b"M-SEARCH", 200, {}, ["https://h/a/b"]),
    ],
)  # fmt: skip
def test_what_an_unsafe_request_invalidates(
    method: bytes, status: int, fields: dict[str, str], urls: list[str]
) -> None:
    response = [(k.encode(), v.encode()) for k, v in fields.items()]
    assert invalidates(method, status, "https://h/a/b", response) == urls


def test_client_conditions_against_a_stored_response() -> None:
    stored = entry(etag='"v1"', last_modified="Fri, 15 Jan 2027 08:00:00 GMT")
    assert not_modified(stored, [(b"if-none-match", b'W/"v1"')])
    assert not_modified(stored, [(b"if-none-match", b'"x", "v1"')])
    assert not_modified(stored, [(b"if-none-match", b"*")])
    assert not not_modified(stored, [(b"if-none-match", b'"v2"')])
    # If-None-Match takes precedence over If-Modified-Since
    assert not not_modified(
        stored,
        [(b"if-none-match", b'"v2"'), (b"if-modified-since", b"Sat, 16 Jan 2027 08:00:00 GMT")],
    )
    assert not_modified(stored, [(b"if-modified-since", b"Fri, 15 Jan 2027 08:00:00 GMT")])
    assert not not_modified(stored, [(b"if-modified-since", b"Thu, 14 Jan 2027 08:00:00 GMT")])


def test_a_304_freshens_everything_but_the_representation_s_own_fields() -> None:
    stored = [
        (b"etag", b'"a"'),
        (b"content-length", b"10"),
        (b"x-a", b"1"),
        (b"cache-control", b"max-age=1"),
    ]
    update = [(b"etag", b'"b"'), (b"content-length", b"0"), (b"x-a", b"2"), (b"set-cookie", b"s=1"),
              (b"cache-control", b"max-age=60")]  # fmt: skip
    merged = dict(freshened_fields(stored, update))
    assert merged == {
        b"etag": b'"a"',
        b"content-length": b"10",
        b"x-a": b"2",
        b"cache-control": b"max-age=60",
    }


@pytest.mark.parametrize(
    ("value", "if_range", "span"),
    [
        (b"bytes=0-1", None, (0, 1)),
        (b"bytes=5-", None, (5, 9)),
        (b"bytes=-3", None, (7, 9)),
        (b"bytes=8-20", None, (8, 9)),
        (b"bytes=10-", None, UNSATISFIABLE),
        (b"bytes=5-2", None, None),
        (b"bytes=0-1,4-5", None, None),  # several ranges: the whole body
        (b"items=0-1", None, None),
        (b"bytes=0-1", b'"v1"', (0, 1)),
        (b"bytes=0-1", b'"v2"', None),
        (b"bytes=0-1", b'W/"v1"', None),
    ],
)
def test_byte_ranges_of_a_stored_body(
    value: bytes, if_range: bytes | None, span: tuple[int, int] | None
) -> None:
    assert byte_range(value, if_range, entry(etag='"v1"')) == span


def test_keys_name_the_url_and_what_configuration_adds() -> None:
    plain = KeyMaker(CacheKeyConfig())
    assert plain.make("https", "Example.COM", "/a?b=1", []).key == "https://example.com/a?b=1"
    configured = KeyMaker(
        CacheKeyConfig(
            ignore_query_params=("utm_*", "fbclid"),
            sort_query=True,
            headers=("X-Lang",),
            cookies=("lang",),
        )
    )
    key = configured.make(
        "https",
        "h",
        "/a?z=1&utm_source=x&a=2&fbclid=3",
        [(b"x-lang", b"fr"), (b"cookie", b"s=1; lang=en")],
    )
    assert key.url == "https://h/a?a=2&z=1"
    assert key.key == "https://h/a?a=2&z=1\nx-lang: fr\ncookie lang=en"
    assert (
        normalise_url(
            "HTTPS://H/a?utm_source=1&b=2", CacheKeyConfig(ignore_query_params=("utm_*",))
        )
        == "https://h/a?b=2"
    )


def test_negotiation_follows_the_client_q_values_then_the_edge_order() -> None:
    order = ("zstd", "br", "gzip")
    assert negotiate([(b"accept-encoding", b"gzip, deflate, br, zstd")], order) == "zstd"
    assert negotiate([(b"accept-encoding", b"gzip;q=1, br;q=0.5")], order) == "gzip"
    assert negotiate([(b"accept-encoding", b"*;q=0.1, zstd;q=0")], order) == "br"
    assert negotiate([(b"accept-encoding", b"identity")], order) is None
    assert negotiate([], order) is None


@pytest.mark.parametrize(
    ("status", "fields", "expected"),
    [
        (200, {"content-type": "text/html; charset=utf-8"}, True),
        (200, {"content-type": "application/vnd.api+json"}, True),
        (200, {"content-type": "image/png"}, False),
        (206, {"content-type": "text/html"}, False),
        (200, {"content-type": "text/html", "content-encoding": "gzip"}, False),
        (200, {"content-type": "text/html", "cache-control": "no-transform"}, False),
        (200, {"content-type": "text/html", "cache-control": "private"}, False),
        (200, {"content-type": "text/html", "set-cookie": "a=b"}, False),
        (200, {"content-type": "text/html", "content-length": "100"}, False),
        (200, {"content-type": "text/html", "content-length": "5000"}, True),
    ],
)
def test_what_may_be_compressed(status: int, fields: dict[str, str], expected: bool) -> None:
    response = [(k.encode(), v.encode()) for k, v in fields.items()]
    assert compressible(status, response, CompressionConfig(enabled=True)) is expected
