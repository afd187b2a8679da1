"""The edge's TLS transport (edge.tls_transport) on its own, with real TLS clients
on loopback: the asyncio contract, backpressure, handshake timeout and failure,
close_notify and the lingering close. The whole edge runs on it in the other
integration tests (SNI, resumption, 10 MB bodies, WebSockets, PROXY protocol)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from edge.listener import TlsListener
from edge.tls_transport import WRITE_HIGH_WATER
from tests.conftest import PkiFiles, run_async, scaled
from tests.polling import wait_until_async


class Recorder(asyncio.Protocol):
    """Records the callbacks it gets, in order; answers with ``reply`` once
    ``expect`` octets arrived, then closes when ``close_after_reply``."""

    def __init__(self, reply: bytes = b"", expect: int = 1, close_after_reply: bool = True):
        self.events: list[str] = []
        self.received = b""
        self.reply = reply
        self.expect = expect
        self.close_after_reply = close_after_reply
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()
        self.made = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.events.append("made")
        self.transport = transport  # type: ignore[assignment]
        self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.received += data
        if self.reply and len(self.received) >= self.expect and "replied" not in self.events:
            self.events.append("replied")
            assert self.transport is not None
            self.transport.write(self.reply)
            if self.close_after_reply:
                self.transport.close()

    def eof_received(self) -> bool | None:
        self.events.append("eof")
        return None

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost.set_result(exc)


def server_context(test_pki: PkiFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(test_pki.server.cert, test_pki.server.key)
    return context


def client_context(test_pki: PkiFiles) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(test_pki.ca))


def listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def test_a_request_and_a_reply_then_close_notify_and_lost_once(test_pki: PkiFiles) -> None:
    async def main() -> None:
        protocols: list[Recorder] = []
        sock = listening_socket()

        def factory() -> Recorder:
            protocols.append(Recorder(reply=b"pong", expect=4))
            return protocols[-1]

        listener = TlsListener(sock, server_context(test_pki), factory, 5.0)
        reader, writer = await asyncio.open_connection(
            *sock.getsockname(), ssl=client_context(test_pki), server_hostname="localhost"
        )
        writer.write(b"ping")
        assert await reader.read() == b"pong"  # then EOF: the server's close_notify
        assert reader.at_eof()
        writer.close()
        await protocols[0].lost
        assert protocols[0].events == ["made", "replied", "lost"]
        assert protocols[0].received == b"ping"
        listener.close()
        sock.close()

    run_async(main(), 20)


def test_the_client_closing_first_is_an_eof_then_a_close(test_pki: PkiFiles) -> None:
    async def main() -> None:
        protocols: list[Recorder] = []
        sock = listening_socket()
        listener = TlsListener(sock, server_context(test_pki), collecting(protocols), 5.0)
        _, writer = await asyncio.open_connection(
            *sock.getsockname(), ssl=client_context(test_pki), server_hostname="localhost"
        )
        writer.write(b"x")
        await writer.drain()
        writer.close()  # close_notify from the client
        await asyncio.wait_for(protocols[0].lost, scaled(5))
        assert protocols[0].events == ["made", "eof", "lost"]
        listener.close()
        sock.close()

    run_async(main(), 20)


def test_a_slow_reader_pauses_the_writer_and_gets_every_octet(test_pki: PkiFiles) -> None:
    payload = bytes(range(256)) * (4 * 1024 * 16)  # 16 MiB: far above the socket buffers

    async def main() -> None:
        protocols: list[Recorder] = []
        sock = listening_socket()

        def factory() -> Recorder:
            protocols.append(Recorder(reply=payload, expect=1))
            return protocols[-1]

        listener = TlsListener(sock, server_context(test_pki), factory, 5.0)
        reader, writer = await asyncio.open_connection(
            *sock.getsockname(), ssl=client_context(test_pki), server_hostname="localhost"
        )
        writer.write(b"go")
        # The server fills every buffer while nothing is read here: it pauses.
        await wait_until_async(
            lambda: protocols and "pause" in protocols[0].events, "the writer was never paused"
        )
        protocol = protocols[0]
        assert protocol.transport is not None
        assert protocol.transport.get_write_buffer_size() > WRITE_HIGH_WATER
        digest = hashlib.sha256()
        while chunk := await reader.read(1 << 20):
            digest.update(chunk)
        assert digest.digest() == hashlib.sha256(payload).digest()
        assert "resume" in protocol.events
        writer.close()
        await protocol.lost
        listener.close()
        sock.close()

    run_async(main(), 60)


def test_a_silent_client_is_cut_after_the_handshake_timeout(test_pki: PkiFiles) -> None:
    async def main() -> None:
        protocols: list[Recorder] = []
        sock = listening_socket()
        listener = TlsListener(sock, server_context(test_pki), collecting(protocols), 0.3)
        reader, writer = await asyncio.open_connection(*sock.getsockname())  # plain TCP, no hello
        started = time.monotonic()
        # Closed by the server (without the timeout: read() waits until wait_for fails).
        assert await asyncio.wait_for(reader.read(), scaled(10)) == b""
        assert time.monotonic() - started > 0.2  # not before it (load only adds)
        assert protocols[0].events == []  # never reached the protocol
        writer.close()
        listener.close()
        sock.close()

    run_async(main(), 20)


def test_a_failed_handshake_never_reaches_the_protocol(test_pki: PkiFiles) -> None:
    async def main() -> None:
        protocols: list[Recorder] = []
        sock = listening_socket()
        listener = TlsListener(sock, server_context(test_pki), collecting(protocols), 5.0)
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # plain HTTP on a TLS port
        try:  # closed (a reset when our bytes were still unread there): either way, gone
            leftover = await asyncio.wait_for(reader.read(), scaled(5))
        except ConnectionResetError:
            leftover = b""
        assert b"HTTP" not in leftover
        assert protocols[0].events == []
        writer.close()
        # The listener carries on.
        _, good = await asyncio.open_connection(
            *sock.getsockname(), ssl=client_context(test_pki), server_hostname="localhost"
        )
        await asyncio.wait_for(protocols[1].made, scaled(5))
        good.close()
        listener.close()
        sock.close()

    run_async(main(), 20)


def test_a_client_that_never_closes_is_cut_after_the_linger_time(test_pki: PkiFiles) -> None:
    async def main() -> None:
        protocols: list[Recorder] = []
        sock = listening_socket()

        def factory() -> Recorder:
            protocols.append(Recorder(reply=b"bye", expect=2))
            return protocols[-1]

        listener = TlsListener(sock, server_context(test_pki), factory, 5.0, linger_s=0.5)
        raw = socket.create_connection(sock.getsockname())
        raw.setblocking(False)
        # A TLS client that reads the reply, then never sends close_notify nor FIN.
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = client_context(test_pki).wrap_bio(incoming, outgoing, server_hostname="localhost")
        loop = asyncio.get_running_loop()

        async def pump() -> bytes:
            data = await loop.sock_recv(raw, 65536)
            incoming.write(data) if data else incoming.write_eof()
            return data

        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await loop.sock_sendall(raw, outgoing.read())
                await pump()
        tls.write(b"hi")
        await loop.sock_sendall(raw, outgoing.read())
        await asyncio.wait_for(protocols[0].made, scaled(5))
        started = time.monotonic()
        lost = protocols[0].lost
        while not lost.done():  # the reply and close_notify arrive; we never answer
            if not await asyncio.wait_for(pump(), scaled(5)):
                break
        await asyncio.wait_for(lost, scaled(5))
        assert time.monotonic() - started >= 0.4
        assert protocols[0].events == ["made", "replied", "lost"]
        raw.close()
        listener.close()
        sock.close()

    run_async(main(), 20)


class Pump(asyncio.Protocol):
    """Sends ``body`` the way the edge relays a response: a piece at a time while
    the transport is not paused, the rest from ``resume_writing``, and ``close()``
    right after the last piece (a ``Connection: close`` response)."""

    PIECE = 16 * 1024

    def __init__(self, body: bytes, sndbuf: int = 0) -> None:
        self.body = body
        self.sndbuf = sndbuf
        self.offset = 0
        self.paused = False
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.sndbuf:  # a small send buffer: the socket fills as a long link's does
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)

    def data_received(self, data: bytes) -> None:
        if self.offset == 0:
            self.pump()

    def pump(self) -> None:
        assert self.transport is not None
        while not self.paused and self.offset < len(self.body):
            self.transport.write(self.body[self.offset : self.offset + self.PIECE])
            self.offset += self.PIECE
        if self.offset >= len(self.body):
            self.transport.close()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(exc)


def read_to_close_notify(
    port: int, test_pki: PkiFiles, version: ssl.TLSVersion, pause_s: float
) -> tuple[bytes, str]:
    """A blocking ``ssl`` client (as in the issue) that reads until the connection
    ends; how it ended: "close_notify", or the error of a ragged end."""
    context = client_context(test_pki)
    context.minimum_version = context.maximum_version = version
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    with context.wrap_socket(raw, server_hostname="localhost", suppress_ragged_eofs=False) as tls:
        tls.sendall(b"go")
        received = bytearray()
        while True:
            if pause_s:
                time.sleep(pause_s)
            try:
                chunk = tls.recv(65536)
            except (ssl.SSLError, OSError) as exc:
                return bytes(received), f"{type(exc).__name__}: {exc}"
            if not chunk:
                return bytes(received), "close_notify"
            received += chunk


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
@pytest.mark.parametrize("pause_s", [0.0, 0.002])
def test_a_close_made_from_resume_writing_comes_after_the_last_byte(
    test_pki: PkiFiles, version: ssl.TLSVersion, pause_s: float
) -> None:
    """The truncation behind ``Connection: close`` responses over a long link: the
    protocol's ``close()`` from inside ``resume_writing`` used to shut down with the
    last pieces still queued, and the linger timer dropped them with a ragged end."""
    body = os.urandom(768 * 1024)

    async def main() -> None:
        pumps: list[Pump] = []
        sock = listening_socket()

        def factory() -> Pump:
            pumps.append(Pump(body, sndbuf=32 * 1024))
            return pumps[-1]

        # A linger far longer than any run: the end must not wait for its timer.
        linger_s = 120.0
        listener = TlsListener(sock, server_context(test_pki), factory, 5.0, linger_s=linger_s)
        loop = asyncio.get_running_loop()
        port = sock.getsockname()[1]
        for _ in range(3):
            started = time.monotonic()
            received, ending = await loop.run_in_executor(
                None, read_to_close_notify, port, test_pki, version, pause_s
            )
            assert (len(received), ending) == (len(body), "close_notify")
            assert hashlib.sha256(received).digest() == hashlib.sha256(body).digest()
            assert time.monotonic() - started < linger_s / 4  # not released by the linger timer
            assert await asyncio.wait_for(pumps[-1].lost, scaled(10)) is None
            assert pumps[-1].transport.bytes_sent == len(body)  # type: ignore[union-attr]
        listener.close()
        sock.close()

    run_async(main(), 90)


def test_a_client_that_stops_reading_is_cut_after_the_send_timeout(test_pki: PkiFiles) -> None:
    body = os.urandom(16 * 1024 * 1024)

    async def main() -> None:
        pumps: list[Pump] = []
        sock = listening_socket()

        def factory() -> Pump:
            pumps.append(Pump(body))
            return pumps[-1]

        listener = TlsListener(sock, server_context(test_pki), factory, 5.0, send_timeout_s=0.5)
        _, writer = await asyncio.open_connection(
            *sock.getsockname(), ssl=client_context(test_pki), server_hostname="localhost"
        )
        writer.transport.pause_reading()  # type: ignore[attr-defined]
        writer.write(b"go")
        exc = await asyncio.wait_for(pumps[0].lost, scaled(10))
        assert isinstance(exc, TimeoutError)
        sent = pumps[0].transport.bytes_sent  # type: ignore[union-attr]
        assert 0 < sent < len(body)  # what the kernel took, not what was queued
        writer.close()
        listener.close()
        sock.close()

    run_async(main(), 30)


def collecting(protocols: list[Recorder]) -> Callable[[], Recorder]:
    """A protocol factory that keeps every protocol it makes."""

    def factory() -> Recorder:
        protocols.append(Recorder())
        return protocols[-1]

    return factory


@pytest.mark.parametrize("end", ["client_fin", "client_rst", "server_abort"])
def test_tls12_sessions_outlive_connections_that_end_without_close_notify(
    test_pki: PkiFiles, end: str
) -> None:
    """OpenSSL evicts the session of a connection that ends in a fatal error or
    is freed without a close_notify exchange. The edge's context and transport
    keep it: each connection here resumes the first one's session ID, with the
    previous connection freed (``gc.collect``) before the next handshake."""
    from edge.config import CertificateConfig, TlsConfig
    from edge.tls import CertificateStore

    store = CertificateStore(
        TlsConfig(certificates=(CertificateConfig(test_pki.server.cert, test_pki.server.key),))
    )
    client = client_context(test_pki)
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    client.options |= ssl.OP_NO_TICKET  # the session-ID cache only

    def exchange(address: tuple[str, int], session: ssl.SSLSession | None) -> tuple[bool, Any]:
        raw = socket.create_connection(address, timeout=scaled(10))
        tls = client.wrap_socket(raw, server_hostname="localhost", session=session)
        tls.sendall(b"ping")
        assert tls.recv(4) == b"pong"
        reused, session = tls.session_reused, tls.session
        if end == "client_fin":
            tls.shutdown(socket.SHUT_RDWR)
        elif end == "client_rst":
            tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            with contextlib.suppress(ssl.SSLError, OSError):
                tls.recv(1)  # the server's abort: an EOF without close_notify
        tls.close()
        return reused, session

    async def main() -> int:
        protocols: list[Recorder] = []
        sock = listening_socket()

        def factory() -> Recorder:
            protocols.append(Recorder(reply=b"pong", expect=4, close_after_reply=False))
            return protocols[-1]

        listener = TlsListener(sock, store.context, factory, 5.0)
        loop = asyncio.get_running_loop()
        address = sock.getsockname()
        session = None
        resumed = 0
        for i in range(6):
            task = loop.run_in_executor(None, exchange, address, session)
            if end == "server_abort":
                while len(protocols) <= i or "replied" not in protocols[i].events:
                    await asyncio.sleep(0.01)
                protocols[i].transport.abort()  # type: ignore[union-attr]
            reused, first = await task
            await asyncio.wait_for(protocols[i].lost, scaled(5))
            protocols[i] = Recorder()  # drops the transport (and the error's traceback)
            await asyncio.sleep(0)  # the transport's own last callbacks
            gc.collect()  # frees the server's SSL object: this is when OpenSSL evicts
            assert not [o for o in gc.get_objects() if type(o).__name__ == "TlsServerTransport"]
            if session is None:
                session = first
            else:
                resumed += reused
        listener.close()
        sock.close()
        return resumed

    assert run_async(main(), 30) == 5
