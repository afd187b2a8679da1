"""Dead-peer detection and reconnection over real sockets and real mutual TLS.

A relay between the two ends can *freeze* a connection: it stops forwarding
without closing anything, as a dead path or a crashed host looks from the
other side (no FIN, no RST). Only the tunnel's PING timeout can notice that.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from tests.conftest import PkiFiles, run_async, scaled
from tests.polling import wait_until_async
from tests.tunnel_env import dial_config, listener_config, start_server
from tunnel.aio.errors import StreamResetError
from tunnel.aio.pool import TunnelPool
from tunnel.aio.stream import StreamIO
from tunnel.aio.transport import dial_tunnel
from tunnel.mux import ErrorCode, SessionConfig, StreamMetadata
from tunnel.policy import Backoff

FAST_PING = SessionConfig(ping_interval_s=0.2, ping_timeout_s=1.0)


class FreezableRelay:
    """TCP relay; :meth:`freeze` stops forwarding on every current connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.frozen: list[asyncio.Event] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frozen = asyncio.Event()
        self.frozen.append(frozen)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    if frozen.is_set():
                        await asyncio.Event().wait()  # hold everything, close nothing
                    dst.write(data)
                    await dst.drain()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def freeze(self) -> None:
        for event in self.frozen:
            event.set()

    def close(self) -> None:
        assert self.server is not None
        self.server.close()


async def bulk_writer(io: StreamIO) -> None:
    """Send forever (until the stream dies)."""
    chunk = b"z" * 16384
    with contextlib.suppress(ConnectionError, StreamResetError):
        while True:
            io.write(chunk)
            await io.drain()


def test_cut_connection_errors_every_stream_within_ping_timeout_and_pool_redials(
    test_pki: PkiFiles,
) -> None:
    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), bulk_writer, FAST_PING)
        relay = FreezableRelay(server.port)
        await relay.start()
        config = dial_config(test_pki, relay.port, connect_timeout_s=2.0)

        async def dial(hint: int) -> object:
            return await dial_tunnel(config, FAST_PING, learned_window_hint=hint)

        pool = TunnelPool("origin", dial, size=1, backoff=Backoff(0.05, 0.2))  # type: ignore[arg-type]
        pool.start()
        await pool.wait_ready()
        first = pool.choose()
        ios: list[StreamIO] = []
        for _ in range(20):
            pool.open_stream(StreamMetadata(), lambda: ios.append(StreamIO()) or ios[-1])  # type: ignore[func-returns-value]
        for io in ios:
            io.write(b"go")
            assert await io.read(100)  # data flows on every stream

        relay.freeze()
        frozen_at = time.monotonic()

        async def wait_error(io: StreamIO) -> float:
            with contextlib.suppress(StreamResetError):
                while await io.read():
                    pass
            assert isinstance(io.exception, StreamResetError)
            assert io.exception.code == ErrorCode.TIMEOUT
            return time.monotonic() - frozen_at

        delays = await asyncio.gather(*(wait_error(io) for io in ios))
        # Declared dead by the PING timeout (the TIMEOUT code says which path),
        # 1 s after the last byte arrived plus a timer tick. The bound is the
        # point (not minutes, as TCP's own timers would take) but this loop
        # also runs the relay and the writer: five times the timeout, scaled.
        assert max(delays) < scaled(5 * FAST_PING.ping_timeout_s), delays

        def reconnected() -> bool:
            return pool.choose() not in (None, first)

        await wait_until_async(reconnected, "the pool did not reconnect")
        probe: list[StreamIO] = []
        pool.open_stream(StreamMetadata(), lambda: probe.append(StreamIO()) or probe[-1])  # type: ignore[func-returns-value]
        probe[0].write(b"go")
        assert await probe[0].read(100)
        await pool.close()
        relay.close()
        await server.close()

    run_async(main(), timeout=30)


def test_goaway_drains_in_flight_and_pool_moves_new_streams(test_pki: PkiFiles) -> None:
    arrived, answer = asyncio.Event(), asyncio.Event()

    async def handler(io: StreamIO) -> None:
        request = await io.read_all()
        arrived.set()
        await answer.wait()  # in flight while the GOAWAY goes out
        io.write(request[::-1])
        io.write_eof()

    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), handler)
        config = dial_config(test_pki, server.port)

        async def dial(hint: int) -> object:
            return await dial_tunnel(config, SessionConfig(), learned_window_hint=hint)

        pool = TunnelPool("origin", dial, size=1, backoff=Backoff(0.05, 0.2))  # type: ignore[arg-type]
        pool.start()
        await pool.wait_ready()
        first = pool.choose()
        ios: list[StreamIO] = []
        pool.open_stream(StreamMetadata(), lambda: ios.append(StreamIO()) or ios[-1])  # type: ignore[func-returns-value]
        ios[0].write(b"abc")
        ios[0].write_eof()
        await arrived.wait()  # the stream is open at the server: GOAWAY counts it in
        server.connections[0].go_away("deploy")
        answer.set()
        assert await ios[0].read_all() == b"cba"  # the in-flight stream finished
        await wait_until_async(
            lambda: pool.choose() not in (None, first), "new streams stayed on the old one"
        )
        await first.wait_closed()  # type: ignore[union-attr]
        pool.open_stream(StreamMetadata(), lambda: ios.append(StreamIO()) or ios[-1])  # type: ignore[func-returns-value]
        ios[1].write(b"xy")
        ios[1].write_eof()
        assert await ios[1].read_all() == b"yx"
        await pool.close()
        await server.close()

    run_async(main(), timeout=30)
