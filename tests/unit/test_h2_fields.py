"""Each rule of edge/h2_fields.py, one field block that breaks it (RFC 9113 §8.2, §8.3)."""

from __future__ import annotations

import pytest

from edge.h2_fields import MalformedFields, check_request, check_trailers

GET = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"app.test"), (b":path", b"/")]
WS = [(b":method", b"CONNECT"), (b":protocol", b"websocket"), (b":scheme", b"https"),
      (b":authority", b"app.test"), (b":path", b"/ws")]  # fmt: skip


@pytest.mark.parametrize(
    "fields",
    [
        GET,
        [*GET, (b"cookie", b""), (b"te", b"Trailers"), (b"accept", b"*/*"), (b"x-b", b"a b")],
        [(b":path", b"/"), (b":method", b"GET"), (b":scheme", b"http"), (b"host", b"app.test")],
        [*GET, (b"host", b"app.test")],
        WS,
        [(b":method", b"CONNECT"), (b":authority", b"app.test:443")],
    ],
)
def test_well_formed_requests_pass(fields: list[tuple[bytes, bytes]]) -> None:
    assert check_request(fields) is None  # no content-length: no length to hold the body to


@pytest.mark.parametrize(
    ("lengths", "declared"),
    [([b"0"], 0), ([b"17"], 17), ([b"17", b"017"], 17), ([b"9" * 30], int(b"9" * 30))],
)
def test_the_body_length_a_request_declares_is_returned(
    lengths: list[bytes], declared: int
) -> None:
    fields = [*GET, *((b"content-length", length) for length in lengths), (b"x", b"1")]
    assert check_request(fields) == declared


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ([*GET, (b"Accept", b"*/*")], "field name b'Accept'"),
        ([*GET, (b"", b"x")], "field name b''"),
        ([*GET, (b"a:b", b"x")], "field name b'a:b'"),
        ([*GET, (b"a b", b"x")], "field name b'a b'"),
        ([*GET, (b"a\nb", b"x")], "field name b'a\\nb'"),
        ([*GET, (b"x", b"a\r\nb: c")], "NUL, CR or LF in a field value"),
        ([*GET, (b"x", b"a\x00")], "NUL, CR or LF in a field value"),
        ([*GET, (b"x", b" a")], "field value starts or ends with whitespace"),
        ([*GET, (b"x", b"a\t")], "field value starts or ends with whitespace"),
        ([*GET[:3], (b":path", b" /")], "field value starts or ends with whitespace"),
        ([*GET, (b"connection", b"close")], "connection-specific field b'connection'"),
        ([*GET, (b"upgrade", b"h2c")], "connection-specific field b'upgrade'"),
        ([*GET, (b"te", b"gzip")], "te other than trailers"),
        ([GET[0], (b"x", b"1"), *GET[1:]], "pseudo-header b':scheme' after a regular field"),
        ([*GET, (b":status", b"200")], "pseudo-header b':status' is not a request's"),
        ([*GET, (b":method", b"GET")], "pseudo-header b':method' repeated"),
        (GET[1:], "no :method"),
        (GET[:3], "no :scheme or :path"),
        ([*GET[:3], (b":path", b"")], "empty :path"),
        ([*GET, (b":protocol", b"websocket")], ":protocol without CONNECT"),
        ([(b":method", b"CONNECT"), *GET[1:]], "CONNECT with :scheme or :path"),
        (GET[:2] + GET[3:], "neither :authority nor host"),
        ([*GET, (b"host", b"other.test")], ":authority and host differ"),
        ([*GET, (b"host", b"app.test"), (b"host", b"app.test")], "host repeated"),
        ([*GET, (b"content-length", b"-1")], "content-length b'-1'"),
        ([*GET, (b"content-length", b"")], "content-length b''"),
        ([*GET, (b"content-length", b"3, 3")], "content-length b'3, 3'"),
        ([*GET, (b"content-length", "\N{FULLWIDTH DIGIT THREE}".encode())],
         "content-length b'\\xef\\xbc\\x93'"),
        ([*GET, (b"content-length", b"9" * 5000)], "content-length b'99999999999999999999'"),
        ([*GET, (b"content-length", b"2"), (b"content-length", b"3")],
         "content-length values differ"),
    ],
)  # fmt: skip
def test_each_rule_refuses_what_breaks_it(fields: list[tuple[bytes, bytes]], reason: str) -> None:
    with pytest.raises(MalformedFields) as refused:
        check_request(fields)
    assert refused.value.reason == reason


def test_trailers_take_the_regular_fields_rules_and_no_pseudo_header() -> None:
    check_trailers([(b"x-checksum", b"77"), (b"te", b"trailers")])
    check_trailers([])
    for fields, reason in [
        ([(b":path", b"/")], "pseudo-header b':path' in trailers"),
        ([(b"X-Sum", b"1")], "field name b'X-Sum'"),
        ([(b"x-sum", b"1\r\nx: 2")], "NUL, CR or LF in a field value"),
        ([(b"keep-alive", b"5")], "connection-specific field b'keep-alive'"),
    ]:
        with pytest.raises(MalformedFields) as refused:
            check_trailers(fields)
        assert refused.value.reason == reason
