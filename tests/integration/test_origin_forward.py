"""The splice between a tunnel stream and a backend connection, against raw
asyncio backends (real sockets, an origin in process, real mutual TLS):
half-close both ways, resets both ways, backpressure both ways, TCP_NODELAY."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.conftest import PkiFiles, run_async
from tests.integration.origin_harness import CLIENT, origin_config, origin_in_process, pool
from tests.polling import wait_until_async
from tests.tunnel_env import connect, dial_config, open_io
from tunnel.aio.errors import StreamResetError
from tunnel.aio.stream import StreamIO
from tunnel.mux import ErrorCode

MiB = 1024 * 1024


@dataclass
class Backend(asyncio.Protocol):
    """A scriptable backend: ``on_connect(self)`` decides what it does."""

    on_connect: Callable[[Backend], None]
    received: bytearray = field(default_factory=bytearray)
    eof: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Future[Exception | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.on_connect(self)

    def data_received(self, data: bytes) -> None:
        self.received += data

    def eof_received(self) -> bool:
        self.eof.set()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


async def backend_server(
    on_connect: Callable[[Backend], None],
) -> tuple[asyncio.Server, list[Backend]]:
    seen: list[Backend] = []

    def factory() -> Backend:
        seen.append(Backend(on_connect))
        return seen[-1]

    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
    return server, seen


async def origin_for(test_pki: PkiFiles, server: asyncio.Server) -> Any:
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    config = origin_config(test_pki, [pool([address], health=False)])
    return config, origin_in_process(config)


def port_of(config: Any) -> int:
    return int(config.tunnel_listener.address.rpartition(":")[2])


def test_half_close_both_ways(test_pki: PkiFiles) -> None:
    async def main() -> tuple[bytes, bytes, bytes]:
        server, seen = await backend_server(lambda b: b.transport.write(b"hello"))  # type: ignore[union-attr]
        config, origin_cm = await origin_for(test_pki, server)
        async with origin_cm:
            connection = await connect(dial_config(test_pki, port_of(config)))
            io = open_io(connection, client_address=CLIENT)
            assert await io.readexactly(5) == b"hello"
            backend = seen[0]
            backend.transport.write_eof()  # type: ignore[union-attr]  # backend done sending
            assert await io.read() == b""  # END_STREAM reached the edge...
            io.write(b"late request body")  # ...which can still send
            io.write_eof()
            await asyncio.wait_for(backend.eof.wait(), 5)
            late = bytes(backend.received)
            # the other order: the edge finishes first, the backend answers after
            io2 = open_io(connection, client_address=CLIENT)
            io2.write(b"x" * 100_000)
            io2.write_eof()
            while len(seen) < 2 or not seen[1].eof.is_set():
                await asyncio.sleep(0.01)
            seen[1].transport.write(b"got %d" % len(seen[1].received))  # type: ignore[union-attr]
            seen[1].transport.close()  # type: ignore[union-attr]
            answer = await asyncio.wait_for(io2.read_all(), 5)
            await asyncio.wait_for(io2.wait_closed(), 5)
            await asyncio.wait_for(io.wait_closed(), 5)
            connection.abort()
        server.close()
        return late, answer, b"hello"

    late, answer, _ = run_async(main(), 30)
    assert late == b"late request body"
    assert answer == b"hellogot 100000"


def test_backend_reset_resets_the_stream_with_upstream_reset(test_pki: PkiFiles) -> None:
    def reset(backend: Backend) -> None:
        sock = backend.transport.get_extra_info("socket")  # type: ignore[union-attr]
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        asyncio.get_running_loop().call_later(0.1, backend.transport.abort)  # type: ignore[union-attr]

    async def main() -> int:
        server, _ = await backend_server(reset)
        config, origin_cm = await origin_for(test_pki, server)
        async with origin_cm:
            connection = await connect(dial_config(test_pki, port_of(config)))
            io = open_io(connection, client_address=CLIENT)
            io.write(b"GET / HTTP/1.1\r\n\r\n")
            with pytest.raises(StreamResetError) as info:
                await asyncio.wait_for(io.read_all(), 5)
            connection.abort()
        server.close()
        return info.value.code

    assert run_async(main(), 30) == ErrorCode.UPSTREAM_RESET


def test_stream_reset_aborts_the_backend_connection(test_pki: PkiFiles) -> None:
    async def main() -> Exception | None:
        server, seen = await backend_server(lambda b: None)
        config, origin_cm = await origin_for(test_pki, server)
        async with origin_cm:
            connection = await connect(dial_config(test_pki, port_of(config)))
            io = open_io(connection, client_address=CLIENT)
            io.write(b"partial request")
            while not seen or not seen[0].received:
                await asyncio.sleep(0.01)
            io.abort()
            lost = await asyncio.wait_for(seen[0].lost, 5)
            connection.abort()
        server.close()
        return lost

    lost = run_async(main(), 30)
    assert isinstance(lost, ConnectionResetError)  # an abort (RST), not a clean FIN


def test_a_backend_that_does_not_read_stops_the_edge(test_pki: PkiFiles) -> None:
    """Edge -> backend backpressure: the edge's sender runs out of credit."""
    total = 96 * MiB
    chunk = b"u" * (256 * 1024)

    async def main() -> tuple[int, int, bool]:
        # Paused one loop turn later: uvloop starts reading *after* connection_made
        # returns, undoing a pause_reading() made inside it.
        server, seen = await backend_server(
            lambda b: asyncio.get_running_loop().call_soon(b.transport.pause_reading)  # type: ignore[union-attr]
        )
        config, origin_cm = await origin_for(test_pki, server)
        async with origin_cm as origin:
            connection = await connect(dial_config(test_pki, port_of(config)))
            io = open_io(connection, client_address=CLIENT)
            sent = 0
            while sent < total:
                io.write(chunk)
                sent += len(chunk)
                try:
                    await asyncio.wait_for(asyncio.shield(io.drain()), 0.5)
                except TimeoutError:
                    break  # blocked: backpressure reached the edge
            blocked_at = sent
            (splice,) = origin.worker.splices()
            nodelay = splice.backend.get_extra_info("socket").getsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY
            )
            buffered = splice.backend.get_write_buffer_size()
            seen[0].transport.resume_reading()  # type: ignore[union-attr]
            while sent < total:
                io.write(chunk)
                sent += len(chunk)
                await asyncio.wait_for(io.drain(), 10)
            io.write_eof()
            await asyncio.wait_for(seen[0].eof.wait(), 20)
            received = len(seen[0].received)
            connection.abort()
        server.close()
        return blocked_at, received, bool(nodelay) and buffered <= 2 * MiB

    blocked_at, received, ok = run_async(main(), 60)
    assert blocked_at < 64 * MiB  # stopped well short of 96 MiB
    assert received == total
    assert ok  # TCP_NODELAY on, and the origin buffered little for the backend


def test_an_edge_that_does_not_read_stops_the_backend(test_pki: PkiFiles) -> None:
    """Backend -> edge backpressure: the origin stops reading the backend."""
    total = 96 * MiB
    chunk = b"d" * (1024 * 1024)

    def blast(backend: Backend) -> None:
        for _ in range(total // len(chunk)):
            backend.transport.write(chunk)  # type: ignore[union-attr]
        backend.transport.write_eof()  # type: ignore[union-attr]

    async def main() -> tuple[int, int]:
        server, seen = await backend_server(blast)
        config, origin_cm = await origin_for(test_pki, server)
        async with origin_cm:
            connection = await connect(dial_config(test_pki, port_of(config)))
            ios: list[StreamIO] = []
            metadata: dict[str, object] = {"client_address": CLIENT}
            io = open_io(connection, **metadata)
            ios.append(io)
            io.write(b"go")
            # The edge reads nothing meanwhile: wait until the flow out of the
            # backend has stopped (its buffer the same across 0.2 s), whatever
            # the machine's speed; without backpressure that is when all of it
            # has gone, and the buffer is empty.
            await wait_until_async(lambda: seen, "the backend was never reached")
            backend = seen[0].transport
            assert backend is not None

            async def flow_stopped() -> bool:
                before = backend.get_write_buffer_size()
                await asyncio.sleep(0.2)
                return backend.get_write_buffer_size() == before

            await wait_until_async(flow_stopped, "the backend's output never settled")
            stuck = backend.get_write_buffer_size()
            received = 0
            while chunk_in := await asyncio.wait_for(io.read(), 10):
                received += len(chunk_in)
            connection.abort()
        server.close()
        return stuck, received

    stuck, received = run_async(main(), 60)
    assert stuck > 32 * MiB  # most of it is still in the backend's own buffer
    assert received == total
