"""The clients of ``make soak``: long-lived WebSockets, and short connections of
every kind an edge meets, including the ones that go wrong.

Each short kind is a coroutine function of a :class:`Target` that returns when
the exchange went as that kind expects and raises otherwise; :func:`run_short_mix`
runs a bounded number of them, kinds taken in turn, and counts the outcomes in a
:class:`Outcomes`. The kinds:

==========================  ==================================================
``get_close``               ``GET /ip`` with ``Connection: close``: 200, whole
``keepalive``               three ``GET /ip`` on one connection: 200 each
``tls12_get``               ``get_close`` over TLS 1.2 (session-ID cache path)
``large_then_vanish``       ``GET /large``, 64 KiB read, then a TCP reset: a
                            client that vanishes mid-response (the edge resets
                            the stream, the origin the backend connection)
``vanish_in_flight``        ``GET /slow``, reset before the answer
``head_cut_short``          half a request head, then a reset
``bad_request``             a malformed head: 400, then the edge closes
``handshake_then_vanish``   a ClientHello, the server's answer, then a reset
``tcp_only``                connect and close without a ClientHello
``not_tls``                 plain HTTP to the TLS port (a failed handshake)
==========================  ==================================================

WebSockets (:class:`WebSocketBatch`) are opened with bounded concurrency, each
echoes a message, they are held, echo again, and close: most with a close
handshake, every tenth by vanishing (a reset, no close frame).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import socket
import ssl
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from websockets.asyncio.client import ClientConnection, connect

_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]+)", re.IGNORECASE)
_MAX_HEAD = 64 * 1024


@dataclass(frozen=True, slots=True)
class Target:
    """The edge's TLS listener and how to trust it."""

    host: str
    port: int
    tls: ssl.SSLContext
    server_name: str = "localhost"
    timeout_s: float = 30.0


def client_context(ca: str | None = None) -> ssl.SSLContext:
    """Verifying ``ca`` when given; else accepting any certificate."""
    context = ssl.create_default_context(cafile=ca)
    if ca is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    return context


@dataclass
class Outcomes:
    """Per kind, how many went as expected and how many did not; the first few
    unexpected outcomes, for the report."""

    ok: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def record(self, kind: str, error: BaseException | None) -> None:
        if error is None:
            self.ok[kind] += 1
            return
        self.failed[kind] += 1
        if len(self.errors) < 10:
            self.errors.append(f"{kind}: {error!r}")

    @property
    def total_failed(self) -> int:
        return sum(self.failed.values())


# --------------------------------------------------------------------------- helpers


async def _open(
    target: Target, tls: ssl.SSLContext | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        target.host,
        target.port,
        ssl=tls or target.tls,
        server_hostname=target.server_name,
        ssl_handshake_timeout=target.timeout_s,
    )


async def _plain(target: Target) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(target.host, target.port)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Vanish: close with a TCP reset, no close_notify, no FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
    writer.transport.abort()


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response with a Content-Length: (status, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > _MAX_HEAD:
        raise RuntimeError("response head too long")
    status = int(head.split(b" ", 2)[1])
    length = _LENGTH.search(head)
    body = await reader.readexactly(int(length.group(1))) if length else b""
    return status, body


def _expect(status: int, wanted: int) -> None:
    if status != wanted:
        raise RuntimeError(f"status {status}, expected {wanted}")


# --------------------------------------------------------------------------- short kinds


async def get_close(target: Target, tls: ssl.SSLContext | None = None) -> None:
    reader, writer = await _open(target, tls)
    try:
        writer.write(b"GET /ip HTTP/1.1\r\nHost: soak.test\r\nConnection: close\r\n\r\n")
        status, body = await _response(reader)
        _expect(status, 200)
        if b'"backend"' not in body:
            raise RuntimeError(f"unexpected body {body[:80]!r}")
    finally:
        writer.close()


async def keepalive(target: Target) -> None:
    reader, writer = await _open(target)
    try:
        for _ in range(3):
            writer.write(b"GET /ip HTTP/1.1\r\nHost: soak.test\r\n\r\n")
            status, _ = await _response(reader)
            _expect(status, 200)
    finally:
        writer.close()


def _tls12_context(base: ssl.SSLContext) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = base.check_hostname
    context.verify_mode = base.verify_mode
    if base.verify_mode != ssl.CERT_NONE:
        context.load_verify_locations(cadata=_ca_data(base))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def _ca_data(context: ssl.SSLContext) -> str:
    return "".join(ssl.DER_cert_to_PEM_cert(der) for der in context.get_ca_certs(binary_form=True))


async def tls12_get(target: Target) -> None:
    await get_close(target, _tls12_context(target.tls))


async def large_then_vanish(target: Target) -> None:
    reader, writer = await _open(target)
    writer.write(b"GET /large HTTP/1.1\r\nHost: soak.test\r\n\r\n")
    try:
        await reader.readexactly(64 * 1024)
    finally:
        _reset(writer)


async def vanish_in_flight(target: Target) -> None:
    _, writer = await _open(target)
    writer.write(b"GET /slow?ms=2000 HTTP/1.1\r\nHost: soak.test\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(0.1)
    _reset(writer)


async def head_cut_short(target: Target) -> None:
    _, writer = await _open(target)
    writer.write(b"GET /ip HTTP/1.1\r\nHost: soak.test\r\nX-Cut: sho")
    await writer.drain()
    await asyncio.sleep(0.05)
    _reset(writer)


async def bad_request(target: Target) -> None:
    reader, writer = await _open(target)
    try:
        writer.write(b"GET /ip HTTP/1.1\r\nHost: soak.test\r\nBad Header\r\n\r\n")
        status, _ = await _response(reader)
        _expect(status, 400)
        if await reader.read() != b"":
            raise RuntimeError("the edge kept the connection open after a 400")
    finally:
        writer.close()


async def handshake_then_vanish(target: Target) -> None:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = target.tls.wrap_bio(incoming, outgoing, server_hostname=target.server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    reader, writer = await _plain(target)
    writer.write(outgoing.read())  # the ClientHello
    try:
        if not await asyncio.wait_for(reader.read(1), target.timeout_s):
            raise RuntimeError("no answer to the ClientHello")
    finally:
        _reset(writer)


async def tcp_only(target: Target) -> None:
    _, writer = await _plain(target)
    writer.close()


async def not_tls(target: Target) -> None:
    reader, writer = await _plain(target)
    writer.write(b"GET / HTTP/1.1\r\nHost: soak.test\r\n\r\n")
    try:
        with contextlib.suppress(ConnectionError):
            leftover = await asyncio.wait_for(reader.read(), target.timeout_s)
            if b"HTTP/" in leftover:
                raise RuntimeError("a TLS port answered plain HTTP")
    finally:
        writer.close()


ShortKind = Callable[[Target], Awaitable[None]]

SHORT_KINDS: dict[str, ShortKind] = {
    "get_close": get_close,
    "keepalive": keepalive,
    "tls12_get": tls12_get,
    "large_then_vanish": large_then_vanish,
    "vanish_in_flight": vanish_in_flight,
    "head_cut_short": head_cut_short,
    "bad_request": bad_request,
    "handshake_then_vanish": handshake_then_vanish,
    "tcp_only": tcp_only,
    "not_tls": not_tls,
}


async def run_short_mix(
    target: Target, count: int, concurrency: int, outcomes: Outcomes, *, start: int = 0
) -> None:
    """``count`` short connections, kinds taken in turn from ``start``, at most
    ``concurrency`` at once."""
    kinds = list(SHORT_KINDS.items())
    order = itertools.islice(itertools.cycle(kinds), start % len(kinds), start % len(kinds) + count)
    limit = asyncio.Semaphore(concurrency)

    async def one(kind: str, run: ShortKind) -> None:
        async with limit:
            try:
                async with asyncio.timeout(target.timeout_s):
                    await run(target)
            except Exception as exc:  # counted, never fatal to the run
                outcomes.record(kind, exc)
            else:
                outcomes.record(kind, None)

    await asyncio.gather(*(one(kind, run) for kind, run in order))


# --------------------------------------------------------------------------- WebSockets


class WebSocketBatch:
    """WebSockets to ``/ws``, opened together, held, and closed together."""

    def __init__(self, target: Target, outcomes: Outcomes) -> None:
        self.target = target
        self.outcomes = outcomes
        self.open: list[ClientConnection] = []

    async def open_many(self, count: int, concurrency: int) -> None:
        limit = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with limit:
                try:
                    ws = await connect(
                        f"wss://{self.target.host}:{self.target.port}/ws",
                        ssl=self.target.tls,
                        server_hostname=self.target.server_name,
                        compression=None,
                        ping_interval=None,  # held means idle: no keepalive pings
                        open_timeout=self.target.timeout_s,
                        close_timeout=self.target.timeout_s,
                        max_queue=4,
                    )
                except Exception as exc:
                    self.outcomes.record("ws_open", exc)
                    return
                self.open.append(ws)
                await self._echo(ws, f"hello {i}", "ws_open")

        await asyncio.gather(*(one(i) for i in range(count)))

    async def echo_all(self, concurrency: int) -> None:
        limit = asyncio.Semaphore(concurrency)

        async def one(i: int, ws: ClientConnection) -> None:
            async with limit:
                await self._echo(ws, f"still here {i}", "ws_echo")

        await asyncio.gather(*(one(i, ws) for i, ws in enumerate(self.open)))

    async def _echo(self, ws: ClientConnection, message: str, kind: str) -> None:
        try:
            await ws.send(message)
            echoed = await asyncio.wait_for(ws.recv(), self.target.timeout_s)
            if echoed != message:
                raise RuntimeError(f"echo mismatch: {echoed!r}")
        except Exception as exc:
            self.outcomes.record(kind, exc)
        else:
            self.outcomes.record(kind, None)

    async def close_all(self, concurrency: int, vanish_every: int = 10) -> None:
        """Close handshakes, but every ``vanish_every``-th client vanishes (a reset)."""
        limit = asyncio.Semaphore(concurrency)

        async def one(i: int, ws: ClientConnection) -> None:
            async with limit:
                if vanish_every and i % vanish_every == vanish_every - 1:
                    sock = ws.transport.get_extra_info("socket")
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
                    ws.transport.abort()
                    self.outcomes.record("ws_vanish", None)
                    return
                try:
                    await ws.close()
                    if ws.close_code != 1000:
                        raise RuntimeError(f"closed with {ws.close_code}")
                except Exception as exc:
                    self.outcomes.record("ws_close", exc)
                else:
                    self.outcomes.record("ws_close", None)

        opened, self.open = self.open, []
        await asyncio.gather(*(one(i, ws) for i, ws in enumerate(opened)))
