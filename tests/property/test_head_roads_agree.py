"""The two roads through :class:`edge.http1.head.HeadParser` agree.

A head that arrives whole in one ``feed`` is read by :func:`plain_head` when
it is plain, by llhttp otherwise; a head that arrives in pieces is always
llhttp's. So feeding the same bytes whole and as ``[first byte, rest]``
compares the plain road with llhttp on every head the plain road takes, and
checks that every head it declines gets llhttp's answer unchanged: the same
method, target, version, status, reason and fields, or the same rejection.

The heads are drawn near the edge of what is plain: known and unknown
methods, targets with the characters RFC 3986 allows and those it does not,
odd versions and statuses, field names and values with whitespace, control
bytes, obs-text and bare LFs, and the fields llhttp interprets (Content-Length,
Transfer-Encoding, Upgrade) repeated, malformed and combined.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.http1 import ResponseHeadReceived, ResponseReader
from edge.http1.errors import MessageRejected
from edge.http1.head import HeadParser, plain_head
from edge.http1.limits import HttpLimits
from edge.http1.response import client_head, reusable_head, with_field

LIMITS = HttpLimits(max_request_line_bytes=120, max_header_bytes=400, max_headers=6)
ROADS = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_PLAIN_URL = b"abcAZ09-._~!$&'()*+,;=:@/%?"
_ODD_URL = b'#[]{}|\\^`"<> \t\x7f\x80\xff'
_PLAIN_VALUE = b"abc019 \t\"',;=/-()"
_ODD_VALUE = b"\x7f\x80\xff\x00\r\n"


def _odd(draw: st.DrawFn) -> bool:
    """One piece in sixteen is drawn from beyond what is plain, so that about
    a third of the heads are plain and most others miss by one piece."""
    return draw(st.integers(0, 15)) == 0


def _spell(draw: st.DrawFn, plain: bytes, odd: bytes, max_size: int) -> bytes:
    alphabet = plain + odd if _odd(draw) else plain
    indices = draw(st.lists(st.integers(0, len(alphabet) - 1), max_size=max_size))
    return bytes(alphabet[i] for i in indices)


def _pick(draw: st.DrawFn, plain: list[bytes], odd: list[bytes]) -> bytes:
    return draw(st.sampled_from(odd if _odd(draw) else plain))


_METHODS = [b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"]
_ODD_METHODS = [b"CONNECT", b"TRACE", b"get", b"FOO", b"G ET", b""]
_ODD_TARGETS = [b"*", b"http://a/x", b"/a#frag", b"", b"a"]
_VERSIONS = [b"HTTP/1.1", b"HTTP/1.0"]
_ODD_VERSIONS = [b"HTTP/2.0", b"HTTP/1.2", b"http/1.1", b"HTTP/1.1 "]
_STATUSES = [b"200 OK", b"404 Not Found", b"301 Moved  Permanently", b"204 No Content", b"304 X"]
_ODD_STATUSES = [b"101 Switching Protocols", b"199 X", b"600 X", b"200 ", b"200", b"20 OK",
                 b"200 O\tK", b"200 \x80", b"500 Internal Server Error "]  # fmt: skip
_NAMES = [b"Host", b"Connection", b"Keep-Alive", b"proxy-connection", b"X-A", b"te", b"Trailer",
          b"Cache-Control", b"t", b"C", b"U", b"X_Y", b"x!#~09"]  # fmt: skip
_ODD_NAMES = [b"Content-Length", b"content-length", b"CONTENT-LENGTH", b"Transfer-Encoding",
              b"transfer-encoding", b"Upgrade", b"upgrade", b"Bad Name", b"", b"X\x80",
              b"Content-Length ", b"X:Y", b"(x)"]  # fmt: skip
_VALUES = [b"0", b"12", b"007", b"chunked", b"websocket", b"close", b"keep-alive", b"upgrade",
           b'W/"d-abc"', b"text/html; charset=utf-8", b"a\tb", b"1234567890123456789",
           b"123456789012345678"]  # fmt: skip
_ODD_VALUES = [b"1 2", b"+5", b"-1", b"Chunked", b"gzip, chunked", b"chunked ", b" chunked",
               b"", b" ", b"\t", b"99999999999999999999999"]  # fmt: skip
_SEPARATORS = [b": ", b":", b":\t", b":  ", b": \t"]
_ODD_SEPARATORS = [b" : ", b" :", b"::"]
_LINE_ENDS = [b"\r\n"]
_ODD_LINE_ENDS = [b"\n", b"\r", b" \r\n", b"\r\n "]


@st.composite
def heads(draw: st.DrawFn, response: bool) -> bytes:
    """A head near the edge of what is plain, and what may follow it."""
    if response:
        line = _pick(draw, _VERSIONS, _ODD_VERSIONS) + b" " + _pick(draw, _STATUSES, _ODD_STATUSES)
    else:
        if _odd(draw):
            target = draw(st.sampled_from(_ODD_TARGETS))
        else:
            target = b"/" + _spell(draw, _PLAIN_URL, _ODD_URL, 20)
        method = _pick(draw, _METHODS, _ODD_METHODS)
        line = method + b" " + target + b" " + _pick(draw, _VERSIONS, _ODD_VERSIONS)
    parts = [line, _pick(draw, _LINE_ENDS, _ODD_LINE_ENDS)]
    for _ in range(draw(st.integers(0, 7))):
        name = _pick(draw, _NAMES, _ODD_NAMES)
        if name.lower() in (b"content-length", b"transfer-encoding"):
            value = draw(st.sampled_from(_VALUES[:4] + _VALUES[-2:]))  # mostly well formed
        elif draw(st.booleans()):
            value = draw(st.sampled_from(_VALUES))
        else:
            value = _spell(draw, _PLAIN_VALUE, _ODD_VALUE, 12).strip(b" \t") or b"v"
        if _odd(draw):
            value = draw(st.sampled_from(_ODD_VALUES))
        parts += (
            name,
            _pick(draw, _SEPARATORS, _ODD_SEPARATORS),
            value,
            _pick(draw, _LINE_ENDS, _ODD_LINE_ENDS),
        )
    parts.append(_pick(draw, _LINE_ENDS, _ODD_LINE_ENDS))
    parts.append(draw(st.sampled_from([b"", b"body", b"GET / HTTP/1.1\r\n\r\n"])))
    return b"".join(parts)


def _read(pieces: list[bytes], response: bool, limits: HttpLimits = LIMITS) -> tuple[object, ...]:
    parser = HeadParser(limits, response=response)
    try:
        ends = [parser.feed(piece, 0) for piece in pieces]
    except MessageRejected as exc:
        return ("rejected", exc.status, exc.reason)
    if ends[-1] < 0:
        return ("incomplete", parser.buffered_bytes)
    end = ends[-1] + sum(len(piece) for piece in pieces[:-1])
    fields = (parser.method, parser.target, parser.http_version, parser.status, parser.reason)
    raw = parser.raw if response else b""
    return ("head", end, *fields, parser.headers, raw, parser.buffered_bytes)


def _agree(data: bytes, response: bool) -> None:
    whole = _read([data], response)
    llhttp = _read([data[:1], data[1:]], response)
    assert whole == llhttp
    # plain_head itself, in either build (the pure one's HeadParser does not
    # take the plain road: edge.http1.head.PLAIN_ROAD):
    end = data.find(b"\r\n\r\n") + 4
    plain = plain_head(data, 0, end, response, LIMITS.max_headers) if end > 3 else None
    if plain is not None:
        assert llhttp[0] == "head"
        _, _, method, target, version, status, reason, headers, _, _ = llhttp
        if response:
            assert plain == (status, reason, version, headers)
        else:
            assert plain == (method, target, version, headers)


@ROADS
@given(heads(response=False))
def test_request_heads_read_the_same_on_both_roads(data: bytes) -> None:
    _agree(data, response=False)


@ROADS
@given(heads(response=True))
def test_response_heads_read_the_same_on_both_roads(data: bytes) -> None:
    _agree(data, response=True)


NODE_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nX-Powered-By: Express\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b'Content-Length: 13\r\nETag: W/"d-lDpwLQbzRZmu4fjajvn3KWAx1pk"\r\n'
    b"Date: Thu, 26 Nov 2026 00:00:00 GMT\r\nConnection: keep-alive\r\n"
    b"Keep-Alive: timeout=5\r\n\r\n"
)
BROWSER_REQUEST = (
    b"GET /static/app.js?v=3 HTTP/1.1\r\nHost: app.example.com\r\n"
    b"User-Agent: Mozilla/5.0 (X11; Linux x86_64)\r\nAccept: */*\r\n"
    b"Accept-Encoding: gzip, deflate, br, zstd\r\nAccept-Language: en-GB,en;q=0.9\r\n"
    b"Cookie: a=1; b=2\r\n\r\n"
)
CHUNKED_RESPONSE = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
POST_REQUEST = b"POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"


def test_the_plain_road_reads_the_heads_browsers_and_node_send() -> None:
    """What the benchmarks and most users send takes the plain road: if it
    did not, the property above would pass while nothing was faster."""
    for data, response in (
        (NODE_RESPONSE, True),
        (CHUNKED_RESPONSE, True),
        (BROWSER_REQUEST, False),
        (POST_REQUEST, False),
    ):
        assert plain_head(data, 0, len(data), response, 100) is not None, data
        whole = _read([data], response, HttpLimits())
        assert whole[:2] == ("head", len(data))
        assert whole == _read([data[:1], data[1:]], response, HttpLimits())
    assert plain_head(NODE_RESPONSE, 0, len(NODE_RESPONSE), True, 100)[:3] == (200, b"OK", b"1.1")


def test_heads_llhttp_interprets_are_left_to_it() -> None:
    for data in (
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        b"GET / HTTP/1.1\r\nX-A: trailing \r\n\r\n",
        b"GET / HTTP/1.1\r\nX-A:\r\n\r\n",
        b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
    ):
        assert plain_head(data, 0, len(data), False, 100) is None, data
    too_many = b"GET / HTTP/1.1\r\n" + b"X: 1\r\n" * 3 + b"\r\n"
    assert plain_head(too_many, 0, len(too_many), False, 2) is None


@ROADS
@given(heads(response=True), st.lists(st.sampled_from([b"X-Request-Id: r1", b"A: b"]), max_size=2))
def test_the_client_head_in_one_pass_is_the_general_ways(data: bytes, fields: list[bytes]) -> None:
    """client_head cuts a plain head by its lines; reusable_head and
    with_field, the general way, must give the same bytes."""
    reader = ResponseReader(HttpLimits())
    reader.expect(b"GET", None)
    events = reader.feed(data)
    heads = [e for e in events if isinstance(e, ResponseHeadReceived) and e.status >= 200]
    for head in heads:
        general = reusable_head(head.head, head.nominated)
        for field in reversed(fields):
            general = with_field(general, field)
        assert client_head(head.head, head.headers, head.nominated, fields) == general
