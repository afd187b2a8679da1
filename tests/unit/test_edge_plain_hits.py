"""The common cache hit answered by the HTTP/1.1 front end without an exchange
(EdgeCache.plain_hit, Http1Responses.answer_hit), held to the general path
(EdgeCache.admit through an exchange): for the same stored response, the same
octets and the same log record, whichever path answers.

The general path answers a request the plain path leaves to it but whose
reply is the same (a request directive that changes nothing here: ``Pragma``
with an extension token, RFC 9111 §5.4): the two answers may differ only in
what is per request (the request id) or per second (``Age``, the ``ttl`` of
``Cache-Status``)."""

from __future__ import annotations

import asyncio
import gzip
import re
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest

from edge.cache.cache import EdgeCache
from edge.cache.config import CacheConfig, CacheKeyConfig, CompressionConfig
from edge.front_h1 import Http1Connection
from edge.front_h2 import Http2Connection
from edge.http1 import request_head
from tests.conftest import run_async
from tests.edge_fakes import FakeClientTransport, FakeServices

STORED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nCache-Control: public, max-age=3600\r\n"
    b'ETag: "v1"\r\nSurrogate-Key: img logo\r\nConnection: keep-alive\r\n'
    b"Keep-Alive: timeout=5\r\nContent-Length: 5\r\n\r\nhello"
)
PER_REQUEST = re.compile(rb"(X-Request-Id: |age: |ttl=)[\w-]+")


def cache_services(*, hsts: bytes | None = None, compression: bool = False) -> FakeServices:
    cache = EdgeCache(
        CacheConfig(enabled=True), CompressionConfig(enabled=compression, min_bytes=1), "edge-test"
    )
    return FakeServices(cache=cache, hsts_field=hsts)


def request(method: str = "GET", path: str = "/logo.png", *extra: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: app.test", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def connect(services: FakeServices) -> tuple[Http1Connection, FakeClientTransport]:
    client = Http1Connection(services, trusted=False)
    transport = FakeClientTransport()
    client.connection_made(transport)
    return client, transport


def answer(services: FakeServices, data: bytes) -> bytes:
    client, transport = connect(services)
    client.data_received(data)
    assert not transport.closed
    return transport.take()


def stored(services: FakeServices, response: bytes = STORED, path: str = "/logo.png") -> None:
    """The first request goes up and fills the cache."""
    client, transport = connect(services)
    client.data_received(request("GET", path))
    services.streams[-1].respond(response)
    assert b"fwd=uri-miss; stored" in transport.take()


def normalised(data: bytes) -> bytes:
    return PER_REQUEST.sub(rb"\1*", data)


def count_admits(services: FakeServices) -> list[bytes]:
    """The paths of the requests the general path (EdgeCache.admit) takes from now on."""
    cache = services.cache
    admitted: list[bytes] = []
    admit = cache.admit

    def counted(exchange: Any, **options: Any) -> bool:
        admitted.append(exchange.request.target)
        return admit(exchange, **options)

    cache.admit = counted
    return admitted


@pytest.mark.parametrize("hsts", [None, b"Strict-Transport-Security: max-age=63072000"])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_plain_hit_is_the_general_paths_answer_octet_for_octet(
    method: str, hsts: bytes | None
) -> None:
    services = cache_services(hsts=hsts)
    stored(services)
    streams = len(services.streams)
    admitted = count_admits(services)
    plain = answer(services, request(method))
    assert admitted == []  # answered without an exchange
    general = answer(services, request(method, "/logo.png", "Pragma: x-general-path"))
    assert admitted == [b"/logo.png"]
    assert len(services.streams) == streams  # both from the cache
    assert normalised(plain) == normalised(general)
    assert plain.startswith(b"HTTP/1.1 200 OK\r\nX-Request-Id: req")
    assert b"cache-status: edge-test; hit; ttl=" in plain
    assert (b"hello" in plain) == (method == "GET")
    assert b"surrogate-key" not in plain.lower() and b"keep-alive" not in plain.lower()
    plain_log, general_log = services.logged[-2], services.logged[-1]
    assert plain_log[1] == len(plain) and general_log[1] == len(general)
    for record, _sent in (plain_log, general_log):
        assert (record.status, record.cache, record.outcome) == (200, "hit", "ok")
        assert (record.method, record.path, record.host) == (method, "/logo.png", "app.test")
        assert record.first_byte >= record.started > 0
    assert services.cache.counters.hits == 2


@pytest.mark.parametrize(
    ("extra", "status", "goes_up"),
    [
        ("Range: bytes=0-1", b"206", False),
        ('If-None-Match: "v1"', b"304", False),
        ("Authorization: Bearer x", b"200", False),
        ("Cache-Control: max-age=0", b"200", True),  # revalidated: 304 from the origin
    ],
)
def test_what_the_plain_path_leaves_to_the_exchange_still_gets_its_answer(
    extra: str, status: bytes, goes_up: bool
) -> None:
    services = cache_services()
    stored(services)
    streams = len(services.streams)
    client, transport = connect(services)
    client.data_received(request("GET", "/logo.png", extra))
    assert len(services.streams) == streams + goes_up
    if goes_up:
        services.streams[-1].respond(b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\n\r\n')
    assert transport.take().startswith(b"HTTP/1.1 " + status)


def test_a_client_that_asks_to_close_gets_the_hit_and_the_close() -> None:
    services = cache_services()
    stored(services)
    client, transport = connect(services)
    client.data_received(request("GET", "/logo.png", "Connection: close"))
    answered = transport.take()
    assert b"Connection: close\r\n" in answered and answered.endswith(b"\r\n\r\nhello")
    assert transport.closed and services.logged[-1][0].cache == "hit"


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_coded_hit_is_plain_once_its_coded_body_is_kept(method: str) -> None:
    services = cache_services(compression=True)
    text = STORED.replace(b"image/png", b"text/plain")
    stored(services, text, "/a.txt")
    admitted = count_admits(services)
    accepts = "Accept-Encoding: gzip, br;q=0.5"
    first = answer(services, request(method, "/a.txt", accepts))  # compresses, keeps it
    second = answer(services, request(method, "/a.txt", accepts))
    identity = answer(services, request(method, "/a.txt"))
    assert admitted == ([b"/a.txt"] if method == "GET" else [])
    assert normalised(first) == normalised(second)
    if method == "GET":
        assert b"content-encoding: gzip" in second and b'etag: W/"v1"' in second
        assert gzip.decompress(second.partition(b"\r\n\r\n")[2]) == b"hello"
    else:  # a HEAD is answered with the identity head, on either path
        assert normalised(second) == normalised(identity)
    assert b"content-encoding" not in identity and identity.endswith(
        b"\r\n\r\n" + (b"hello" if method == "GET" else b"")
    )
    assert b"vary: accept-encoding" in second.lower()


def test_a_plain_hit_never_makes_the_forwarded_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewrite into the head that goes up (forwarding fields, trace
    context) is made on first use: a request that goes up makes it once, a
    plain hit not at all."""
    made: list[bytes] = []
    rewrite = request_head._Rewrite.forwarded

    def counted(self: Any, event: Any) -> Any:
        made.append(event.target)
        return rewrite(self, event)

    monkeypatch.setattr(request_head._Rewrite, "forwarded", counted)
    services = cache_services()
    stored(services)
    assert made == [b"/logo.png"]
    hit = answer(services, request("GET"))
    assert b"cache-status: edge-test; hit" in hit
    assert made == [b"/logo.png"]
    answer(services, request("GET", "/logo.png", "Pragma: x-general-path"))
    assert made == [b"/logo.png", b"/logo.png"]  # an exchange reads it, once


@pytest.mark.parametrize(
    ("config", "vary"),
    [
        (CacheConfig(enabled=True, key=CacheKeyConfig(headers=("X-Forwarded-Proto",))), b""),
        (CacheConfig(enabled=True), b"Vary: X-Forwarded-Proto\r\n"),
        (CacheConfig(enabled=True), b"Vary: Accept-Language, Forwarded\r\n"),
    ],
)
def test_a_key_or_vary_naming_a_field_the_edge_sets_leaves_hits_to_the_general_path(
    config: CacheConfig, vary: bytes
) -> None:
    """A request's client_fields lack the fields the edge sets; when the key
    or the entry's Vary reads one, the general path (which sees the edge's
    value, never the client's) decides. The client's own X-Forwarded-Proto
    and Forwarded change nothing either way."""
    services = FakeServices(cache=EdgeCache(config, CompressionConfig(), "edge-test"))
    response = STORED.replace(b"Content-Length", vary + b"Content-Length", 1)
    stored(services, response)
    admitted = count_admits(services)
    spoofed = ("X-Forwarded-Proto: http", "Forwarded: for=1.2.3.4;proto=http")
    hit = answer(services, request("GET", "/logo.png", *spoofed))
    assert admitted == [b"/logo.png"]
    assert b"cache-status: edge-test; hit" in hit and hit.endswith(b"hello")


def test_a_stale_entry_is_not_a_plain_hit() -> None:
    services = cache_services()
    stored(services, STORED.replace(b"max-age=3600", b"max-age=0"))
    streams = len(services.streams)
    answer(services, request())
    assert len(services.streams) == streams + 1  # revalidated with the origin


def test_a_hit_pipelined_behind_a_request_that_went_up_keeps_its_place() -> None:
    services = cache_services()
    stored(services)
    client, transport = connect(services)
    client.data_received(request("GET", "/live") + request("GET", "/logo.png"))
    assert transport.take() == b""  # the hit waits for the answer before it
    services.streams[-1].respond(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlive")
    answered = transport.take()
    assert answered.index(b"\r\n\r\nlive") < answered.index(b"hit; ttl=")
    assert answered.endswith(b"\r\n\r\nhello") and not transport.closed
    live, hit = services.logged[-2], services.logged[-1]
    assert (live[0].path, hit[0].path, hit[0].cache) == ("/live", "/logo.png", "hit")
    assert live[1] + hit[1] == len(answered)


# -- HTTP/2 (each engine: tests/h2_engines.py) ----------------------------------------


async def _h2_answers(
    services: FakeServices, requests: list[list[tuple[bytes, bytes]]]
) -> list[tuple[list[tuple[bytes, bytes]], bytes]]:
    """Each request on its own stream of one connection, answered in turn:
    (the response's fields, its body) as an ``h2`` client reads them."""
    transport = FakeClientTransport()
    server = Http2Connection(services, trusted=False)
    server.connection_made(transport)
    client = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    client.initiate_connection()
    server.data_received(client.data_to_send())
    answers = []
    for index, fields in enumerate(requests):
        stream_id = 1 + 2 * index
        client.send_headers(stream_id, fields, end_stream=True)
        server.data_received(client.data_to_send())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        head: list[tuple[bytes, bytes]] = []
        body = b""
        for event in client.receive_data(transport.take()):
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
                head = list(event.headers)
            elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
                body += event.data
        server.data_received(client.data_to_send())
        answers.append((head, body))
    return answers


def _h2_request(method: bytes, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    base = [(b":method", method), (b":path", b"/logo.png"), (b":scheme", b"https")]
    return [*base, (b":authority", b"app.test"), *extra]


@pytest.mark.usefixtures("h2_engine")
@pytest.mark.parametrize("hsts", [None, b"Strict-Transport-Security: max-age=63072000"])
@pytest.mark.parametrize("method", [b"GET", b"HEAD"])
def test_an_http2_plain_hit_is_the_general_paths_answer(method: bytes, hsts: bytes | None) -> None:
    services = cache_services(hsts=hsts)
    stored(services)
    streams, logged = len(services.streams), len(services.logged)
    admitted = count_admits(services)
    general = (b"pragma", b"x-general-path")
    (plain, plain_body), (other, other_body) = run_async(
        _h2_answers(services, [_h2_request(method), _h2_request(method, general)])
    )
    assert admitted == [b"/logo.png"]  # the second only
    assert len(services.streams) == streams  # both from the cache
    per_request = {b"age", b"x-request-id"}

    def kept(fields: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return [(n, PER_REQUEST.sub(rb"\1*", v)) for n, v in fields if n not in per_request]

    assert kept(plain) == kept(other) and plain_body == other_body
    assert (b":status", b"200") in plain and (b"x-request-id", b"req0002") in plain
    assert (plain_body == b"hello") == (method == b"GET")
    assert [n for n, _ in plain].count(b"strict-transport-security") == (hsts is not None)
    records = [record for record, _ in services.logged[logged:]]
    assert [(r.protocol, r.status, r.cache, r.outcome) for r in records] == [
        ("h2", 200, "hit", "ok")
    ] * 2
    assert records[0].bytes_out == records[1].bytes_out > 0
