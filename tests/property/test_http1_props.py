"""Hypothesis properties of the HTTP/1.1 readers.

- how the bytes are split between ``feed`` calls never changes the outcome;
- chunked request bodies are re-encoded into framing that decodes (by our
  oracle and by llhttp) to the same payload;
- the forwarded request stream is valid HTTP/1.1 carrying exactly the
  requests we reported, each with one edge-set X-Forwarded-For;
- on the response side, the bytes forwarded are exactly the bytes received.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import httptools
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.http1 import (
    BackendClosed,
    ClientContext,
    HttpLimits,
    RequestBodyReceived,
    RequestCompleted,
    RequestHeadReceived,
    RequestReader,
    RequestRejected,
    ResponseBodyReceived,
    ResponseCompleted,
    ResponseHeadReceived,
    ResponseInvalid,
    ResponseReader,
    reusable_head,
)
from edge.http1.request_head import EDGE_SET_FIELDS
from tests.example_budget import examples

CLIENT_IP = "198.51.100.7"
TRUSTED_KEPT = {b"x-real-ip", b"x-forwarded-proto", b"x-forwarded-host", b"x-forwarded-port"}
"""The forwarding fields kept from a trusted proxy as it sent them."""
PROPERTY_SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def make_reader(limits: HttpLimits | None = None, trusted: bool = False) -> RequestReader:
    counter = itertools.count(1)
    context = ClientContext(CLIENT_IP, 1234, trusted)
    return RequestReader(limits or HttpLimits(), context, lambda: f"id-{next(counter)}")


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    return [p for p in pieces if p]


#: Trailer fields a client may send that must never reach the backend.
POLICED_TRAILERS = frozenset(
    {b"host", b"content-length", b"transfer-encoding", b"x-forwarded-for", b"x-real-ip",
     b"forwarded", b"x-request-id", b"authorization", b"cookie", b"x_forwarded_for"}
)  # fmt: skip
TRAILER_CHOICES = [
    b"",
    b"X-T: 1\r\n",
    b"A: b\r\nC: d e\r\n",
    b"X-Forwarded-For: 6.6.6.6\r\nX-Sum: 9\r\n",
    b"Content-Length: 0\r\nHost: evil.test\r\nX_Forwarded_For: 1.2.3.4\r\n",
    b"Authorization: Basic eA==\r\nCookie: a=b\r\nX-Request-Id: mine\r\n",
]


def decode_chunked(body: bytes) -> bytes:
    """Test oracle for bodies *we* produced (int() is fine on our own output)."""
    payload, rest = b"", body
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        assert size_line == size_line.strip() and size_line.isalnum(), size_line
        size = int(size_line, 16)
        if size == 0:  # then the trailer fields that went on, and the empty line
            assert rest.endswith(b"\r\n") and (rest == b"\r\n" or rest.endswith(b"\r\n\r\n"))
            for line in rest[:-2].split(b"\r\n")[:-1]:
                assert line.partition(b":")[0].lower() not in POLICED_TRAILERS, line
            return payload
        assert size > 0
        payload += rest[:size]
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


def normalise_requests(events: Sequence[object]) -> list[object]:
    """Merge body events, decode chunked ones, keep only the status of a rejection.

    Body bytes of a request that ends up rejected may or may not have been
    reported before the rejection depending on the split (the edge resets
    the stream either way), so they are dropped.
    """
    out: list[object] = []
    body = b""
    chunked = False
    for event in events:
        if isinstance(event, RequestHeadReceived):
            out.append(event)
            chunked, body = event.chunked, b""
        elif isinstance(event, RequestBodyReceived):
            body += event.data
        elif isinstance(event, RequestCompleted):
            out.append(("body", decode_chunked(body) if chunked and body else body))
            out.append(event)
            body = b""
        elif isinstance(event, RequestRejected):
            out.append(("rejected", event.status))
        else:
            out.append(event)
    return out


# Generators -----------------------------------------------------------------------------

TOKEN_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
field_names = st.text(TOKEN_CHARS, min_size=1, max_size=12).map(lambda s: b"X-" + s.encode())
field_values = st.binary(max_size=30).map(
    lambda b: bytes(c for c in b if 0x21 <= c <= 0x7E or c == 0x20).strip()
)
paths = st.text("abcdefghijklmnopqrstuvwxyz0123456789/-._~%", max_size=20).map(
    lambda s: b"/" + s.encode()
)
forwarding_fields = st.sampled_from(
    [
        b"X-Forwarded-For: 10.0.0.1",
        b"X-Real-IP: 10.0.0.2",
        b"Forwarded: for=10.0.0.3",
        b"X-Forwarded-Proto: http",
        b"X-Forwarded-Host: evil",
        b"X-Forwarded-Port: 1",
        b"X-Request-Id: mine",
        b"Connection: keep-alive",
        b"Keep-Alive: timeout=1",
        b"Upgrade: h2c",
        b"Connection: Upgrade, HTTP2-Settings",
        b"HTTP2-Settings: AAMA",
        b"TE: trailers",
    ]
)


@st.composite
def chunked_bodies(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(wire body, payload) with random chunk sizes, digit spellings, extensions, trailers."""
    pieces = draw(st.lists(st.binary(min_size=1, max_size=40), max_size=5))
    wire = b""
    for piece in pieces:
        digits = b"%x" % len(piece)
        digits = b"0" * draw(st.integers(0, 16 - len(digits))) + digits
        if draw(st.booleans()):
            digits = digits.upper()
        extension = draw(st.sampled_from([b"", b";a", b";a=b", b';q="x y"', b" ;a", b"\t;a=1"]))
        if extension.startswith((b" ", b"\t")):
            extension = extension.strip()  # whitespace before ';' is rejected, tested elsewhere
        wire += digits + extension + b"\r\n" + piece + b"\r\n"
    trailers = draw(st.sampled_from(TRAILER_CHOICES))
    return wire + b"0\r\n" + trailers + b"\r\n", b"".join(pieces)


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(wire request, payload)."""
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS"]))
    lines = [method + b" " + draw(paths) + b" HTTP/1.1", b"Host: example.com"]
    extra = draw(st.lists(st.tuples(field_names, field_values), max_size=4))
    lines += [name + b": " + value for name, value in extra]
    lines += draw(st.lists(forwarding_fields, max_size=3))
    framing = draw(st.sampled_from(["none", "length", "chunked"]))
    payload = b""
    body = b""
    if framing == "length":
        payload = body = draw(st.binary(max_size=60))
        lines.append(b"Content-Length: %d" % len(body))
    elif framing == "chunked":
        body, payload = draw(chunked_bodies())
        lines.append(b"Transfer-Encoding: chunked")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body, payload


request_streams = st.lists(requests(), min_size=1, max_size=4)


# Request properties ---------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(stream=request_streams, cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_request_events_do_not_depend_on_how_bytes_are_split(
    stream: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    data = b"".join(wire for wire, _ in stream)
    whole = make_reader().feed(data)
    reader = make_reader()
    pieces: list[object] = []
    for piece in split_at(data, cuts):
        pieces += reader.feed(piece)
    assert normalise_requests(pieces) == normalise_requests(whole)


@settings(max_examples=examples(40), deadline=None)
@given(stream=request_streams)
def test_request_byte_at_a_time_equals_one_feed(stream: list[tuple[bytes, bytes]]) -> None:
    data = b"".join(wire for wire, _ in stream)
    whole = make_reader().feed(data)
    reader = make_reader()
    single: list[object] = []
    for index in range(len(data)):
        single += reader.feed(data[index : index + 1])
    assert normalise_requests(single) == normalise_requests(whole)


@PROPERTY_SETTINGS
@given(stream=request_streams, cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_valid_requests_are_all_delivered_with_their_payloads(
    stream: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    reader = make_reader()
    events: list[object] = []
    for piece in split_at(b"".join(wire for wire, _ in stream), cuts):
        events += reader.feed(piece)
    normal = normalise_requests(events)
    assert not any(isinstance(e, tuple) and e[0] == "rejected" for e in normal), normal
    bodies = [e[1] for e in normal if isinstance(e, tuple) and e[0] == "body"]
    assert bodies == [payload for _, payload in stream]
    assert reader.idle


@dataclass
class Message:
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    complete: bool = False


@dataclass
class LlhttpRequests:
    """Collects what strict llhttp sees in the stream the edge forwards."""

    messages: list[Message] = field(default_factory=list)

    def on_message_begin(self) -> None:
        self.messages.append(Message())

    def on_header(self, name: bytes, value: bytes) -> None:
        self.messages[-1].headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.messages[-1].body += body

    def on_message_complete(self) -> None:
        self.messages[-1].complete = True


@PROPERTY_SETTINGS
@given(stream=request_streams, trusted=st.booleans())
def test_forwarded_stream_is_strict_http_with_one_edge_set_xff(
    stream: list[tuple[bytes, bytes]], trusted: bool
) -> None:
    events = make_reader(trusted=trusted).feed(b"".join(wire for wire, _ in stream))
    forwarded = b"".join(
        e.head if isinstance(e, RequestHeadReceived) else e.data
        for e in events
        if isinstance(e, RequestHeadReceived | RequestBodyReceived)
    )
    collector = LlhttpRequests()
    httptools.HttpRequestParser(collector).feed_data(forwarded)
    assert len(collector.messages) == len(stream)
    hop_by_hop = {b"connection", b"keep-alive", b"upgrade", b"http2-settings", b"te"}
    for message, (_, payload) in zip(collector.messages, stream, strict=True):
        assert message.complete
        assert message.body == payload
        headers = message.headers
        xff = [v for n, v in headers if n == b"x-forwarded-for"]
        assert len(xff) == 1 and xff[0].endswith(CLIENT_IP.encode())
        if not trusted:
            assert xff == [CLIENT_IP.encode()]
        assert len([n for n, _ in headers if n == b"x-request-id"]) == 1
        assert not hop_by_hop & {n for n, _ in headers}


@PROPERTY_SETTINGS
@given(stream=request_streams, trusted=st.booleans())
def test_client_fields_are_the_forwarded_fields_less_those_the_edge_sets(
    stream: list[tuple[bytes, bytes]], trusted: bool
) -> None:
    """What a cache hit reads (client_fields, edge.cache.EdgeCache.plain_hit)
    is what goes up, less what the edge set: never a forwarding field from an
    untrusted client, and the head's fields in the head's order."""
    for event in make_reader(trusted=trusted).feed(b"".join(wire for wire, _ in stream)):
        if not isinstance(event, RequestHeadReceived):
            continue
        client = event.client_fields
        assert event.headers[: len(client)] == client
        assert {n for n, _ in event.headers[len(client) :]} <= EDGE_SET_FIELDS
        assert {b"x-forwarded-for", b"x-request-id", b"traceparent"} <= {
            n for n, _ in event.headers[len(client) :]
        }
        edge_set_from_client = {n for n, _ in client} & EDGE_SET_FIELDS
        assert edge_set_from_client <= (TRUSTED_KEPT if trusted else set())
        lines = event.head.split(b"\r\n")[1:-2]
        assert [line.partition(b":")[0].lower() for line in lines] == [n for n, _ in event.headers]


@PROPERTY_SETTINGS
@given(body=chunked_bodies(), cuts=st.lists(st.integers(0, 10_000), max_size=10))
def test_chunked_bodies_reencode_to_the_same_payload(
    body: tuple[bytes, bytes], cuts: list[int]
) -> None:
    wire, payload = body
    reader = make_reader()
    events = reader.feed(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
    for piece in split_at(wire, cuts):
        events += reader.feed(piece)
    assert events[-1] == RequestCompleted()
    forwarded = b"".join(e.data for e in events if isinstance(e, RequestBodyReceived))
    assert decode_chunked(forwarded) == payload
    sent = next(
        t
        for t in sorted(TRAILER_CHOICES, key=len, reverse=True)
        if wire.endswith(b"0\r\n" + t + b"\r\n")
    )
    allowed = [
        f for f in sent.split(b"\r\n")[:-1] if f.partition(b":")[0].lower() not in POLICED_TRAILERS
    ]
    assert forwarded.endswith(b"0\r\n" + b"".join(f + b"\r\n" for f in allowed) + b"\r\n")
    collector = LlhttpRequests()
    head = events[0]
    assert isinstance(head, RequestHeadReceived)
    httptools.HttpRequestParser(collector).feed_data(head.head + forwarded)
    assert [m.body for m in collector.messages] == [payload]


@PROPERTY_SETTINGS
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 10_000), max_size=10))
def test_arbitrary_bytes_split_invariance(data: bytes, cuts: list[int]) -> None:
    whole = make_reader().feed(b"GET / HTTP/1.1\r\nHost: a\r\n" + data)
    reader = make_reader()
    parts: list[object] = []
    for piece in split_at(b"GET / HTTP/1.1\r\nHost: a\r\n" + data, cuts):
        parts += reader.feed(piece)
    assert normalise_requests(parts) == normalise_requests(whole)


# Response properties --------------------------------------------------------------------


@st.composite
def response_streams(draw: st.DrawFn) -> tuple[list[bytes], bytes, int, bool]:
    """(request methods, wire bytes, final responses, ends by EOF)."""
    methods: list[bytes] = []
    wire = b""
    finals = 0
    count = draw(st.integers(1, 4))
    for index in range(count):
        method = draw(st.sampled_from([b"GET", b"HEAD", b"POST"]))
        methods.append(method)
        if draw(st.booleans()):
            wire += b"HTTP/1.1 100 Continue\r\n\r\n"
        status = draw(st.sampled_from([200, 201, 204, 304, 404, 500]))
        lines = [b"HTTP/1.1 %d Reason" % status, b"Date: today"]
        kinds = ["length", "chunked"] + (["eof"] if index == count - 1 else [])
        kind = draw(st.sampled_from(kinds))
        body = b""
        bodiless = method == b"HEAD" or status in (204, 304)
        payload = draw(st.binary(max_size=50))
        if kind == "length":
            lines.append(b"Content-Length: %d" % len(payload))
            body = payload
        elif kind == "chunked":
            lines.append(b"Transfer-Encoding: chunked")
            body, _ = draw(chunked_bodies())
        else:
            body = payload
        wire += b"\r\n".join(lines) + b"\r\n\r\n" + (b"" if bodiless else body)
        finals += 1
        if kind == "eof" and not bodiless:
            return methods, wire, finals, True
    return methods, wire, finals, False


def forwarded_response_bytes(events: Sequence[object]) -> bytes:
    return b"".join(
        e.head if isinstance(e, ResponseHeadReceived) else e.data
        for e in events
        if isinstance(e, ResponseHeadReceived | ResponseBodyReceived)
    )


@PROPERTY_SETTINGS
@given(stream=response_streams(), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_responses_are_forwarded_byte_for_byte(
    stream: tuple[list[bytes], bytes, int, bool], cuts: list[int]
) -> None:
    methods, wire, finals, by_eof = stream
    reader = ResponseReader(HttpLimits())
    for method in methods:
        reader.expect(method, None)
    events: list[object] = []
    for piece in split_at(wire, cuts):
        events += reader.feed(piece)
    events += reader.feed_eof()
    assert forwarded_response_bytes(events) == wire
    completed = [e for e in events if isinstance(e, ResponseCompleted)]
    assert len(completed) == finals
    assert completed[-1].close_after is by_eof
    assert events[-1] == BackendClosed(before_response=False, mid_response=False)


def normalise_responses(events: Sequence[object]) -> list[object]:
    out: list[object] = []
    for event in events:
        if isinstance(event, ResponseBodyReceived):
            if out and isinstance(out[-1], ResponseBodyReceived):
                out[-1] = ResponseBodyReceived(out[-1].data + event.data)
            else:
                out.append(event)
        elif isinstance(event, ResponseInvalid):
            if out and isinstance(out[-1], ResponseBodyReceived):
                out.pop()  # how much of a bad body got out before the error depends on splits
            out.append(ResponseInvalid("-"))
        else:
            out.append(event)
    return out


@PROPERTY_SETTINGS
@given(
    stream=response_streams(),
    noise=st.binary(max_size=40),
    position=st.integers(0, 10_000),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_response_events_do_not_depend_on_how_bytes_are_split(
    stream: tuple[list[bytes], bytes, int, bool], noise: bytes, position: int, cuts: list[int]
) -> None:
    methods, wire, _, _ = stream
    position %= len(wire) + 1
    data = wire[:position] + noise + wire[position:]

    def run(pieces: list[bytes]) -> list[object]:
        reader = ResponseReader(HttpLimits())
        for method in methods:
            reader.expect(method, None)
        events: list[object] = []
        for piece in pieces:
            events += reader.feed(piece)
        return normalise_responses(events + reader.feed_eof())

    assert run(split_at(data, cuts)) == run([data])


#: Field names around the backend's persistence fields: theirs, in any case,
#: and names that share a prefix with them.
_RESPONSE_FIELD_NAMES = st.sampled_from(
    [
        b"Connection",
        b"connection",
        b"KEEP-ALIVE",
        b"Keep-Alive",
        b"Proxy-Connection",
        b"Connection-Id",
        b"Keep-Alive-Hint",
        b"X-Slot",
        b"Content-Type",
        b"Date",
    ]
)
_FIELD_VALUES = st.binary(max_size=12).map(
    lambda v: v.replace(b"\r", b"").replace(b"\n", b"").strip(b" \t") or b"v"
)


@PROPERTY_SETTINGS
@given(
    fields=st.lists(
        st.tuples(
            _RESPONSE_FIELD_NAMES,
            st.sampled_from([b"", b" ", b"\t"]),
            _FIELD_VALUES,
            st.lists(_FIELD_VALUES, max_size=2),
        ),
        max_size=8,
    )
)
def test_reusable_head_one_pass_and_line_by_line_agree(
    fields: list[tuple[bytes, bytes, bytes, list[bytes]]],
) -> None:
    """The regular-expression pass (nothing nominated) and the line-by-line
    rewrite (fields nominated) drop the same lines, obs-fold included."""
    lines = [b"HTTP/1.1 200 OK"]
    for name, space, value, folds in fields:
        lines.append(name + space + b": " + value)
        lines += [b" " + fold for fold in folds]
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    one_pass = reusable_head(head)
    assert one_pass == reusable_head(head, frozenset({b"x-nobody-sends-this"}))
    field_lines = [line for line in one_pass.split(b"\r\n")[1:] if line[:1] not in (b" ", b"\t")]
    kept_names = {line.partition(b":")[0].strip().lower() for line in field_lines}
    assert not kept_names & {b"connection", b"keep-alive", b"proxy-connection"}
