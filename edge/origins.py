"""The origins an edge can reach, each through its own pool of tunnel connections.

Which origin takes a new stream is a pure decision (:func:`choose_origin`):
only origins with a usable tunnel are candidates (health), the closest by
measured RTT wins, and origins within ``RTT_SLACK`` of the closest share new
streams by weight, so two origins in the same region both carry load while a
far one is only a fallback.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from edge.config import OriginConfig
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.control import ControlHandler
from tunnel.aio.errors import NoTunnelAvailable
from tunnel.aio.pool import PoolStatistics, TunnelPool
from tunnel.aio.stream import TunnelStream
from tunnel.aio.transport import TunnelDialConfig, dial_ssl_context, dial_tunnel
from tunnel.mux import SessionConfig, StreamMetadata
from tunnel.policy import Backoff

#: Origins whose RTT is within this factor (plus 2 ms) of the best share streams.
RTT_SLACK = 1.5


@dataclass(frozen=True, slots=True)
class OriginCandidate:
    name: str
    usable: bool
    srtt_s: float | None
    weight: int


def choose_origin(candidates: Sequence[OriginCandidate], rng: random.Random) -> str | None:
    """The origin for a new stream, or None when no tunnel is usable."""
    usable = [c for c in candidates if c.usable]
    if not usable:
        return None
    measured = [c.srtt_s for c in usable if c.srtt_s is not None]
    if measured:
        limit = min(measured) * RTT_SLACK + 0.002
        usable = [c for c in usable if c.srtt_s is None or c.srtt_s <= limit]
    if len(usable) == 1:
        return usable[0].name
    return rng.choices([c.name for c in usable], weights=[c.weight for c in usable])[0]


#: Requests one worker lets wait for a tunnel; past it they are answered at once.
MAX_TUNNEL_WAITERS = 10_000


class TunnelWaiter(Protocol):
    def tunnel_ready(self) -> None: ...


class OriginSet:
    """One :class:`TunnelPool` per configured origin, and the requests waiting
    for any of them to have a usable connection. Every connection answers the
    origins' CONTROL messages with ``control_handlers`` (:mod:`tunnel.aio.control`)."""

    def __init__(
        self,
        origins: Sequence[OriginConfig],
        session_config: SessionConfig,
        control_handlers: Mapping[int, ControlHandler] | None = None,
        on_goaway: Callable[[TunnelConnection], None] | None = None,
    ) -> None:
        """``on_goaway(connection)``: an origin told a tunnel connection to go away."""
        self._configs = {o.name: o for o in origins}
        self._rng = random.Random()
        self._waiters: dict[TunnelWaiter, None] = {}  # insertion-ordered: first come, first served
        self.pools: dict[str, TunnelPool] = {}
        for origin in origins:
            dial_config = origin.tunnel
            ssl_context = dial_ssl_context(dial_config)

            async def dial(
                hint: int,
                _c: TunnelDialConfig = dial_config,
                _s: ssl.SSLContext | None = ssl_context,
            ) -> TunnelConnection:
                return await dial_tunnel(
                    _c,
                    session_config,
                    ssl_context=_s,
                    learned_window_hint=hint,
                    control_handlers=control_handlers,
                )

            self.pools[origin.name] = TunnelPool(
                origin.name,
                dial,
                size=dial_config.connections,
                backoff=Backoff(dial_config.backoff_base_s, dial_config.backoff_cap_s),
                on_usable=self._tunnel_usable,
                on_goaway=on_goaway,
            )

    def start(self) -> None:
        for pool in self.pools.values():
            pool.start()

    def candidates(self) -> list[OriginCandidate]:
        return [
            OriginCandidate(name, pool.usable, pool.srtt_s, self._configs[name].weight)
            for name, pool in self.pools.items()
        ]

    def open_stream(
        self, metadata: StreamMetadata | bytes, factory: Callable[[], asyncio.BaseProtocol]
    ) -> tuple[str, TunnelStream]:
        pools = self.pools
        if len(pools) == 1:  # the common single-origin edge: nothing to choose
            # The pool's own choice says whether it has a usable connection
            # (NoTunnelAvailable when not): asking first walked its connections twice.
            name = next(iter(pools))
            return name, pools[name].open_stream(metadata, factory)
        chosen = choose_origin(self.candidates(), self._rng)
        if chosen is None:
            raise NoTunnelAvailable("no usable tunnel to any origin")
        return chosen, pools[chosen].open_stream(metadata, factory)

    def wait_for_tunnel(self, waiter: TunnelWaiter) -> bool:
        """Call ``waiter.tunnel_ready()`` when a tunnel connection becomes usable;
        False when too many are waiting already."""
        if len(self._waiters) >= MAX_TUNNEL_WAITERS and waiter not in self._waiters:
            return False
        self._waiters[waiter] = None
        return True

    def stop_waiting(self, waiter: TunnelWaiter) -> None:
        self._waiters.pop(waiter, None)

    def _tunnel_usable(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters:
            waiter.tunnel_ready()

    @property
    def any_usable(self) -> bool:
        return any(pool.usable for pool in self.pools.values())

    @property
    def any_warm(self) -> bool:
        """Some origin has a usable connection done warming its window."""
        return any(
            connection.can_open_stream and not connection.warming
            for pool in self.pools.values()
            for connection in pool.connections
        )

    async def wait_ready(self) -> None:
        await asyncio.wait(
            [asyncio.ensure_future(p.wait_ready()) for p in self.pools.values()],
            return_when=asyncio.FIRST_COMPLETED,
        )

    def statistics(self) -> list[PoolStatistics]:
        return [pool.statistics() for pool in self.pools.values()]

    async def close(self, drain_timeout_s: float = 0.0) -> None:
        await asyncio.gather(
            *(p.close(drain_timeout_s=drain_timeout_s) for p in self.pools.values())
        )
