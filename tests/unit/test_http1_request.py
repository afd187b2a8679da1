"""RequestReader: framing, smuggling defences, limits, header rewriting, upgrades.

One test per rule of edge/http1 (see the module docstrings of
``edge.http1.request_head`` and ``edge.http1.request``).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import itertools
import pkgutil
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httptools
import pytest

import edge.http1
from edge.http1 import (
    ClientClosed,
    ClientContext,
    Http1UsageError,
    HttpLimits,
    RequestBodyReceived,
    RequestCompleted,
    RequestEvent,
    RequestHeadReceived,
    RequestReader,
    RequestRejected,
    TunnelBytes,
    WebSocketUpgrade,
)
from edge.http1.syntax import parse_decimal, parse_hex

CLIENT_IP = "203.0.113.9"
WS_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="


def make_reader(
    *,
    trusted: bool = False,
    limits: HttpLimits | None = None,
    ip: str = CLIENT_IP,
    scheme: str = "https",
    server_port: int = 443,
) -> RequestReader:
    counter = itertools.count(1)
    context = ClientContext(ip, 40000, trusted, scheme, server_port)
    return RequestReader(limits or HttpLimits(), context, lambda: f"gen-{next(counter)}")


def feed_all(data: bytes, **kwargs: Any) -> list[RequestEvent]:
    return make_reader(**kwargs).feed(data)


def only_head(events: Sequence[object]) -> RequestHeadReceived:
    heads = [e for e in events if isinstance(e, RequestHeadReceived)]
    assert len(heads) == 1, events
    return heads[0]


def rejection(events: Sequence[object]) -> RequestRejected:
    assert events, "no events"
    last = events[-1]
    assert isinstance(last, RequestRejected), events
    assert not any(isinstance(e, RequestRejected) for e in events[:-1])
    return last


def values(head: RequestHeadReceived, name: bytes) -> list[bytes]:
    return [value for key, value in head.headers if key == name]


def head_lines(head: RequestHeadReceived) -> list[bytes]:
    assert head.head.endswith(b"\r\n\r\n")
    return head.head[:-4].split(b"\r\n")


def get(target: bytes = b"/", *extra: bytes, version: bytes = b"1.1") -> bytes:
    lines = [b"GET " + target + b" HTTP/" + version, b"Host: example.com", *extra]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def post(body_headers: list[bytes], body: bytes = b"") -> bytes:
    lines = [b"POST /upload HTTP/1.1", b"Host: example.com", *body_headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def ws_handshake(*extra: bytes, key: bytes = WS_KEY, method: bytes = b"GET") -> bytes:
    lines = [
        method + b" /chat HTTP/1.1",
        b"Host: example.com",
        b"Upgrade: websocket",
        b"Connection: Upgrade",
        b"Sec-WebSocket-Key: " + key,
        b"Sec-WebSocket-Version: 13",
        *extra,
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n"


# Purity ---------------------------------------------------------------------------------

ALLOWED_IMPORTS = {
    "__future__",
    "base64",
    "collections",
    "dataclasses",
    "edge",
    "hashlib",
    "http",
    "httptools",
    "re",
    "typing",
}
IO_MODULES = {"asyncio", "socket", "ssl", "selectors", "uvloop", "time", "threading"}


def test_http1_package_imports_no_io_modules() -> None:
    package_dir = Path(edge.http1.__file__).parent
    files = sorted(package_dir.glob("*.py"))
    assert len(files) >= 10
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert roots <= ALLOWED_IMPORTS, f"{path.name} imports {roots - ALLOWED_IMPORTS}"


def test_http1_package_never_calls_int_on_wire_bytes() -> None:
    """``int()`` accepts ``+5``, `` 5``, ``1_0``: numbers go through edge.http1.syntax."""
    for path in sorted(Path(edge.http1.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "int", f"{path.name}:{node.lineno} calls int()"


def test_imported_http1_modules_hold_no_io_module() -> None:
    names = [f"edge.http1.{m.name}" for m in pkgutil.iter_modules(edge.http1.__path__)]
    assert "edge.http1.request" in names
    for name in names:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, types.ModuleType):
                assert value.__name__.split(".")[0] not in IO_MODULES, (name, value)
    assert all(sys.modules[name] for name in names)


# Happy path -----------------------------------------------------------------------------


def test_simple_get_is_rewritten_and_completed() -> None:
    events = feed_all(b"GET /a?b=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n")
    assert len(events) == 2
    head, done = events
    assert isinstance(head, RequestHeadReceived) and isinstance(done, RequestCompleted)
    assert head.head == (
        b"GET /a?b=1 HTTP/1.1\r\n"
        b"Host: example.com\r\n"
        b"Accept: */*\r\n"
        b"X-Forwarded-For: 203.0.113.9\r\n"
        b"Forwarded: for=203.0.113.9;proto=https;host=example.com\r\n"
        b"X-Real-IP: 203.0.113.9\r\n"
        b"X-Forwarded-Proto: https\r\n"
        b"X-Forwarded-Host: example.com\r\n"
        b"X-Forwarded-Port: 443\r\n"
        b"X-Request-Id: gen-1\r\n"
        b"traceparent: 00-" + head.trace_id.encode() + b"-" + SPAN + b"-01\r\n"
        b"\r\n"
    )
    assert head.trace_id == TRACE_IDS[:32]  # one hash of the request id makes both ids
    assert (head.method, head.target, head.http_version) == (b"GET", b"/a?b=1", b"1.1")
    assert head.host == "example.com"
    assert head.request_id == "gen-1"
    assert head.keep_alive and head.idempotent and head.replayable
    assert not head.expects_body and head.websocket_upgrade is None
    assert head.headers[0] == (b"host", b"example.com")
    assert (b"accept", b"*/*") in head.headers


TRACE_IDS = hashlib.blake2b(b"gen-1", digest_size=24, person=b"geoedge-trace").hexdigest()
SPAN = TRACE_IDS[32:].encode()


def test_the_edge_starts_a_trace_unless_a_trusted_hop_sent_one() -> None:
    parent = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    started = only_head(feed_all(get(b"/", b"traceparent: " + parent, b"tracestate: a=1")))
    assert len(started.trace_id) == 32 and started.trace_id.encode() not in parent
    assert parent not in started.head and b"tracestate" not in started.head
    kept = only_head(
        feed_all(get(b"/", b"traceparent: " + parent, b"tracestate: a=1"), trusted=True)
    )
    assert kept.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert values(kept, b"traceparent") == [parent] and values(kept, b"tracestate") == [b"a=1"]
    junk = only_head(feed_all(get(b"/", b"traceparent: 00-zz"), trusted=True))
    assert b"00-zz" not in junk.head and len(values(junk, b"traceparent")) == 1


def test_forwarded_head_is_parseable_by_llhttp_with_same_fields() -> None:
    head = only_head(feed_all(get(b"/x", b"User-Agent: t", b"Cookie: a=b")))
    seen: list[tuple[bytes, bytes]] = []

    class Collector:
        def on_header(self, name: bytes, value: bytes) -> None:
            seen.append((name.lower(), value))

    httptools.HttpRequestParser(Collector()).feed_data(head.head)
    assert tuple(seen) == head.headers


def test_header_value_ows_is_trimmed_and_internal_whitespace_kept() -> None:
    head = only_head(feed_all(get(b"/", b"X-Thing: \t a  b \t")))
    assert values(head, b"x-thing") == [b"a  b"]
    assert b"X-Thing: a  b\r\n" in head.head


def test_obs_text_in_header_value_is_forwarded() -> None:
    head = only_head(feed_all(get(b"/", b"X-Name: caf\xc3\xa9")))
    assert values(head, b"x-name") == [b"caf\xc3\xa9"]


def test_empty_lines_before_request_line_are_ignored() -> None:
    events = feed_all(b"\r\n\r\n" + get(b"/after-blank"))
    assert only_head(events).target == b"/after-blank"


def test_content_length_on_get_is_fine() -> None:
    events = feed_all(get(b"/", b"Content-Length: 3") + b"abc")
    head = only_head(events)
    assert head.expects_body and head.content_length == 3 and not head.replayable
    assert events[1:] == [RequestBodyReceived(b"abc"), RequestCompleted()]


def test_content_length_zero_has_no_body() -> None:
    events = feed_all(post([b"Content-Length: 0"]))
    head = only_head(events)
    assert not head.expects_body and head.content_length == 0
    assert b"Content-Length: 0\r\n" in head.head
    assert events[-1] == RequestCompleted()


def test_content_length_with_ows_is_accepted() -> None:
    """OWS around a field value is syntax (RFC 9110 §5.5), not part of the number."""
    head = only_head(feed_all(post([b"Content-Length:  5 \t"], b"hello")))
    assert head.content_length == 5
    assert b"Content-Length: 5\r\n" in head.head


def test_content_length_body_streams_across_feeds() -> None:
    reader = make_reader()
    events = reader.feed(post([b"Content-Length: 10"], b"0123"))
    assert events[1:] == [RequestBodyReceived(b"0123")]
    assert reader.feed(b"456") == [RequestBodyReceived(b"456")]
    assert not reader.in_head and not reader.idle
    assert reader.feed(b"789") == [RequestBodyReceived(b"789"), RequestCompleted()]
    assert reader.idle


def test_leading_zeros_in_content_length_are_normalised() -> None:
    head = only_head(feed_all(post([b"Content-Length: 0003"], b"abc")))
    assert head.content_length == 3
    assert b"Content-Length: 3\r\n" in head.head


@pytest.mark.parametrize(
    ("method", "idempotent"),
    [
        (b"GET", True),
        (b"HEAD", True),
        (b"PUT", True),
        (b"DELETE", True),
        (b"OPTIONS", True),
        (b"TRACE", True),
        (b"POST", False),
        (b"PATCH", False),
    ],
)
def test_idempotent_methods(method: bytes, idempotent: bool) -> None:
    head = only_head(feed_all(method + b" / HTTP/1.1\r\nHost: a\r\n\r\n"))
    assert head.idempotent is idempotent
    assert head.replayable is idempotent


def test_idempotent_request_with_body_is_not_replayable() -> None:
    head = only_head(feed_all(b"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nab"))
    assert head.idempotent and not head.replayable


# Pipelining -----------------------------------------------------------------------------


def test_pipelined_requests_in_one_feed_come_out_in_order() -> None:
    data = (
        get(b"/one")
        + post([b"Content-Length: 3"], b"abc")
        + post([b"Transfer-Encoding: chunked"], b"2\r\nxy\r\n0\r\n\r\n")
        + get(b"/four")
    )
    events = make_reader().feed(data)
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "RequestHeadReceived",
        "RequestCompleted",
        "RequestHeadReceived",
        "RequestBodyReceived",
        "RequestCompleted",
        "RequestHeadReceived",
        "RequestBodyReceived",
        "RequestCompleted",
        "RequestHeadReceived",
        "RequestCompleted",
    ]
    heads = [e for e in events if isinstance(e, RequestHeadReceived)]
    assert [h.request_id for h in heads] == ["gen-1", "gen-2", "gen-3", "gen-4"]
    assert [h.target for h in heads] == [b"/one", b"/upload", b"/upload", b"/four"]
    assert events[3] == RequestBodyReceived(b"abc")
    assert events[6] == RequestBodyReceived(b"2\r\nxy\r\n0\r\n\r\n")


def test_next_request_arriving_during_a_streaming_body() -> None:
    reader = make_reader()
    reader.feed(post([b"Content-Length: 6"], b"ab"))
    events = reader.feed(b"cdef" + get(b"/next")[:10])
    assert events == [RequestBodyReceived(b"cdef"), RequestCompleted()]
    assert reader.in_head
    events = reader.feed(get(b"/next")[10:])
    assert only_head(events).target == b"/next"


# Smuggling and ambiguous framing --------------------------------------------------------

SMUGGLING_CASES = {
    "cl-and-te": [b"Content-Length: 5", b"Transfer-Encoding: chunked"],
    "te-and-cl": [b"Transfer-Encoding: chunked", b"Content-Length: 5"],
    "cl-cl-equal": [b"Content-Length: 5", b"Content-Length: 5"],
    "cl-cl-different": [b"Content-Length: 5", b"Content-Length: 6"],
    "cl-list": [b"Content-Length: 5, 5"],
    "cl-plus": [b"Content-Length: +5"],
    "cl-minus": [b"Content-Length: -5"],
    "cl-underscore": [b"Content-Length: 1_0"],
    "cl-inner-space": [b"Content-Length: 1 0"],
    "cl-hex": [b"Content-Length: 0x10"],
    "cl-unicode-digit": ["Content-Length: \u0665".encode()],
    "cl-fullwidth-digit": ["Content-Length: \uff15".encode()],
    "cl-empty": [b"Content-Length:"],
    "cl-19-digits": [b"Content-Length: 1000000000000000000"],
    "cl-overflow": [b"Content-Length: 99999999999999999999999999"],
    "te-xchunked": [b"Transfer-Encoding: xchunked"],
    "te-chunked-gzip": [b"Transfer-Encoding: chunked, gzip"],
    "te-twice": [b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"],
    "te-chunked-chunked": [b"Transfer-Encoding: chunked, chunked"],
    "te-empty": [b"Transfer-Encoding:"],
    "te-identity": [b"Transfer-Encoding: identity"],
    "te-vertical-tab": [b"Transfer-Encoding:\x0bchunked"],
    "te-obs-fold": [b"Transfer-Encoding: chunked", b" , identity"],
    "te-obs-fold-value": [b"Transfer-Encoding:", b"\tchunked"],
    "obs-fold-any": [b"X-Long: a", b" b"],
    "space-before-colon": [b"Transfer-Encoding : chunked"],
    "nul-in-value": [b"X-A: a\x00b"],
    "cr-in-value": [b"X-A: a\rb"],
    "del-in-value": [b"X-A: a\x7fb"],
    "ctl-in-value": [b"X-A: a\x01b"],
    "invalid-name-char": [b"X(A): b"],
    "non-ascii-name": [b"X-\xff: b"],
    "empty-name": [b": b"],
    "no-colon": [b"JustAName"],
    "leading-space-line": [b" X-A: b"],
}


@pytest.mark.parametrize("extra", SMUGGLING_CASES.values(), ids=SMUGGLING_CASES.keys())
def test_ambiguous_or_invalid_head_is_rejected_400(extra: list[bytes]) -> None:
    reader = make_reader()
    events = reader.feed(post(extra, b"0\r\n\r\n"))
    assert rejection(events).status == 400
    assert not any(isinstance(e, RequestHeadReceived) for e in events)
    assert reader.feed(get()) == []  # dead
    assert reader.feed_eof() == []


def test_te_with_unsupported_coding_before_chunked_is_501() -> None:
    events = feed_all(post([b"Transfer-Encoding: gzip, chunked"], b"0\r\n\r\n"))
    assert rejection(events).status == 501


def test_te_chunked_in_http10_request_is_rejected() -> None:
    data = b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    assert rejection(feed_all(data)).status == 400


def test_te_chunked_is_case_insensitive_and_normalised() -> None:
    head = only_head(feed_all(post([b"Transfer-Encoding:  Chunked "], b"0\r\n\r\n")))
    assert head.chunked
    assert b"Transfer-Encoding: chunked\r\n" in head.head


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\nHost: a\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n\n",
        b"GET / HTTP/1.1\nHost: a\n\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: b\nY: c\r\n\r\n",
    ],
    ids=["after-request-line", "after-value", "final-empty-line", "lf-only", "mid-value"],
)
def test_bare_lf_is_rejected(data: bytes) -> None:
    assert rejection(feed_all(data)).status == 400


def test_bare_lf_is_rejected_without_waiting_for_more_bytes() -> None:
    reader = make_reader()
    events = reader.feed(b"GET / HTTP/1.1\r\nHost: a\nX")
    assert rejection(events).status == 400


# Chunked bodies -------------------------------------------------------------------------


def chunked_events(body: bytes, **kwargs: object) -> list[RequestEvent]:
    return feed_all(post([b"Transfer-Encoding: chunked"], body), **kwargs)


def forwarded_body(events: Sequence[object]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, RequestBodyReceived))


def dechunked(forwarded: bytes) -> bytes:
    """The payload of a chunked body the reader re-encoded (ends in its last chunk)."""
    assert forwarded.endswith(b"0\r\n\r\n")
    payload = b""
    rest = forwarded
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)  # test oracle only: the bytes were produced by us
        if size == 0:
            return payload
        payload += rest[:size]
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


def test_chunked_body_is_reencoded_without_extensions_and_keeps_its_trailers() -> None:
    events = chunked_events(
        b'5;name=value;x="q\\"s"\r\nhello\r\n00A\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n'
    )
    assert forwarded_body(events) == b"5\r\nhello\r\na\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n"
    assert events[-1] == RequestCompleted()


def test_trailers_cannot_carry_what_the_head_rules_police() -> None:
    trailers = [
        b"X-Forwarded-For: 6.6.6.6", b"X_Forwarded_For: 6.6.6.6", b"Forwarded: for=6.6.6.6",
        b"X-Real-IP: 6.6.6.6", b"X-Request-Id: mine", b"traceparent: 00-1-2-01",
        b"Host: evil.test", b"Content-Length: 99", b"Transfer-Encoding: chunked",
        b"Connection: close", b"Authorization: Basic eA==", b"Cookie: sid=1",
        b"Cache-Control: no-cache", b"If-None-Match: x", b"Range: bytes=0-1",
        b"Content-Type: text/evil", b"X-Checksum: 77", b"Server-Timing: db;dur=5",
        b"Content-Digest: sha-256=:YQ==:",
    ]  # fmt: skip
    body = b"3\r\nabc\r\n0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n"
    forwarded = forwarded_body(chunked_events(body))
    kept = b"X-Checksum: 77\r\nServer-Timing: db;dur=5\r\nContent-Digest: sha-256=:YQ==:\r\n"
    assert forwarded == b"3\r\nabc\r\n0\r\n" + kept + b"\r\n"


def test_chunked_body_split_everywhere_decodes_to_same_payload() -> None:
    body = b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n"
    reader = make_reader()
    events = reader.feed(post([b"Transfer-Encoding: chunked"]))
    for index in range(len(body)):
        events += reader.feed(body[index : index + 1])
    assert events[-1] == RequestCompleted()
    assert dechunked(forwarded_body(events)) == b"abc0123456789abcdef"


def test_sixteen_digit_chunk_size_with_leading_zeros_is_accepted() -> None:
    events = chunked_events(b"0000000000000003\r\nabc\r\n0\r\n\r\n")
    assert forwarded_body(events) == b"3\r\nabc\r\n0\r\n\r\n"


CHUNK_CASES = {
    "hex-prefix": b"0x10\r\n0123456789abcdef\r\n0\r\n\r\n",
    "plus-sign": b"+3\r\nabc\r\n0\r\n\r\n",
    "seventeen-digits": b"00000000000000003\r\nabc\r\n0\r\n\r\n",
    "empty-size": b"\r\nabc\r\n0\r\n\r\n",
    "space-before-ext": b"3 ;a=b\r\nabc\r\n0\r\n\r\n",
    "trailing-space": b"3 \r\nabc\r\n0\r\n\r\n",
    "leading-space": b" 3\r\nabc\r\n0\r\n\r\n",
    "non-hex": b"3g\r\nabc\r\n0\r\n\r\n",
    "underscore": b"1_0\r\n0123456789abcdef\r\n0\r\n\r\n",
    "bare-lf-size": b"3\nabc\r\n0\r\n\r\n",
    "missing-crlf-after-data": b"3\r\nabcX\r\n0\r\n\r\n",
    "lf-only-after-data": b"3\r\nabc\n0\r\n\r\n",
    "bad-ext-name": b"3;(x)\r\nabc\r\n0\r\n\r\n",
    "bad-ext-quote": b'3;a="unterminated\r\nabc\r\n0\r\n\r\n',
    "nul-in-ext": b"3;a\x00\r\nabc\r\n0\r\n\r\n",
    "trailer-obs-fold": b"0\r\nX-T: 1\r\n folded\r\n\r\n",
    "trailer-bare-lf": b"0\r\nX-T: 1\n\r\n",
    "trailer-no-colon": b"0\r\nbroken\r\n\r\n",
    "trailer-nul": b"0\r\nX-T: a\x00\r\n\r\n",
}


@pytest.mark.parametrize("body", CHUNK_CASES.values(), ids=CHUNK_CASES.keys())
def test_invalid_chunked_framing_is_rejected_400(body: bytes) -> None:
    events = chunked_events(body)
    assert rejection(events).status == 400
    assert RequestCompleted() not in events


@pytest.mark.parametrize("body", CHUNK_CASES.values(), ids=CHUNK_CASES.keys())
def test_invalid_chunked_framing_is_rejected_byte_at_a_time(body: bytes) -> None:
    reader = make_reader()
    events = reader.feed(post([b"Transfer-Encoding: chunked"]))
    for index in range(len(body)):
        events += reader.feed(body[index : index + 1])
    assert rejection(events).status == 400


def test_chunk_extension_length_limit() -> None:
    limits = HttpLimits(max_chunk_extension_bytes=10)
    ok = b"3;" + b"a" * 9 + b"\r\nabc\r\n0\r\n\r\n"  # extension ";aaaaaaaaa" is 10 bytes
    assert chunked_events(ok, limits=limits)[-1] == RequestCompleted()
    too_long = b"3;" + b"a" * 10 + b"\r\nabc\r\n0\r\n\r\n"
    assert rejection(chunked_events(too_long, limits=limits)).reason == "chunk extension too long"


def test_endless_chunk_extension_is_rejected_before_its_end() -> None:
    reader = make_reader()
    reader.feed(post([b"Transfer-Encoding: chunked"]))
    events = reader.feed(b"3;a=" + b"b" * 1000)
    assert rejection(events).reason == "chunk extension too long"


def test_endless_chunk_size_is_rejected_before_its_end() -> None:
    reader = make_reader()
    reader.feed(post([b"Transfer-Encoding: chunked"]))
    events = reader.feed(b"0" * 17)
    assert rejection(events).reason == "chunk size has too many digits"


@pytest.mark.parametrize(
    "partial", [b"zz", b"3;a\n", b"3z\r"], ids=["not-hex", "bare-lf-in-ext", "not-hex-before-cr"]
)
def test_a_size_line_that_cannot_become_valid_is_refused_before_its_end(partial: bytes) -> None:
    """A client that sends a broken chunk-size line and waits gets its 400 at
    once, not when a timeout ends the wait."""
    reader = make_reader()
    reader.feed(post([b"Transfer-Encoding: chunked"]))
    refused = rejection(reader.feed(partial))
    assert (refused.status, refused.reason) == (400, "invalid chunk size line")


def test_a_valid_size_line_with_extensions_is_accepted_however_split() -> None:
    body = b"5;a=1;b=2\r\nhello\r\n0\r\n\r\n"
    for split in range(1, len(body)):
        reader = make_reader()
        events = reader.feed(post([b"Transfer-Encoding: chunked"], body[:split]))
        events += reader.feed(body[split:])
        assert dechunked(forwarded_body(events)) == b"hello", split
        assert events[-1] == RequestCompleted(), split


def test_chunk_size_digits_limit_is_configurable() -> None:
    limits = HttpLimits(max_chunk_size_digits=4)
    assert chunked_events(b"0003\r\nabc\r\n0\r\n\r\n", limits=limits)[-1] == RequestCompleted()
    assert rejection(chunked_events(b"00003\r\nabc\r\n0\r\n\r\n", limits=limits)).status == 400


def test_huge_chunk_size_streams_without_buffering() -> None:
    reader = make_reader(limits=HttpLimits(max_body_bytes=2**64))
    reader.feed(post([b"Transfer-Encoding: chunked"]))
    events = reader.feed(b"ffffffffffffffff\r\n" + b"x" * 100_000)
    assert forwarded_body(events) == b"186a0\r\n" + b"x" * 100_000 + b"\r\n"
    assert reader.buffered_bytes == 0


def test_trailer_section_limit() -> None:
    limits = HttpLimits(max_header_bytes=100)
    body = b"0\r\nX-T: " + b"a" * 120 + b"\r\n\r\n"
    assert rejection(chunked_events(body, limits=limits)).reason == "trailer section too large"


# Limits ---------------------------------------------------------------------------------


def request_line_of(length: int) -> bytes:
    target = b"/" + b"a" * (length - len(b"GET / HTTP/1.1"))
    line = b"GET " + target + b" HTTP/1.1"
    assert len(line) == length
    return line


def test_request_line_at_limit_is_accepted() -> None:
    limits = HttpLimits(max_request_line_bytes=100)
    data = request_line_of(100) + b"\r\nHost: a\r\n\r\n"
    assert only_head(feed_all(data, limits=limits)).target.startswith(b"/aaa")


def test_request_line_over_limit_is_414() -> None:
    limits = HttpLimits(max_request_line_bytes=100)
    data = request_line_of(101) + b"\r\nHost: a\r\n\r\n"
    assert rejection(feed_all(data, limits=limits)).status == 414


def test_request_line_over_limit_is_414_before_its_end() -> None:
    reader = make_reader(limits=HttpLimits(max_request_line_bytes=100))
    assert reader.feed(b"GET /" + b"a" * 50) == []
    assert reader.in_head
    assert rejection(reader.feed(b"a" * 60)).status == 414


def test_head_at_limit_is_accepted_and_over_is_431() -> None:
    base = get(b"/", b"X-Pad: ")
    limits = HttpLimits(max_header_bytes=len(base) + 10)
    exact = get(b"/", b"X-Pad: " + b"p" * 10)
    assert len(exact) == limits.max_header_bytes
    assert only_head(feed_all(exact, limits=limits)).target == b"/"
    over = get(b"/", b"X-Pad: " + b"p" * 11)
    assert rejection(feed_all(over, limits=limits)).status == 431


def test_head_over_limit_is_431_before_its_end() -> None:
    reader = make_reader(limits=HttpLimits(max_header_bytes=200))
    reader.feed(b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: ")
    assert rejection(reader.feed(b"b" * 300)).status == 431


def test_single_huge_header_value_split_in_pieces_is_431() -> None:
    reader = make_reader()
    events = reader.feed(b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: ")
    for _ in range(20):
        events += reader.feed(b"b" * 1000)
        assert reader.buffered_bytes <= HttpLimits().max_header_bytes
    assert rejection(events).status == 431


def test_header_count_limit() -> None:
    limits = HttpLimits(max_headers=5)
    fields = [b"X-%d: v" % i for i in range(4)]
    assert only_head(feed_all(get(b"/", *fields), limits=limits))  # Host + 4 = 5
    fields.append(b"X-4: v")
    assert rejection(feed_all(get(b"/", *fields), limits=limits)).status == 431


def test_empty_lines_before_request_count_towards_head_limit() -> None:
    reader = make_reader(limits=HttpLimits(max_header_bytes=100))
    assert rejection(reader.feed(b"\r\n" * 51)).status == 431


# Request line ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "status"),
    [
        (b"GET / HTTP/2.0", 505),
        (b"GET / HTTP/1.2", 505),
        (b"GET / HTTP/0.9", 505),
        (b"GET / HTTP/9.9", 505),
        (b"GET /", 400),
        (b"GET / HTTP/1.1 ", 400),
        (b"GET / http/1.1", 400),
        (b"get / HTTP/1.1", 501),
        (b"BREW / HTTP/1.1", 501),
        (b"G@T / HTTP/1.1", 400),
        (b"GET /a\x7fb HTTP/1.1", 400),
        (b"GET /a\x80b HTTP/1.1", 400),
        (b"GET /a\tb HTTP/1.1", 400),
        (b"GET a HTTP/1.1", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
        (b"CONNECT example.com:443 HTTP/1.1", 501),
    ],
)
def test_bad_request_lines(line: bytes, status: int) -> None:
    events = feed_all(line + b"\r\nHost: example.com\r\n\r\n")
    assert rejection(events).status == status


def test_tls_handshake_on_plain_port_is_rejected_at_once() -> None:
    reader = make_reader()
    assert rejection(reader.feed(b"\x16\x03\x01\x02\x00")).status == 400


def test_multiple_spaces_in_request_line_are_normalised() -> None:
    head = only_head(feed_all(b"GET  /x HTTP/1.1\r\nHost: a\r\n\r\n"))
    assert head.head.startswith(b"GET /x HTTP/1.1\r\n")


# Targets and Host -----------------------------------------------------------------------


def test_absolute_form_to_own_host_is_rewritten_to_origin_form() -> None:
    head = only_head(feed_all(get(b"http://Example.COM/p?q=1")))
    assert head.target == b"/p?q=1"
    assert head.head.startswith(b"GET /p?q=1 HTTP/1.1\r\n")


def test_absolute_form_without_path_becomes_slash() -> None:
    assert only_head(feed_all(get(b"https://example.com"))).target == b"/"
    assert only_head(feed_all(get(b"https://example.com?x"))).target == b"/?x"


@pytest.mark.parametrize(
    "target",
    [b"http://other.example/p", b"ftp://example.com/p", b"http://u@example.com/", b"http:///p"],
)
def test_absolute_form_to_other_hosts_is_rejected(target: bytes) -> None:
    assert rejection(feed_all(get(target))).status == 400


def test_asterisk_form_only_with_options() -> None:
    head = only_head(feed_all(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"))
    assert head.target == b"*"
    assert rejection(feed_all(b"GET * HTTP/1.1\r\nHost: a\r\n\r\n")).status == 400


def test_missing_host_in_http11_is_rejected() -> None:
    assert rejection(feed_all(b"GET / HTTP/1.1\r\n\r\n")).status == 400


def test_two_hosts_are_rejected() -> None:
    assert rejection(feed_all(get(b"/", b"Host: example.com"))).status == 400


@pytest.mark.parametrize("host", [b"", b"a b", b"a/b", b"a@b", b"[::1", b"a:99999x", b"a\\b"])
def test_invalid_host_is_rejected(host: bytes) -> None:
    data = b"GET / HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"
    assert rejection(feed_all(data)).status == 400


def test_http10_without_host_is_accepted() -> None:
    head = only_head(feed_all(b"GET / HTTP/1.0\r\n\r\n"))
    assert head.host is None
    assert values(head, b"x-forwarded-host") == []
    assert values(head, b"forwarded") == [b"for=203.0.113.9;proto=https"]


# Forwarding fields ----------------------------------------------------------------------

CLIENT_FORWARDING = [
    b"X-Forwarded-For: 6.6.6.6",
    b"x-forwarded-for: 7.7.7.7",
    b"X-Real-IP: 6.6.6.6",
    b"Forwarded: for=6.6.6.6",
    b"X-Forwarded-Proto: http",
    b"X-Forwarded-Host: evil.example",
    b"X-Forwarded-Port: 80",
    b"X-Request-Id: client-chosen",
]


def test_untrusted_client_forwarding_fields_are_replaced() -> None:
    head = only_head(feed_all(get(b"/", *CLIENT_FORWARDING)))
    assert values(head, b"x-forwarded-for") == [CLIENT_IP.encode()]
    assert values(head, b"x-real-ip") == [CLIENT_IP.encode()]
    assert values(head, b"forwarded") == [b"for=203.0.113.9;proto=https;host=example.com"]
    assert values(head, b"x-forwarded-proto") == [b"https"]
    assert values(head, b"x-forwarded-host") == [b"example.com"]
    assert values(head, b"x-forwarded-port") == [b"443"]
    assert values(head, b"x-request-id") == [b"gen-1"]
    assert head.request_id == "gen-1"
    assert b"6.6.6.6" not in head.head and b"evil" not in head.head
    assert b"client-chosen" not in head.head


def test_trusted_proxy_forwarding_fields_are_appended_or_kept() -> None:
    head = only_head(feed_all(get(b"/", *CLIENT_FORWARDING), trusted=True))
    assert values(head, b"x-forwarded-for") == [b"6.6.6.6, 7.7.7.7, 203.0.113.9"]
    assert values(head, b"forwarded") == [
        b"for=6.6.6.6, for=203.0.113.9;proto=https;host=example.com"
    ]
    assert values(head, b"x-real-ip") == [b"6.6.6.6"]
    assert values(head, b"x-forwarded-proto") == [b"http"]
    assert values(head, b"x-forwarded-host") == [b"evil.example"]
    assert values(head, b"x-forwarded-port") == [b"80"]
    assert values(head, b"x-request-id") == [b"client-chosen"]
    assert head.request_id == "client-chosen"


@pytest.mark.parametrize("trusted", [False, True])
@pytest.mark.parametrize(
    "field",
    [
        b"X_Forwarded_For: 6.6.6.6",
        b"x_real_ip: 6.6.6.6",
        b"X_Forwarded_Proto: http",
        b"X_Forwarded_Host: evil.example",
        b"X_Request_Id: spoofed",
        b"Content_Length: 5",
        b"Transfer_Encoding: chunked",
        b"X-Forwarded_For: 6.6.6.6",
    ],
)
def test_underscore_spellings_of_managed_fields_are_dropped(field: bytes, trusted: bool) -> None:
    """Some frameworks read ``_`` as ``-``: such a field would pass for the real
    one behind the edge's checks, whoever sent it."""
    head = only_head(feed_all(get(b"/", field), trusted=trusted))
    name = field.partition(b":")[0]
    assert name not in head.head and name.lower() not in head.head.lower()
    assert not [key for key, _ in head.headers if b"_" in key]


def test_underscores_in_other_fields_are_kept() -> None:
    head = only_head(feed_all(get(b"/", b"My_Custom_Field: 1")))
    assert values(head, b"my_custom_field") == [b"1"]


def test_trusted_proxy_without_forwarding_fields_gets_them_set() -> None:
    head = only_head(feed_all(get(b"/"), trusted=True))
    assert values(head, b"x-forwarded-for") == [CLIENT_IP.encode()]
    assert values(head, b"x-real-ip") == [CLIENT_IP.encode()]
    assert values(head, b"x-request-id") == [b"gen-1"]


def test_trusted_proxy_with_unusable_request_id_gets_a_fresh_one() -> None:
    head = only_head(feed_all(get(b"/", b"X-Request-Id: has space"), trusted=True))
    assert head.request_id == "gen-1"
    assert values(head, b"x-request-id") == [b"gen-1"]


def test_ipv6_client_is_quoted_in_forwarded() -> None:
    head = only_head(feed_all(get(b"/"), ip="2001:db8::1"))
    assert values(head, b"forwarded") == [b'for="[2001:db8::1]";proto=https;host=example.com']
    assert values(head, b"x-forwarded-for") == [b"2001:db8::1"]


def test_host_with_port_is_quoted_in_forwarded() -> None:
    data = b"GET / HTTP/1.1\r\nHost: example.com:8443\r\n\r\n"
    head = only_head(feed_all(data, scheme="http", server_port=8443))
    assert values(head, b"forwarded") == [b'for=203.0.113.9;proto=http;host="example.com:8443"']
    assert values(head, b"x-forwarded-proto") == [b"http"]
    assert values(head, b"x-forwarded-port") == [b"8443"]


def test_request_id_factory_returning_garbage_is_a_usage_error() -> None:
    context = ClientContext(CLIENT_IP, 1, False)
    reader = RequestReader(HttpLimits(), context, lambda: "bad\r\nid")
    with pytest.raises(Http1UsageError):
        reader.feed(get())


# Hop-by-hop fields and persistence ------------------------------------------------------


def test_hop_by_hop_fields_are_stripped() -> None:
    head = only_head(
        feed_all(
            get(
                b"/",
                b"Connection: keep-alive, X-Secret, x-other",
                b"X-Secret: 1",
                b"X-Other: 2",
                b"Keep-Alive: timeout=5",
                b"Proxy-Connection: keep-alive",
                b"TE: trailers",
                b"Trailer: X-T",
                b"X-Kept: 3",
            )
        )
    )
    names = {name for name, _ in head.headers}
    for gone in (b"connection", b"x-secret", b"x-other", b"keep-alive", b"proxy-connection"):
        assert gone not in names
    assert b"te" not in names and b"trailer" not in names
    assert values(head, b"x-kept") == [b"3"]


def test_connection_cannot_nominate_host_or_forwarding_fields() -> None:
    head = only_head(
        feed_all(
            get(b"/", b"Connection: Host, X-Forwarded-For, X-Real-IP, X-Forwarded-Host"),
            trusted=True,
        )
    )
    assert values(head, b"host") == [b"example.com"]
    assert values(head, b"x-forwarded-for") == [CLIENT_IP.encode()]
    assert values(head, b"x-real-ip") == [CLIENT_IP.encode()]
    assert values(head, b"x-forwarded-host") == [b"example.com"]


def test_h2c_upgrade_is_stripped() -> None:
    head = only_head(
        feed_all(
            get(
                b"/",
                b"Connection: Upgrade, HTTP2-Settings",
                b"Upgrade: h2c",
                b"HTTP2-Settings: AAMA",
            )
        )
    )
    names = {name for name, _ in head.headers}
    assert not names & {b"upgrade", b"http2-settings", b"connection"}
    assert head.websocket_upgrade is None
    assert b"h2c" not in head.head


def test_upgrade_without_connection_upgrade_is_stripped() -> None:
    head = only_head(feed_all(get(b"/", b"Upgrade: websocket")))
    assert head.websocket_upgrade is None
    assert b"pgrade" not in head.head


def test_http11_connection_close_is_honoured_but_not_forwarded() -> None:
    """Connection is hop-by-hop: the edge closes the client's connection, the
    backend's stays alive for another stream (origin keep-alive reuse)."""
    reader = make_reader()
    events = reader.feed(get(b"/", b"Connection: close") + get(b"/ignored"))
    head = only_head(events)
    assert not head.keep_alive
    assert values(head, b"connection") == []
    assert events[-1] == RequestCompleted()
    assert reader.between_requests  # it went up whole: the backend is at a boundary
    assert reader.feed(get(b"/more")) == []
    assert reader.feed_eof() == [ClientClosed()]


def test_http11_keep_alive_forwards_no_connection_field() -> None:
    head = only_head(feed_all(get(b"/", b"Connection: keep-alive")))
    assert head.keep_alive and values(head, b"connection") == []


def test_http10_defaults_to_close() -> None:
    head = only_head(feed_all(b"GET / HTTP/1.0\r\nHost: a\r\n\r\n"))
    assert not head.keep_alive
    assert head.http_version == b"1.0"
    assert head.head.startswith(b"GET / HTTP/1.0\r\n")
    assert values(head, b"connection") == []


def test_http10_keep_alive_is_honoured_and_forwarded() -> None:
    reader = make_reader()
    events = reader.feed(b"GET /a HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
    head = only_head(events)
    assert head.keep_alive
    assert values(head, b"connection") == [b"keep-alive"]
    events = reader.feed(b"GET /b HTTP/1.0\r\n\r\n")
    assert only_head(events).target == b"/b"


def test_http10_content_length_body() -> None:
    events = feed_all(b"POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi")
    assert events[1:] == [RequestBodyReceived(b"hi"), RequestCompleted()]


# WebSocket ------------------------------------------------------------------------------


def test_valid_websocket_handshake_is_forwarded_and_later_bytes_held() -> None:
    reader = make_reader()
    events = reader.feed(ws_handshake(b"Sec-WebSocket-Protocol: chat") + b"\x81\x05early")
    head = only_head(events)
    assert events[-1] == RequestCompleted()
    assert head.websocket_upgrade == WebSocketUpgrade(method=b"GET", key=WS_KEY)
    assert values(head, b"connection") == [b"Upgrade"]
    assert values(head, b"upgrade") == [b"websocket"]
    assert values(head, b"sec-websocket-key") == [WS_KEY]
    assert values(head, b"sec-websocket-version") == [b"13"]
    assert values(head, b"sec-websocket-protocol") == [b"chat"]
    assert not head.replayable
    assert reader.awaiting_upgrade and not reader.idle and not reader.in_head
    assert reader.feed(b"more") == []
    assert reader.buffered_bytes == len(b"\x81\x05earlymore")
    assert reader.upgrade_accepted() == b"\x81\x05earlymore"
    assert reader.tunnelling
    assert reader.feed(b"GET / HTTP/1.1\r\n\r\n") == [TunnelBytes(b"GET / HTTP/1.1\r\n\r\n")]
    assert reader.feed(b"") == []
    assert reader.feed_eof() == [ClientClosed()]


def test_websocket_upgrade_token_list_is_reduced_to_websocket() -> None:
    data = ws_handshake().replace(b"Upgrade: websocket", b"Upgrade: h2c, WebSocket")
    head = only_head(
        feed_all(data.replace(b"Connection: Upgrade", b"Connection: keep-alive, upgrade"))
    )
    assert head.websocket_upgrade is not None
    assert values(head, b"upgrade") == [b"websocket"]


def test_refused_upgrade_parses_held_bytes_with_rewriting() -> None:
    reader = make_reader()
    smuggled = get(b"/admin", b"X-Forwarded-For: 127.0.0.1", b"X-Real-IP: 127.0.0.1")
    events = reader.feed(ws_handshake() + smuggled)
    assert [type(e) for e in events] == [RequestHeadReceived, RequestCompleted]
    events = reader.upgrade_refused()
    head = only_head(events)
    assert head.target == b"/admin"
    assert values(head, b"x-forwarded-for") == [CLIENT_IP.encode()]
    assert values(head, b"x-real-ip") == [CLIENT_IP.encode()]
    assert b"127.0.0.1" not in head.head
    assert events[-1] == RequestCompleted()
    assert reader.idle


def test_refused_upgrade_with_nothing_held_goes_back_to_idle() -> None:
    reader = make_reader()
    reader.feed(ws_handshake())
    assert reader.upgrade_refused() == []
    assert reader.idle
    assert only_head(reader.feed(get(b"/next"))).target == b"/next"


def test_refused_upgrade_with_held_smuggled_garbage_is_rejected() -> None:
    reader = make_reader()
    reader.feed(ws_handshake() + post([b"Content-Length: 1", b"Content-Length: 2"]))
    assert rejection(reader.upgrade_refused()).status == 400


def test_held_bytes_are_bounded() -> None:
    reader = make_reader(limits=HttpLimits(max_held_upgrade_bytes=100))
    assert reader.feed(ws_handshake() + b"x" * 60)[-1] == RequestCompleted()
    assert reader.feed(b"y" * 40) == []
    refused = rejection(reader.feed(b"z"))
    assert (refused.status, refused.reason) == (
        400,
        "too many bytes sent before the upgrade was answered",
    )
    with pytest.raises(Http1UsageError):
        reader.upgrade_accepted()


def test_held_bytes_bound_applies_within_the_handshake_feed() -> None:
    reader = make_reader(limits=HttpLimits(max_held_upgrade_bytes=10))
    events = reader.feed(ws_handshake() + b"x" * 11)
    assert rejection(events).status == 400


def test_refused_upgrade_after_connection_close_forwards_nothing_more() -> None:
    """A handshake that said ``Connection: close`` was the client's last request:
    what it sent behind it is not parsed when the backend refuses the upgrade."""
    reader = make_reader()
    handshake = ws_handshake().replace(b"Connection: Upgrade", b"Connection: Upgrade, close")
    assert reader.feed(handshake + get(b"/smuggled"))[-1] == RequestCompleted()
    assert reader.upgrade_refused() == []
    assert reader.between_requests and not reader.idle
    assert reader.feed(get(b"/later")) == []


def test_refused_upgrade_leaves_an_unfinished_head_to_finish() -> None:
    reader = make_reader()
    reader.feed(ws_handshake() + b"GET /b HT")
    assert reader.upgrade_refused() == []
    assert reader.in_head
    assert only_head(reader.feed(b"TP/1.1\r\nHost: a\r\n\r\n")).target == b"/b"


def test_refused_upgrade_after_a_clean_close_rejects_nothing() -> None:
    reader = make_reader()
    reader.feed(ws_handshake())
    assert reader.feed_eof() == [ClientClosed()]
    assert reader.upgrade_refused() == []


def test_refused_upgrade_after_a_close_inside_the_next_head() -> None:
    """The held request goes up; the truncated one behind it is rejected."""
    reader = make_reader()
    reader.feed(ws_handshake() + get(b"/a") + b"GET / HT")
    assert reader.feed_eof() == [ClientClosed()]
    events = reader.upgrade_refused()
    assert only_head(events).target == b"/a"
    assert events[1:] == [
        RequestCompleted(),
        RequestRejected(400, "client closed inside a request head", mid_request=False),
    ]


def test_refused_upgrade_after_a_close_inside_the_next_body() -> None:
    reader = make_reader()
    reader.feed(ws_handshake() + post([b"Content-Length: 5"], b"ab"))
    assert reader.feed_eof() == [ClientClosed()]
    events = reader.upgrade_refused()
    assert only_head(events).content_length == 5
    assert events[1:] == [
        RequestBodyReceived(b"ab"),
        RequestRejected(400, "client closed inside a request body", mid_request=True),
    ]


def test_a_second_upgrade_after_a_refused_one_carries_only_its_own_bytes() -> None:
    reader = make_reader()
    reader.feed(ws_handshake())
    assert reader.upgrade_refused() == []
    assert reader.feed(ws_handshake() + b"\x81\x05early")[-1] == RequestCompleted()
    assert reader.upgrade_accepted() == b"\x81\x05early"


def test_the_answered_upgrade_leaves_no_bytes_buffered() -> None:
    for answer in ("accepted", "refused"):
        reader = make_reader()
        reader.feed(ws_handshake() + b"\x81\x05early")
        assert reader.buffered_bytes == 7
        if answer == "accepted":
            assert reader.upgrade_accepted() == b"\x81\x05early"
        else:
            rejection(reader.upgrade_refused())  # not HTTP: rejected
        assert reader.buffered_bytes == 0, answer


def test_eof_while_upgrade_pending_then_refused() -> None:
    reader = make_reader()
    reader.feed(ws_handshake() + b"GET / HT")
    assert reader.feed_eof() == [ClientClosed()]
    assert rejection(reader.upgrade_refused()).status == 400


@pytest.mark.parametrize(
    "data",
    [
        ws_handshake(key=b"c2hvcnQ="),
        ws_handshake(key=b"dGhlIHNhbXBsZSBub25jZQ"),
        ws_handshake(key=b"dGhlIHNhbXBsZSBub25jZQ=!"),
        ws_handshake(key=b"dGhlIHNhbXBsZSBub25jZSEh"),
        ws_handshake(method=b"POST"),
        ws_handshake().replace(b"Version: 13", b"Version: 8"),
        ws_handshake().replace(b"Sec-WebSocket-Version: 13\r\n", b""),
        ws_handshake().replace(b"Sec-WebSocket-Key: " + WS_KEY + b"\r\n", b""),
        ws_handshake(b"Sec-WebSocket-Key: " + WS_KEY),
        ws_handshake(b"Content-Length: 5"),
        ws_handshake().replace(b"HTTP/1.1", b"HTTP/1.0"),
    ],
    ids=[
        "short-key",
        "unpadded-key",
        "bad-char-key",
        "18-byte-key",
        "post",
        "version-8",
        "no-version",
        "no-key",
        "two-keys",
        "with-body",
        "http10",
    ],
)
def test_invalid_websocket_handshakes_are_rejected(data: bytes) -> None:
    assert rejection(feed_all(data)).status == 400


def test_upgrade_calls_without_pending_upgrade_are_usage_errors() -> None:
    reader = make_reader()
    with pytest.raises(Http1UsageError, match=r"^upgrade_accepted\(\) with no WebSocket upgrade"):
        reader.upgrade_accepted()
    with pytest.raises(Http1UsageError, match=r"^upgrade_refused\(\) with no WebSocket upgrade"):
        reader.upgrade_refused()


# Timers, EOF, dead reader ---------------------------------------------------------------


def test_idle_and_in_head_tell_which_timer_to_arm() -> None:
    reader = make_reader()
    assert reader.idle and not reader.in_head
    reader.feed(b"GE")
    assert reader.in_head and not reader.idle
    reader.feed(b"T / HTTP/1.1\r\nHost: a\r\n")
    assert reader.in_head
    reader.feed(b"\r\n")
    assert reader.idle and not reader.in_head


def test_eof_between_requests_is_client_closed() -> None:
    reader = make_reader()
    reader.feed(get())
    assert reader.feed_eof() == [ClientClosed()]
    assert reader.feed_eof() == []
    assert reader.feed(get()) == []
    assert not reader.idle


def test_eof_inside_head_is_rejected_as_truncated() -> None:
    reader = make_reader()
    reader.feed(b"GET / HTTP/1.1\r\nHo")
    refused = rejection(reader.feed_eof())
    assert (refused.status, refused.reason) == (400, "client closed inside a request head")


def test_eof_inside_body_is_rejected_as_truncated() -> None:
    reader = make_reader()
    reader.feed(post([b"Content-Length: 5"], b"ab"))
    assert rejection(reader.feed_eof()).reason == "client closed inside a request body"


def test_eof_inside_chunked_body_is_rejected_as_truncated() -> None:
    reader = make_reader()
    reader.feed(post([b"Transfer-Encoding: chunked"], b"3\r\nab"))
    assert rejection(reader.feed_eof()).status == 400


def test_dead_reader_ignores_everything() -> None:
    reader = make_reader()
    assert rejection(reader.feed(b"\x00garbage\r\n\r\n")).status == 400
    assert reader.feed(get()) == []
    assert reader.buffered_bytes == 0
    assert not reader.idle and not reader.in_head
    assert reader.feed_eof() == []


def test_events_before_a_rejection_in_the_same_feed_are_kept() -> None:
    events = feed_all(get(b"/good") + b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
    assert only_head(events).target == b"/good"
    assert rejection(events).status == 400


# Number parsing -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [b"", b" 5", b"5 ", b"+5", b"-5", b"1_0", "\u0665".encode(), b"0x5", b"5.0", b"1" * 19],
)
def test_parse_decimal_rejects_what_int_accepts(text: bytes) -> None:
    assert parse_decimal(text, 18) is None


def test_parse_decimal_and_hex_accept_plain_digits() -> None:
    assert parse_decimal(b"0", 18) == 0
    assert parse_decimal(b"007", 18) == 7
    assert parse_decimal(b"9" * 18, 18) == 10**18 - 1
    assert parse_hex(b"fF", 16) == 255
    assert parse_hex(b"f" * 16, 16) == 2**64 - 1
    for text in (b"", b"0x1", b" a", b"a ", b"+a", b"g", b"1_0", b"0" * 17):
        assert parse_hex(text, 16) is None


# Configuration --------------------------------------------------------------------------


def test_limits_reject_non_positive_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match="max_headers"):
        HttpLimits(max_headers=0)
    with pytest.raises(ValueError, match="max_header_bytes"):
        HttpLimits(max_header_bytes=1.5)  # type: ignore[arg-type]


def test_client_context_validation() -> None:
    with pytest.raises(ValueError, match="scheme"):
        ClientContext(CLIENT_IP, 1, False, scheme="ftp")
    with pytest.raises(ValueError, match="client_ip"):
        ClientContext("1.2.3.4\r\nX: y", 1, False)
    with pytest.raises(ValueError, match="server_port"):
        ClientContext(CLIENT_IP, 1, False, server_port=70000)


def test_a_content_length_above_max_body_bytes_is_413_before_anything_goes_up() -> None:
    limits = HttpLimits(max_body_bytes=1000)
    events = feed_all(post([b"Content-Length: 1001"], b"x" * 10), limits=limits)
    assert not [e for e in events if isinstance(e, RequestHeadReceived)]
    rejected = rejection(events)
    assert (rejected.status, rejected.mid_request) == (413, False)
    assert rejected.reason == "Content-Length above max_body_bytes"
    assert only_head(feed_all(post([b"Content-Length: 1000"]), limits=limits))


def test_a_chunked_body_growing_past_max_body_bytes_is_413_mid_request() -> None:
    reader = make_reader(limits=HttpLimits(max_body_bytes=1000))
    events = reader.feed(post([b"Transfer-Encoding: chunked"], b"3e8\r\n" + b"x" * 1000 + b"\r\n"))
    assert only_head(events) and not [e for e in events if isinstance(e, RequestRejected)]
    rejected = rejection(reader.feed(b"1\r\nx\r\n"))
    assert (rejected.status, rejected.mid_request) == (413, True)
    assert rejected.reason == "chunked body above max_body_bytes"


@pytest.mark.parametrize(
    "body",
    [b"zz\r\nabc\r\n", b"3\r\nabcXX", b"3;" + b"e" * 300 + b"\r\nabc\r\n", b"3\rabc\r\n"],
    ids=["bad-size", "bad-chunk-end", "long-extension", "bare-cr"],
)
def test_a_framing_error_in_a_body_is_a_rejection_mid_request(body: bytes) -> None:
    events = feed_all(post([b"Transfer-Encoding: chunked"], body))
    assert only_head(events)
    rejected = rejection(events)
    assert (rejected.status, rejected.mid_request) == (400, True)


def test_a_rejected_head_is_not_mid_request() -> None:
    rejected = rejection(feed_all(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"))
    assert (rejected.status, rejected.mid_request) == (400, False)


def test_a_workers_request_ids_are_valid_by_construction_and_go_up_unchanged() -> None:
    from edge.http1.request_head import RequestIds

    ids = RequestIds("a1b2c3d4")
    context = ClientContext(CLIENT_IP, 40000, False, "https", 443)
    reader = RequestReader(HttpLimits(), context, ids)
    heads = [e for e in reader.feed(get() * 3) if isinstance(e, RequestHeadReceived)]
    assert [h.request_id for h in heads] == [
        "a1b2c3d400000001",
        "a1b2c3d400000002",
        "a1b2c3d400000003",
    ]
    assert b"X-Request-Id: a1b2c3d400000003\r\n" in heads[2].head
    assert ids() == "a1b2c3d400000004"  # still a Callable[[], str] for any other use
    for prefix in ("bad prefix", "é", "x" * 181):
        with pytest.raises(ValueError, match="prefix"):
            RequestIds(prefix)
