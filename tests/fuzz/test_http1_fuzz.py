"""Fuzzing the HTTP/1.1 readers: nothing may raise, buffer without bound, or get through.

Harness contract (as h11's fuzz harness): ``feed``/``feed_eof`` never raise,
whatever the bytes and however they are split. On top of that, oracles:

- ``buffered_bytes`` stays under the configured limits after every call;
- nothing comes out after a rejection (the reader is dead);
- every request the edge reports as complete was forwarded as exactly one
  strict-HTTP/1.1 message (parsed by llhttp, no leniency) carrying one
  X-Forwarded-For set by the edge: no mutation smuggles a second request or
  a client-chosen forwarding field through;
- response bytes forwarded are always a prefix of the bytes received.

Mutation fuzzing is seeded and bounded by a count of iterations (never by time,
so it covers the same inputs on every machine; ``make test-long`` runs more).
"""

from __future__ import annotations

import itertools
import random

import httptools
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.http1 import (
    BackendClosed,
    ClientClosed,
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
    TunnelBytes,
    WebSocketAccepted,
    WebSocketRefused,
    websocket_accept,
)
from tests.example_budget import examples

LIMITS = HttpLimits(
    max_request_line_bytes=200,
    max_header_bytes=600,
    max_headers=20,
    max_chunk_size_digits=8,
    max_chunk_extension_bytes=40,
    max_held_upgrade_bytes=300,
)
BUFFER_BOUND = LIMITS.max_header_bytes + LIMITS.max_held_upgrade_bytes
CLIENT_IP = "192.0.2.55"
WS_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="
FUZZ_ITERATIONS = examples(20_000)

REQUEST_EVENTS = (
    RequestHeadReceived,
    RequestBodyReceived,
    RequestCompleted,
    RequestRejected,
    ClientClosed,
    TunnelBytes,
)
RESPONSE_EVENTS = (
    ResponseHeadReceived,
    ResponseBodyReceived,
    ResponseCompleted,
    WebSocketAccepted,
    WebSocketRefused,
    ResponseInvalid,
    BackendClosed,
    TunnelBytes,
)

REQUEST_SEEDS = [
    b"GET /a?b=c HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: example.com\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;x=y\r\nhello\r\n00a\r\n0123456789\r\n0\r\nT: 1\r\n\r\n",
    b"GET /chat HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: " + WS_KEY + b"\r\nSec-WebSocket-Version: 13\r\n\r\n\x81\x00",
    b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n"
    b"GET /2 HTTP/1.0\r\n\r\n",
    b"GET http://h/abs HTTP/1.1\r\nHost: h\r\nX-Real-IP: 1.1.1.1\r\n\r\n"
    b"PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    b"OPTIONS * HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
    b"HTTP2-Settings: AAMA\r\n\r\n",
]

RESPONSE_SEEDS = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\nT: 1\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\nHTTP/1.0 200 OK\r\n\r\nuntil-eof",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Accept: " + websocket_accept(WS_KEY) + b"\r\n\r\n\x81\x02hi",
    b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\nHTTP/1.1 500 E\r\nConnection: close\r\n"
    b"Content-Length: 1\r\n\r\nx",
]

TOKENS = [
    b"\r\n",
    b"\n",
    b"\r",
    b" ",
    b"\t",
    b"\x00",
    b":",
    b";",
    b",",
    b"0",
    b"f",
    b"\r\n\r\n",
    b"0\r\n\r\n",
    b"Content-Length: 3\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip, chunked\r\n",
    b"Connection: close\r\n",
    b"X-Forwarded-For: 6.6.6.6\r\n",
    b"Host: other\r\n",
    b"GET / HTTP/1.1\r\n",
    b"\xff",
]


def make_request_reader() -> RequestReader:
    counter = itertools.count()
    return RequestReader(LIMITS, ClientContext(CLIENT_IP, 1, False), lambda: f"r{next(counter)}")


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randint(0, len(buf))
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        elif op == 1:
            buf[pos:pos] = rng.choice(TOKENS)
        elif op == 2:
            del buf[pos : pos + rng.randint(1, 8)]
        elif op == 3:
            buf[pos:pos] = buf[pos : pos + rng.randint(1, 30)]
        elif op == 4:
            buf = buf.replace(b"\r\n", b"\n", 1) if rng.random() < 0.5 else buf + buf[:pos]
        else:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
    return bytes(buf)


def random_split(rng: random.Random, data: bytes) -> list[bytes]:
    pieces, pos = [], 0
    while pos < len(data):
        step = rng.choice((1, 2, 3, 7, 50, len(data)))
        pieces.append(data[pos : pos + step])
        pos += step
    return pieces


# Request side ---------------------------------------------------------------------------


def check_forwarded_request(segment: bytes, head: RequestHeadReceived) -> None:
    """One completed request's forwarded bytes are exactly one strict message."""
    messages: list[list[tuple[bytes, bytes]]] = []

    class Collector:
        def on_message_begin(self) -> None:
            messages.append([])

        def on_header(self, name: bytes, value: bytes) -> None:
            messages[-1].append((name.lower(), value))

        def on_message_complete(self) -> None:
            messages[-1].append((b":complete", b""))

    parser = httptools.HttpRequestParser(Collector())
    try:
        parser.feed_data(segment)
    except httptools.HttpParserUpgrade as exc:
        assert head.websocket_upgrade is not None
        assert exc.args[0] == len(segment)
    assert len(messages) == 1, segment
    fields = messages[0]
    assert fields[-1] == (b":complete", b"")
    assert [v for n, v in fields if n == b"x-forwarded-for"] == [CLIENT_IP.encode()]
    assert [v for n, v in fields if n == b"x-real-ip"] == [CLIENT_IP.encode()]
    forwarded = [v for n, v in fields if n == b"forwarded"]
    assert len(forwarded) == 1 and forwarded[0].startswith(b"for=" + CLIENT_IP.encode() + b";")
    assert [v for n, v in fields if n == b"x-forwarded-proto"] == [b"https"]


def run_request_reader(rng: random.Random, pieces: list[bytes]) -> None:
    reader = make_request_reader()
    events: list[object] = []
    for piece in pieces:
        new = reader.feed(piece)
        if reader.awaiting_upgrade and rng.random() < 0.5:
            if rng.random() < 0.5:
                reader.upgrade_accepted()
            else:
                new += reader.upgrade_refused()
        assert reader.buffered_bytes <= BUFFER_BOUND, reader.buffered_bytes
        events += new
    events += reader.feed_eof()
    assert all(isinstance(e, REQUEST_EVENTS) for e in events)
    rejections = [i for i, e in enumerate(events) if isinstance(e, RequestRejected)]
    if rejections:
        assert rejections == [len(events) - 1], events
    segment, head = b"", None
    for event in events:
        if isinstance(event, RequestHeadReceived):
            segment, head = event.head, event
        elif isinstance(event, RequestBodyReceived):
            segment += event.data
        elif isinstance(event, RequestCompleted):
            assert head is not None
            check_forwarded_request(segment, head)
            segment, head = b"", None


def test_mutated_requests_never_raise_nor_smuggle() -> None:
    rng = random.Random(0x5EED)
    for iteration in range(FUZZ_ITERATIONS):
        seed = b"".join(rng.sample(REQUEST_SEEDS, rng.randint(1, 3)))
        data = mutate(rng, seed)
        try:
            run_request_reader(rng, random_split(rng, data))
        except AssertionError as exc:
            raise AssertionError(f"iteration {iteration}, input {data!r}") from exc
    assert iteration == FUZZ_ITERATIONS - 1  # the loop really ran


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2000), seed=st.integers(0, 2**32))
def test_random_bytes_into_request_reader(data: bytes, seed: int) -> None:
    run_request_reader(random.Random(seed), random_split(random.Random(seed), data))


def test_endless_header_stream_stays_bounded() -> None:
    reader = make_request_reader()
    events = reader.feed(b"GET / HTTP/1.1\r\nHost: h\r\n")
    for index in range(200):
        events += reader.feed(b"X-%d: %s\r\n" % (index, b"v" * 20))
        assert reader.buffered_bytes <= LIMITS.max_header_bytes
        if events:
            break
    assert isinstance(events[-1], RequestRejected)
    assert events[-1].status == 431


def test_endless_trailers_stay_bounded() -> None:
    reader = make_request_reader()
    reader.feed(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n")
    events: list[object] = []
    for _ in range(200):
        events += reader.feed(b"T: " + b"t" * 30 + b"\r\n")
        assert reader.buffered_bytes <= LIMITS.max_header_bytes
        if events:
            break
    assert isinstance(events[-1], RequestRejected)


# Response side --------------------------------------------------------------------------


def run_response_reader(rng: random.Random, pieces: list[bytes], methods: list[bytes]) -> None:
    reader = ResponseReader(LIMITS)
    for method in methods:
        reader.expect(method, WS_KEY if method == b"GET" and rng.random() < 0.3 else None)
    events: list[object] = []
    for piece in pieces:
        events += reader.feed(piece)
        assert reader.buffered_bytes <= LIMITS.max_header_bytes
    events += reader.feed_eof()
    assert all(isinstance(e, RESPONSE_EVENTS) for e in events)
    terminal = [
        i for i, e in enumerate(events) if isinstance(e, ResponseInvalid | WebSocketRefused)
    ]
    if terminal:
        assert terminal == [len(events) - 1], events
    forwarded = b"".join(
        e.head if isinstance(e, ResponseHeadReceived) else e.data
        for e in events
        if isinstance(e, ResponseHeadReceived | ResponseBodyReceived | TunnelBytes)
    )
    assert b"".join(pieces).startswith(forwarded)


def test_mutated_responses_never_raise_and_forward_a_prefix() -> None:
    rng = random.Random(0xBACC)
    for iteration in range(FUZZ_ITERATIONS):
        data = mutate(rng, b"".join(rng.sample(RESPONSE_SEEDS, rng.randint(1, 3))))
        methods = [rng.choice((b"GET", b"HEAD", b"POST")) for _ in range(rng.randint(0, 4))]
        try:
            run_response_reader(rng, random_split(rng, data), methods)
        except AssertionError as exc:
            raise AssertionError(f"iteration {iteration}, input {data!r}") from exc
    assert iteration == FUZZ_ITERATIONS - 1


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2000), seed=st.integers(0, 2**32))
def test_random_bytes_into_response_reader(data: bytes, seed: int) -> None:
    rng = random.Random(seed)
    prefix = b"HTTP/1.1 200 OK\r\n" if rng.random() < 0.5 else b""
    run_response_reader(rng, random_split(rng, prefix + data), [b"GET", b"HEAD"])
