"""origin.keepalive.IdleBackends with real backend connections (loopback TCP,
the origin's own BackendProtocol): LIFO takes, limits, deadlines, and a parked
connection that the backend talks on or closes is dropped at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from origin.forward import BackendProtocol, Splice
from origin.keepalive import IdleBackends
from tests.conftest import run_async
from tests.polling import wait_until_async

KEY = object()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def with_backend(
    body: Callable[
        [IdleBackends, Clock, Callable[[], Awaitable[BackendProtocol]], list], Awaitable[None]
    ],
) -> None:
    """A loopback 'backend' server whose accepted sockets the test can write to or
    close; ``connect()`` returns a connected BackendProtocol (as the origin makes)."""
    accepted: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append((reader, writer))

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    clock = Clock()

    async def connect() -> BackendProtocol:
        splice = Splice(lambda *_: None)
        _, protocol = await loop.create_connection(
            lambda: BackendProtocol(splice), "127.0.0.1", port
        )
        while len(accepted) < connects[0] + 1:
            await asyncio.sleep(0.005)
        connects[0] += 1
        return protocol

    connects = [0]
    try:
        await body(IdleBackends(loop, clock), clock, connect, accepted)
    finally:
        for _, writer in accepted:
            writer.close()
        server.close()


def test_takes_are_lifo_and_unpark() -> None:
    async def body(idle: IdleBackends, clock: Clock, connect, _accepted) -> None:  # type: ignore[no-untyped-def]
        a, b = await connect(), await connect()
        assert idle.park(KEY, a, clock.now + 3, limit=8)
        assert idle.park(KEY, b, clock.now + 3, limit=8)
        assert len(idle) == 2
        assert idle.take(KEY) is b
        assert idle.take(KEY) is a
        assert idle.take(KEY) is None and len(idle) == 0
        assert not a.parked and not a.transport.is_closing()
        assert idle.take(object()) is None  # another backend has none

    run_async(with_backend(body), 10)


def test_limit_and_past_deadlines_refuse_to_park() -> None:
    async def body(idle: IdleBackends, clock: Clock, connect, _accepted) -> None:  # type: ignore[no-untyped-def]
        a, b, c = await connect(), await connect(), await connect()
        assert idle.park(KEY, a, clock.now + 3, limit=1)
        assert not idle.park(KEY, b, clock.now + 3, limit=1)  # over the limit
        assert not idle.park(object(), c, clock.now, limit=8)  # already expired
        assert len(idle) == 1

    run_async(with_backend(body), 10)


def test_take_skips_and_closes_expired_connections() -> None:
    async def body(idle: IdleBackends, clock: Clock, connect, _accepted) -> None:  # type: ignore[no-untyped-def]
        old, new = await connect(), await connect()
        idle.park(KEY, old, clock.now + 1, limit=8)
        idle.park(KEY, new, clock.now + 1, limit=8)
        clock.now += 2
        assert idle.take(KEY) is None
        assert old.transport.is_closing() and new.transport.is_closing()
        assert len(idle) == 0

    run_async(with_backend(body), 10)


def test_backend_bytes_or_close_while_parked_drop_the_connection() -> None:
    async def body(idle: IdleBackends, clock: Clock, connect, accepted) -> None:  # type: ignore[no-untyped-def]
        talker, closer, quiet = await connect(), await connect(), await connect()
        for protocol in (talker, closer, quiet):
            idle.park(KEY, protocol, clock.now + 3, limit=8)
        accepted[0][1].write(b"HTTP/1.1 200 OK\r\n")  # unasked: a desync waiting to happen
        accepted[1][1].close()  # the backend's keep-alive timeout
        await wait_until_async(lambda: len(idle) == 1, "the parked connections stayed")
        assert talker.transport.is_closing() and closer.transport.is_closing()
        assert idle.take(KEY) is quiet

    run_async(with_backend(body), 10)


def test_the_sweep_closes_what_expired_and_close_all_the_rest() -> None:
    async def body(idle: IdleBackends, clock: Clock, connect, _accepted) -> None:  # type: ignore[no-untyped-def]
        short, long = await connect(), await connect()
        idle.park(KEY, short, clock.now + 1, limit=8)
        idle.park(object(), long, clock.now + 60, limit=8)
        clock.now += 2
        # The sweep (every SWEEP_INTERVAL_S) closed the expired one: then it
        # had looked at both, and kept the other.
        await wait_until_async(short.transport.is_closing, "the sweep did not run")
        assert not long.transport.is_closing()
        assert len(idle) == 1
        idle.close_all()
        assert long.transport.is_closing() and len(idle) == 0

    run_async(with_backend(body), 10)
