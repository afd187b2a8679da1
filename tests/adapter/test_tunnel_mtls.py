"""The tunnel over real sockets and real mutual TLS 1.3 on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import ssl

import pytest

from tests.conftest import PkiFiles, run_async, scaled
from tests.polling import wait_until_async
from tests.tunnel_env import (
    connect,
    dial_config,
    listener_config,
    open_io,
    start_server,
)
from tunnel.aio.errors import StreamResetError, TunnelHandshakeError
from tunnel.aio.stream import StreamIO
from tunnel.mux import ErrorCode, SessionConfig, StreamMetadata


async def hash_echo(io: StreamIO) -> None:
    """Read everything, then answer sha256(upload) + a payload + its sha256."""
    upload = await io.read_all()
    seed = int.from_bytes(hashlib.sha256(upload).digest()[:4], "big")
    payload = random.Random(seed).randbytes(seed % 65536 + 1)
    io.write(hashlib.sha256(upload).digest() + hashlib.sha256(payload).digest() + payload)
    await io.drain()
    io.write_eof()


def test_thousand_concurrent_streams_sha256_both_ways(test_pki: PkiFiles) -> None:
    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), hash_echo)
        conn = await connect(dial_config(test_pki, server.port))
        assert conn.info.peer_identity == "origin-1"

        async def one(i: int) -> None:
            upload = os.urandom(random.Random(i).randrange(1, 48 * 1024))
            io = open_io(conn, client_address=("192.0.2.1", 1000 + i))
            io.write(upload)
            await io.drain()
            io.write_eof()
            reply = await io.read_all()
            assert reply[:32] == hashlib.sha256(upload).digest()
            assert hashlib.sha256(reply[64:]).digest() == reply[32:64]

        await asyncio.gather(*(one(i) for i in range(1000)))
        assert server.connections[0].info.peer_identity == "edge-1"
        stats = conn.session.statistics()
        assert stats.streams_opened_total == 1000
        assert stats.streams_open == 0
        conn.abort()
        await server.close()

    run_async(main(), timeout=60)


def test_stalled_reader_does_not_slow_siblings_and_stays_bounded(test_pki: PkiFiles) -> None:
    window = 256 * 1024
    session_config = SessionConfig(
        initial_stream_window_bytes=window, max_stream_window_bytes=window
    )
    bulk_sent = asyncio.Event()

    async def handler(io: StreamIO) -> None:
        kind = await io.readexactly(4)
        if kind == b"bulk":
            chunk = b"x" * 65536
            # Far more than the window: the writer must be held back by credit.
            for _ in range(64):
                io.write(chunk)
                await io.drain()
            bulk_sent.set()
        else:
            while request := await io.read(1024):
                io.write(request)

    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), handler, session_config)
        conn = await connect(dial_config(test_pki, server.port), session_config)
        bulk = open_io(conn)
        bulk.transport.pause_reading()  # type: ignore[union-attr]  # the reader stops
        bulk.write(b"bulk")
        recv_window = bulk.transport._connection.session._streams[1].recv_window  # type: ignore[union-attr]
        # Stalled: the peer sent the whole window (and the reader took none of it).
        await wait_until_async(lambda: recv_window.received >= window, "the window never filled")
        origin_session = server.connections[0].session
        buffered = origin_session.send_buffered(1)
        # The origin holds at most what it could not send plus one stream high-water mark.
        assert buffered <= 64 * 65536 - window
        assert recv_window.received == window, "peer sent more than the window"
        assert not bulk_sent.is_set()

        # Its siblings carry on: 50 round trips while it stays stalled. (How
        # fast they go beside a busy stream is a benchmark's figure: make
        # bench-tunnel's small_p99_under_bulk_ms.)
        ping = open_io(conn)
        ping.write(b"echo")
        for _ in range(50):
            ping.write(b"p" * 1000)
            assert await ping.readexactly(1000) == b"p" * 1000
        assert recv_window.received == window and not bulk_sent.is_set()
        bulk.transport.resume_reading()  # type: ignore[union-attr]
        received = 0
        while received < 64 * 65536:
            chunk = await bulk.read()
            assert chunk
            received += len(chunk)
        await asyncio.wait_for(bulk_sent.wait(), 5)
        conn.abort()
        await server.close()

    run_async(main(), timeout=30)


def test_unknown_ca_certificate_is_refused(test_pki: PkiFiles) -> None:
    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), hash_echo)
        rogue = dial_config(
            test_pki, server.port, cert=test_pki.rogue_edge.cert, key=test_pki.rogue_edge.key
        )
        with pytest.raises((ssl.SSLError, ConnectionError, OSError, TimeoutError)):
            conn = await connect(rogue)
            # TLS 1.3: the client may finish before the server's alert arrives.
            io = open_io(conn)
            io.write(b"x")
            io.write_eof()
            await io.read_all()
        assert not any(c.session.established for c in server.connections)
        await server.close()

    run_async(main(), timeout=20)


def test_identity_not_in_allowlist_is_refused_and_logged(
    test_pki: PkiFiles, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), hash_echo)
        other = dial_config(test_pki, server.port, cert=test_pki.edge2.cert, key=test_pki.edge2.key)
        with pytest.raises((ConnectionError, OSError, TimeoutError, Exception)):
            await connect(other)
        await server.close()

    with caplog.at_level(logging.WARNING, logger="geoedge.tunnel"):
        run_async(main(), timeout=20)
    assert "'edge-2' is not in allowed_identities" in caplog.text


def test_an_origin_certificate_is_refused_as_an_edge(
    test_pki: PkiFiles, caplog: pytest.LogCaptureFixture
) -> None:
    """Even with ``allowed_identities = ["*"]``: the role in the certificate
    decides which side it may play."""

    async def main() -> None:
        server = await start_server(
            listener_config(test_pki, 0, allowed_identities=("*",)), hash_echo
        )
        posing = dial_config(
            test_pki, server.port, cert=test_pki.origin.cert, key=test_pki.origin.key
        )
        with pytest.raises((TunnelHandshakeError, ConnectionError, OSError)):
            conn = await connect(posing)
            io = open_io(conn)  # TLS 1.3: the refusal may come after our handshake
            io.write(b"x")
            io.write_eof()
            await io.read_all()
        assert not any(c.session.established for c in server.connections)
        good = await connect(dial_config(test_pki, server.port))
        assert good.info.peer_identity == "origin-1"
        good.abort()
        await server.close()

    with caplog.at_level(logging.WARNING, logger="geoedge.tunnel"):
        run_async(main(), timeout=20)
    assert "certificate of 'origin-1' has role 'edge', expected role 'edge'" not in caplog.text
    assert "certificate of 'origin-1' has role 'origin', expected role 'edge'" in caplog.text


def test_the_edge_refuses_an_origin_presenting_an_edge_certificate(test_pki: PkiFiles) -> None:
    """The impostor's certificate is from our CA, names ``localhost`` (so the
    host name check passes) and even says ``origin-1``, but its role is edge."""

    async def main() -> None:
        server = await start_server(
            listener_config(
                test_pki,
                0,
                cert=test_pki.impostor_origin.cert,
                key=test_pki.impostor_origin.key,
            ),
            hash_echo,
        )
        with pytest.raises(TunnelHandshakeError, match="has role 'edge', expected role 'origin'"):
            await connect(dial_config(test_pki, server.port))
        await server.close()

    run_async(main(), timeout=20)


def test_plain_tcp_transport_checks_peer_cidr(test_pki: PkiFiles) -> None:
    import ipaddress

    async def main() -> None:
        ok = await start_server(
            listener_config(
                test_pki, 0, transport="tcp", allowed_peers=(ipaddress.ip_network("127.0.0.0/8"),)
            ),
            hash_echo,
        )
        conn = await connect(dial_config(test_pki, ok.port, transport="tcp"))
        io = open_io(conn)
        io.write(b"hello")
        io.write_eof()
        reply = await io.read_all()
        assert reply[:32] == hashlib.sha256(b"hello").digest()
        conn.abort()
        await ok.close()

        refused = await start_server(
            listener_config(
                test_pki,
                0,
                transport="tcp",
                allowed_peers=(ipaddress.ip_network("198.51.100.0/24"),),
            ),
            hash_echo,
        )
        with pytest.raises((ConnectionError, OSError, TimeoutError, Exception)):
            await connect(
                dial_config(test_pki, refused.port, transport="tcp", connect_timeout_s=2.0)
            )
        await refused.close()

    run_async(main(), timeout=20)


def test_peer_reset_reaches_the_stream(test_pki: PkiFiles) -> None:
    async def handler(io: StreamIO) -> None:
        await io.readexactly(1)
        io.abort(ErrorCode.CONNECT_FAILED)

    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), handler)
        conn = await connect(dial_config(test_pki, server.port))
        io = open_io(conn)
        io.write(b"x")
        with pytest.raises(StreamResetError) as info:
            await io.read_all()
        assert info.value.code == ErrorCode.CONNECT_FAILED and info.value.remote
        # The connection and other streams carry on.
        io2 = open_io(conn)
        io2.write(b"y")
        with pytest.raises(StreamResetError):
            await io2.read_all()
        assert conn.session.established and not conn.session.terminated
        conn.abort()
        await server.close()

    run_async(main(), timeout=20)


def test_credit_returned_by_a_resuming_reader_goes_out_at_once(test_pki: PkiFiles) -> None:
    """A reader that pauses and resumes outside a receive callback must not
    wait for a timer tick to hand the sender its credit back."""
    window = 64 * 1024
    session_config = SessionConfig(
        initial_stream_window_bytes=window,
        min_stream_window_bytes=window,
        max_stream_window_bytes=window,
        # No ping for the test's length: credit that waited for a timer tick
        # (a ping's write) would stall the transfer, and the test would fail by
        # its deadline instead of passing by a stopwatch.
        ping_interval_s=600.0,
        ping_timeout_s=1200.0,
    )
    total = 8 * 1024 * 1024

    async def sender(io: StreamIO) -> None:
        await io.readexactly(1)
        chunk = b"s" * 16384
        for _ in range(total // len(chunk)):
            io.write(chunk)
            await io.drain()
        io.write_eof()

    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), sender, session_config)
        conn = await connect(dial_config(test_pki, server.port), session_config)
        holder: list[StreamIO] = []
        # A small read limit makes the reader pause, so credit returns from read().
        conn.open_stream(
            StreamMetadata(), lambda: holder.append(StreamIO(read_limit=8192)) or holder[-1]
        )  # type: ignore[func-returns-value]
        io = holder[0]
        io.write(b"x")
        received = 0
        while chunk := await io.read(4096):  # small reads: credit returns from read()
            received += len(chunk)
            if received % (256 * 1024) < 4096:
                await asyncio.sleep(0.01)  # the reader lags: the whole window fills
        assert received == total  # 128 windows: each one's credit went out from read()
        conn.abort()
        await server.close()

    run_async(main(), timeout=60)


def test_drain_survives_a_cancelled_wait(test_pki: PkiFiles) -> None:
    reading = asyncio.Event()

    async def held_reader(io: StreamIO) -> None:
        await reading.wait()  # reads nothing until the first wait was cancelled
        await io.read_all()

    # Windows that do not grow: this test is about the drain. (A stream opened
    # while the peer's SETTINGS raising INITIAL_STREAM_WINDOW is in flight gets
    # no credit after its first window, a bug of its own; a slow RTT sample on
    # a busy machine raises the window, and this test hung on it.)
    fixed = SessionConfig(min_stream_window_bytes=256 * 1024, max_stream_window_bytes=256 * 1024)

    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), held_reader, fixed)
        conn = await connect(dial_config(test_pki, server.port), fixed)
        io = open_io(conn)
        for _ in range(64):
            io.write(b"w" * 65536)  # far above the stream's window and high-water mark
        # Nothing is read, so this wait cannot end but by its timeout: the
        # cancelled-wait path runs whatever the machine's speed.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(io.drain(), 0.01)
        reading.set()
        await asyncio.wait_for(io.drain(), scaled(10))  # must not raise CancelledError
        io.write_eof()
        conn.abort()
        await server.close()

    run_async(main(), timeout=30)
