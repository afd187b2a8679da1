"""The edge's TLS transport (edge.tls_transport) on its own, with real TLS clients
on loopback: the asyncio contract, backpressure, handshake timeout and failure,
close_notify and the lingering close. The whole edge runs on it in the other
integration tests (SNI, resumption, 10 MB bodies, WebSockets, PROXY protocol)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import ssl
import time
from collections.abc import Callable

from edge.tls_transport import WRITE_HIGH_WATER, TlsListener
from tests.conftest import PkiFiles, run_async


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
        await asyncio.wait_for(protocols[0].lost, 5)
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
        await asyncio.sleep(0.3)  # let the server fill every buffer
        protocol = protocols[0]
        assert "pause" in protocol.events
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
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        assert 0.2 < time.monotonic() - started < 3
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
            leftover = await asyncio.wait_for(reader.read(), 5)
        except ConnectionResetError:
            leftover = b""
        assert b"HTTP" not in leftover
        assert protocols[0].events == []
        writer.close()
        # The listener carries on.
        _, good = await asyncio.open_connection(
            *sock.getsockname(), ssl=client_context(test_pki), server_hostname="localhost"
        )
        await asyncio.wait_for(protocols[1].made, 5)
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
        await asyncio.wait_for(protocols[0].made, 5)
        started = time.monotonic()
        lost = protocols[0].lost
        while not lost.done():  # the reply and close_notify arrive; we never answer
            if not await asyncio.wait_for(pump(), 5):
                break
        await asyncio.wait_for(lost, 5)
        assert time.monotonic() - started >= 0.4
        assert protocols[0].events == ["made", "replied", "lost"]
        raw.close()
        listener.close()
        sock.close()

    run_async(main(), 20)


def collecting(protocols: list[Recorder]) -> Callable[[], Recorder]:
    """A protocol factory that keeps every protocol it makes."""

    def factory() -> Recorder:
        protocols.append(Recorder())
        return protocols[-1]

    return factory
