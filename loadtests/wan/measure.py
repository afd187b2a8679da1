"""The measuring client: runs inside the emulator's ``user`` namespace and times requests.

``python -m loadtests.wan.measure agent`` reads one JSON batch per line on stdin
and answers each with one JSON line on stdout (the runner keeps a single agent
for the whole run, so no interpreter start-up lands between samples);
``python -m loadtests.wan.measure wait URL`` polls until a URL answers 200 (run in
the edge namespace for the edge's admin ``/healthz``) or a ``tcp://`` address
accepts.

What is timed (``time.perf_counter``, milliseconds):

* ``new``: from the start of ``connect()`` to the last byte of the response:
  TCP handshake, a full TLS handshake of the forced version, the request. A new
  ``SSLContext``-wrapped socket every time, never given a ``session``, so
  nothing is resumed (checked: a resumed session is an error);
* ``keepalive``: one connection is opened untimed, then each request on it is
  timed from the write to the last byte;
* ``ws``: the WebSocket open (connect start to the 101) and the first echo (one
  message round trip on the open socket), both per connection;
* ``burst``: ``burst`` ``new`` samples started at once, each timed on its own;
* ``page``: one page of 30 small GETs at once, over HTTP/2 when offered and
  answered, else 6 HTTP/1.1 connections (:mod:`loadtests.wan.page`);
* ``close``: a ``new`` sample whose request says ``Connection: close``: timed to
  the last byte of the body, which must then be followed by the server's
  close_notify (a ragged end is a failed sample). The client is a blocking
  ``ssl`` socket, as a script's or an old library's would be.

Every body is checked: its length against ``Content-Length`` (a short body is a
failed sample) and, for the sample app's pattern endpoints (``/large``,
``/bytes``: octet ``i`` is ``i % 251``), its content.

Why ``asyncio`` streams and a three-line response parser rather than an HTTP
client library: the timing must end at the response's last byte and begin at
``connect()``, with no connection pool, retries or proxy lookups in between;
the sample app always sends ``Content-Length``. WebSockets use the
``websockets`` library (the 101 is what it returns on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import uvloop

from loadtests.wan.page import load_page

__all__ = ["Batch", "main", "run_batch"]

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
KINDS = ("new", "keepalive", "ws", "burst", "close", "page")
ALPNS = ("http/1.1", "h2")
PATTERN_PATHS = ("/large", "/bytes")
PATTERN_MODULUS = 251
MAX_HEAD_BYTES = 64 * 1024
WS_MESSAGE = "geoedge wan echo"


class MeasureError(Exception):
    """A sample failed: wrong status, short body, wrong TLS version, resumption."""


@dataclass(frozen=True, slots=True)
class Batch:
    """One request from the runner: ``count`` samples of one kind against one target."""

    host: str
    port: int
    ca: str
    kind: str
    tls: str = "1.3"
    path: str = "/"
    count: int = 1
    burst: int = 20
    pause_s: float = 0.1
    timeout_s: float = 30.0
    rcvbuf: int = 0
    """Client receive buffer (SO_RCVBUF) for ``close`` samples; 0: the kernel's."""
    alpn: str = "http/1.1"
    """What the client offers first (``h2``: ``h2,http/1.1``, as a browser)."""
    resources: int = 30
    """``page``: requests in one page load (loadtests.wan.page)."""
    connections: int = 6
    """``page`` over HTTP/1.1: connections opened at once."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.tls not in TLS_VERSIONS:
            raise ValueError(f"tls must be one of {sorted(TLS_VERSIONS)}, got {self.tls!r}")
        if self.alpn not in ALPNS:
            raise ValueError(f"alpn must be one of {ALPNS}, got {self.alpn!r}")
        if not 1 <= self.resources <= 1000 or not 1 <= self.connections <= 100:
            raise ValueError("resources must be in 1..1000 and connections in 1..100")
        if not 1 <= self.count <= 10_000 or not 1 <= self.burst <= 1000:
            raise ValueError("count must be in 1..10000 and burst in 1..1000")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Batch:
        unknown = set(data) - set(cls.__slots__)
        if unknown:
            raise ValueError(f"unknown batch field(s): {', '.join(sorted(unknown))}")
        return cls(**data)


def client_context(ca: str, tls: str, alpn: str = "http/1.1") -> ssl.SSLContext:
    """A verifying client context pinned to one TLS version, offering ``alpn``
    (``h2``: ``h2,http/1.1``, as a browser)."""
    context = ssl.create_default_context(cafile=ca)
    context.minimum_version = context.maximum_version = TLS_VERSIONS[tls]
    context.set_alpn_protocols(["h2", "http/1.1"] if alpn == "h2" else ["http/1.1"])
    return context


def _ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000.0, 3)


def _request(batch: Batch, path: str | None = None, close: bool = False) -> bytes:
    connection = "Connection: close\r\n" if close else ""
    return (
        f"GET {path or batch.path} HTTP/1.1\r\nHost: {batch.host}\r\n"
        f"User-Agent: geoedge-wan-measure\r\nAccept: */*\r\n{connection}\r\n"
    ).encode()


def _content_length(head: bytes) -> int:
    """The Content-Length of a 200 response head (the app always sends one)."""
    if len(head) > MAX_HEAD_BYTES:
        raise MeasureError("response head too large")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or status[1] != "200":
        raise MeasureError(f"status line {lines[0]!r}")
    fields = (line.partition(":") for line in lines[1:])
    length = next((int(v) for k, _, v in fields if k.lower() == "content-length"), None)
    if length is None:
        raise MeasureError("response without Content-Length")
    return length


def check_body(path: str, body: bytes, length: int) -> None:
    """A short body, or a pattern body with a wrong octet, fails the sample."""
    if len(body) != length:
        raise MeasureError(f"short body: {len(body)} of {length} octets")
    if path.split("?", 1)[0] in PATTERN_PATHS and body != _pattern(length):
        first = next(i for i, octet in enumerate(body) if octet != i % PATTERN_MODULUS)
        raise MeasureError(f"body differs from the pattern at octet {first}")


_patterns: dict[int, bytes] = {}


def _pattern(length: int) -> bytes:
    if length not in _patterns:
        _patterns[length] = bytes(i % PATTERN_MODULUS for i in range(length))
    return _patterns[length]


async def _read_response(reader: asyncio.StreamReader, path: str) -> int:
    """Read one response whole and check it; return its body length."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = _content_length(head)
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        body = exc.partial
    check_body(path, body, length)
    return length


def get_and_close(
    host: str, port: int, context: ssl.SSLContext, request: bytes, path: str, rcvbuf: int
) -> tuple[float, float, int, Any]:
    """One blocking ``Connection: close`` GET: (connected ms, total ms to the last body
    octet, octets received in all, what was negotiated). Raises :class:`MeasureError`
    for a short or wrong body and for an end that is not a close_notify."""
    start = time.perf_counter()
    raw = socket.create_connection((host, port), timeout=30)
    if rcvbuf:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    with context.wrap_socket(raw, server_hostname=host, suppress_ragged_eofs=False) as tls:
        connected = _ms(start)
        version, cipher, alpn = tls.version(), tls.cipher(), tls.selected_alpn_protocol()
        negotiated = SimpleNamespace(
            version=lambda: version,
            cipher=lambda: cipher,
            selected_alpn_protocol=lambda: alpn,
            session_reused=tls.session_reused,
        )
        tls.sendall(request)
        data = bytearray()
        length = -1
        total = 0.0
        ending = "close_notify"
        while True:
            try:
                chunk = tls.recv(262144)
            except (ssl.SSLError, OSError) as exc:
                ending = f"ragged end ({type(exc).__name__}: {exc})"
                break
            if not chunk:
                break
            data += chunk
            if length < 0 and b"\r\n\r\n" in data:
                head_end = data.index(b"\r\n\r\n") + 4
                length = _content_length(bytes(data[:head_end]))
            if length >= 0 and not total and len(data) >= head_end + length:
                total = _ms(start)
        try:
            if length < 0:
                raise MeasureError(f"no response head ({ending})")
            check_body(path, bytes(data[head_end:]), length)
            if ending != "close_notify":
                raise MeasureError(ending)
        except MeasureError as exc:
            exc.received = len(data)  # type: ignore[attr-defined]
            raise
        return connected, total, len(data), negotiated


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        async with asyncio.timeout(2.0):
            await writer.wait_closed()
    except (TimeoutError, OSError, ssl.SSLError):
        pass


class BatchRun:
    """The samples, errors and negotiated TLS parameters of one batch."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.context = client_context(batch.ca, batch.tls, batch.alpn)
        self.series: dict[str, list[float]] = {}
        self.errors: list[str] = []
        self.negotiated: dict[str, str | None] | None = None
        self.samples_paths: list[tuple[str, int]] = []

    def check_tls(self, ssl_object: Any) -> None:
        """The forced version, no resumption; the first connection's parameters are kept
        (they show that both scenarios negotiate the same cipher)."""
        if ssl_object is None:
            raise MeasureError("not a TLS connection")
        if ssl_object.version() != f"TLSv{self.batch.tls}":
            raise MeasureError(f"negotiated {ssl_object.version()}, wanted TLSv{self.batch.tls}")
        if ssl_object.session_reused:
            raise MeasureError("the TLS session was resumed")
        if self.negotiated is None:
            self.negotiated = {
                "version": ssl_object.version(),
                "cipher": ssl_object.cipher()[0],
                "alpn": ssl_object.selected_alpn_protocol(),
            }

    def add(self, sample: dict[str, float]) -> None:
        for name, value in sample.items():
            self.series.setdefault(name, []).append(value)

    def fail(self, exc: BaseException) -> None:
        self.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        b = self.batch
        return await asyncio.open_connection(
            b.host, b.port, ssl=self.context, server_hostname=b.host
        )

    async def new_get(self) -> dict[str, float]:
        """One new connection and one GET: ``total_ms`` from connect start to the last byte."""
        start = time.perf_counter()
        reader, writer = await self._open()
        connected = _ms(start)
        try:
            self.check_tls(writer.get_extra_info("ssl_object"))
            writer.write(_request(self.batch))
            await _read_response(reader, self.batch.path)
            return {"total_ms": _ms(start), "connect_ms": connected}
        finally:
            await _close(writer)

    async def page(self) -> dict[str, float]:
        """One page of ``resources`` GETs at once (loadtests.wan.page)."""
        b = self.batch
        return await load_page(
            self._open, _read_response, host=b.host, path=b.path, alpn=b.alpn,
            resources=b.resources, connections=b.connections, check_tls=self.check_tls,
        )  # fmt: skip

    async def keepalive(self) -> None:
        """``count`` GETs on one connection opened beforehand (untimed, with one request)."""
        reader, writer = await self._open()
        try:
            self.check_tls(writer.get_extra_info("ssl_object"))
            writer.write(_request(self.batch))
            await _read_response(reader, self.batch.path)
            for _ in range(self.batch.count):
                await asyncio.sleep(self.batch.pause_s)
                start = time.perf_counter()
                writer.write(_request(self.batch))
                await _read_response(reader, self.batch.path)
                self.add({"total_ms": _ms(start)})
        finally:
            await _close(writer)

    async def close_get(self) -> dict[str, float]:
        """One ``Connection: close`` GET on a blocking socket (in a thread): each
        sample's path carries its number, so the runner can find its access-log
        line; ``received`` is what the client got, head included."""
        b = self.batch
        self._closes = getattr(self, "_closes", 0) + 1
        separator = "&" if "?" in b.path else "?"
        path = f"{b.path}{separator}wan_sample={os.getpid()}-{self._closes}"
        request = _request(b, path, close=True)
        try:
            connected, total, received, negotiated = await asyncio.to_thread(
                get_and_close, b.host, b.port, self.context, request, b.path, b.rcvbuf
            )
        except MeasureError as exc:  # failed, but what it got is still checked in the log
            self.samples_paths.append((path, getattr(exc, "received", 0)))
            raise
        self.check_tls(negotiated)
        self.samples_paths.append((path, received))
        return {"total_ms": total, "connect_ms": connected}

    async def ws_open_echo(self) -> dict[str, float]:
        """A WebSocket open (connect start to the 101) and its first echo."""
        from websockets.asyncio.client import connect

        b = self.batch
        url = f"wss://{b.host}:{b.port}{b.path}"
        start = time.perf_counter()
        ws = await connect(
            url, ssl=self.context, compression=None, proxy=None, open_timeout=None,
            max_size=1 << 20,
        )  # fmt: skip
        opened = _ms(start)
        try:
            self.check_tls(ws.transport.get_extra_info("ssl_object"))
            start = time.perf_counter()
            await ws.send(WS_MESSAGE)
            echoed = await ws.recv()
            echo_ms = _ms(start)
            if echoed != WS_MESSAGE:
                raise MeasureError(f"echo returned {echoed!r}")
        finally:
            await ws.close()
        return {"ws_open_ms": opened, "ws_echo_ms": echo_ms}

    async def _bounded(self, call: Awaitable[Any]) -> Any:
        async with asyncio.timeout(self.batch.timeout_s):
            return await call

    async def _sequential(self, one: Callable[[], Awaitable[dict[str, float]]]) -> None:
        for _ in range(self.batch.count):
            try:
                self.add(await self._bounded(one()))
            except Exception as exc:
                self.fail(exc)
            await asyncio.sleep(self.batch.pause_s)

    async def _bursts(self) -> None:
        for _ in range(self.batch.count):
            tasks = [self._bounded(self.new_get()) for _ in range(self.batch.burst)]
            for result in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(result, BaseException):
                    self.fail(result)
                else:
                    self.add(result)
            await asyncio.sleep(self.batch.pause_s)

    async def run(self) -> dict[str, Any]:
        """Take the samples; failed ones are listed under ``errors``, never retried."""
        kind = self.batch.kind
        if kind == "new":
            await self._sequential(self.new_get)
        elif kind == "close":
            await self._sequential(self.close_get)
        elif kind == "ws":
            await self._sequential(self.ws_open_echo)
        elif kind == "burst":
            await self._bursts()
        elif kind == "page":
            await self._sequential(self.page)
        else:
            try:
                await self._bounded(self.keepalive())
            except Exception as exc:
                self.fail(exc)
        return {
            "series": self.series,
            "errors": self.errors,
            "negotiated": self.negotiated,
            "received": self.samples_paths,
        }


async def run_batch(batch: Batch) -> dict[str, Any]:
    return await BatchRun(batch).run()


def _agent() -> int:
    """Answer batches from stdin until EOF (one JSON line in, one JSON line out)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                reply = runner.run(run_batch(Batch.from_json(json.loads(line))))
            except (ValueError, TypeError, OSError) as exc:
                reply = {"fatal": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    return 0


def wait_ready(url: str, timeout_s: float, ca: str | None = None) -> bool:
    """Poll ``url`` until it answers 200 (``http(s)://``) or accepts (``tcp://host:port``)."""
    parts = urlsplit(url)
    context = ssl.create_default_context(cafile=ca) if ca else None
    # No proxies from the environment: the URL is inside our own namespaces.
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if parts.scheme == "tcp":
                with socket.create_connection((parts.hostname, parts.port), timeout=1.0):
                    return True
            with opener.open(url, timeout=2.0) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.wan.measure", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("agent", help="answer JSON batches from stdin")
    wait = sub.add_parser("wait", help="poll a URL (http/https/tcp) until ready")
    wait.add_argument("url")
    wait.add_argument("--timeout", type=float, default=30.0)
    wait.add_argument("--ca", help="CA file for https")
    args = parser.parse_args(argv)
    if args.command == "agent":
        return _agent()
    if wait_ready(args.url, args.timeout, args.ca):
        return 0
    print(f"{args.url} not ready after {args.timeout} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
