"""A pool of N tunnel connections to one remote, each kept up by a dial loop.

Each slot dials, waits until its connection is lost or the peer sends GOAWAY,
then dials again after a backoff with full jitter (:class:`tunnel.policy.Backoff`).
On GOAWAY the slot redials *at once* while the old connection drains its
in-flight streams, so new streams always have somewhere to go. New connections
are seeded with the largest stream window the pool has learned, so a reconnect
does not forget the path (IMPLEMENTATION.md §N7.4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tunnel.aio.connection import TunnelConnection
from tunnel.aio.errors import NoTunnelAvailable, TunnelError
from tunnel.aio.stream import TunnelStream
from tunnel.mux import ConnectionTerminated, GoAwayReceived, StreamMetadata
from tunnel.policy import Backoff, choose_connection

log = logging.getLogger("geoedge.tunnel")

Dialer = Callable[[int], Awaitable[TunnelConnection]]


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    name: str
    size: int
    connected: int
    usable: int
    warming: int
    """Of the usable ones, those still warming their window (tunnel.aio.warmup)."""
    open_streams: int
    srtt_s: float | None
    dials: int
    dial_failures: int
    learned_stream_window: int


class TunnelPool:
    def __init__(
        self,
        name: str,
        dial: Dialer,
        *,
        size: int = 2,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        on_usable: Callable[[], None] | None = None,
        on_goaway: Callable[[TunnelConnection], None] | None = None,
    ) -> None:
        """``on_usable``: called each time a new connection joins the pool (it can
        take streams then), e.g. to start streams that waited for one;
        ``on_goaway(connection)``: the peer told ``connection`` to go away (its
        streams may finish; long-lived ones had better move)."""
        self.name = name
        self._dial = dial
        self.size = size
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._connections: list[TunnelConnection] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._ready = asyncio.Event()
        self._dials = 0
        self._dial_failures = 0
        self._learned_window = 0
        self._on_usable = on_usable
        self._on_goaway = on_goaway

    def start(self) -> None:
        for slot in range(self.size):
            self._tasks.append(
                asyncio.create_task(self._run_slot(slot), name=f"{self.name}#{slot}")
            )

    async def _run_slot(self, slot: int) -> None:
        attempt = 0
        while not self._closing:
            self._dials += 1
            try:
                connection = await self._dial(self.learned_stream_window)
            except (TunnelError, OSError, TimeoutError) as exc:
                self._dial_failures += 1
                delay = self._backoff.delay(attempt, self._rng)
                attempt += 1
                if attempt & (attempt - 1) == 0:  # failures 1, 2, 4, 8...: a few lines an outage
                    log.warning(
                        "tunnel %s slot %d: dial failed %d time(s) in a row (%s); retry in %.2fs",
                        self.name,
                        slot,
                        attempt,
                        exc or type(exc).__name__,
                        delay,
                    )
                await asyncio.sleep(delay)
                continue
            # One line per connection that comes up: when a region's tunnel came
            # back (or first came up) is the first thing an operator looks for.
            info = connection.info
            log.info(
                "tunnel %s slot %d: up to %s at %s%s",
                self.name,
                slot,
                info.peer_identity or "?",
                f"{info.peer_address[0]}:{info.peer_address[1]}" if info.peer_address else "?",
                f" after {attempt} failed dial(s)" if attempt else "",
            )
            attempt = 0
            await self._hold(connection)

    async def _hold(self, connection: TunnelConnection) -> None:
        """Keep ``connection`` in the pool until it dies or is told to go away."""
        leaving = asyncio.Event()

        def on_event(conn: TunnelConnection, event: object) -> None:
            if isinstance(event, GoAwayReceived | ConnectionTerminated):
                leaving.set()
            if isinstance(event, GoAwayReceived) and self._on_goaway is not None:
                self._on_goaway(conn)

        connection.add_listener(on_event)
        self._connections.append(connection)
        connection.closed.add_done_callback(lambda _: self._forget(connection))
        self._ready.set()
        if self._on_usable is not None and connection.can_open_stream:
            self._on_usable()
        if connection.closed.done() or connection.goaway_received:
            leaving.set()
        await leaving.wait()
        self._learned_window = max(self._learned_window, connection.session.learned_stream_window)

    def _forget(self, connection: TunnelConnection) -> None:
        with contextlib.suppress(ValueError):
            self._connections.remove(connection)
        self._learned_window = max(self._learned_window, connection.session.learned_stream_window)
        if not self._connections:
            self._ready.clear()

    @property
    def learned_stream_window(self) -> int:
        windows = [c.session.learned_stream_window for c in self._connections]
        windows.append(self._learned_window)
        return max(windows)

    def choose(self) -> TunnelConnection | None:
        return choose_connection(self._connections)

    @property
    def usable(self) -> bool:
        return any(c.can_open_stream for c in self._connections)

    @property
    def srtt_s(self) -> float | None:
        samples = [c.srtt_s for c in self._connections if c.srtt_s is not None]
        return min(samples) if samples else None

    def open_stream(
        self,
        metadata: StreamMetadata | bytes,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
    ) -> TunnelStream:
        connection = self.choose()
        if connection is None:
            raise NoTunnelAvailable(f"no usable tunnel connection to {self.name}")
        return connection.open_stream(metadata, protocol_factory)

    async def wait_ready(self) -> None:
        """Until at least one connection is established."""
        while not self.usable:
            self._ready.clear()
            await self._ready.wait()

    async def close(self, *, drain_timeout_s: float = 0.0) -> None:
        """Stop redialing; GOAWAY every connection, let streams finish for up
        to ``drain_timeout_s``, then abort what is left. Idempotent."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        connections = list(self._connections)
        for connection in connections:
            connection.go_away("pool closing")
        if connections and drain_timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_timeout_s):
                    await asyncio.gather(*(c.wait_closed() for c in connections))
        for connection in connections:
            if not connection.closed.done():
                connection.abort("pool closed")

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            name=self.name,
            size=self.size,
            connected=len(self._connections),
            usable=sum(1 for c in self._connections if c.can_open_stream),
            warming=sum(1 for c in self._connections if c.can_open_stream and c.warming),
            open_streams=sum(c.open_streams for c in self._connections),
            srtt_s=self.srtt_s,
            dials=self._dials,
            dial_failures=self._dial_failures,
            learned_stream_window=self.learned_stream_window,
        )

    @property
    def connections(self) -> tuple[TunnelConnection, ...]:
        return tuple(self._connections)
