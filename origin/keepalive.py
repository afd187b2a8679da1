"""Idle backend connections kept for the next stream (HTTP keep-alive reuse).

Why: without reuse every stream costs a TCP connect to the backend and a close,
and Node.js pays for an accept, a socket object and its teardown. On the
``make bench-edge`` handshake run (one short client connection per request)
that was about a third of the server CPU per connection. cloudflared and
HAProxy keep backend connections alive between requests for the same reason.

When is a connection reusable? The origin does not parse HTTP, so it relies on
the edge, which parses both directions: the edge ends a stream with RESET
``IDLE`` (PROTOCOL.md §9) only between exchanges, when every request it sent
was answered in full and both sides kept the connection alive. The origin adds
the checks only it can make (:meth:`origin.dispatch.StreamDispatcher.park`): the
backend has not closed its side, nothing is still queued to it, the pool sends
no PROXY header (that header is per client), and the backend is still
eligible.

A parked connection is closed when it has been quiet for the pool's
``keepalive_timeout_s`` (counted from the backend's last byte, which is when
Node.js starts its own ``keepAliveTimeout``), and at once if the backend sends
anything or closes (:class:`origin.forward.BackendProtocol`). Taking is LIFO:
the most recently used connection is the furthest from its timeout, and the
oldest ones age out.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["IdleBackends", "Parkable"]

#: How often expired idle connections are closed (while any are parked).
SWEEP_INTERVAL_S = 0.5


class Parkable(Protocol):
    """A backend connection that can wait here between streams
    (:class:`origin.forward.BackendProtocol`)."""

    @property
    def deadline(self) -> float:
        """When it is closed if nobody took it."""

    def park(self, forget: Callable[[Parkable], None], deadline: float) -> None:
        """It is parked: if it closes meanwhile, it calls ``forget(self)``."""

    def unpark(self) -> bool:
        """It is taken: False if it died meanwhile."""

    def close_parked(self) -> None: ...


P = TypeVar("P", bound=Parkable)


class IdleBackends(Generic[P]):
    """One worker's parked backend connections, by backend (compared by identity)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Callable[[], float]) -> None:
        self._loop = loop
        self._clock = clock
        self._idle: dict[object, list[P]] = {}
        self._count = 0
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return self._count

    def park(self, key: object, protocol: P, deadline: float, limit: int) -> bool:
        """Keep ``protocol``'s connection until ``deadline``; False: over ``limit``."""
        parked = self._idle.setdefault(key, [])
        if len(parked) >= limit or deadline <= self._clock():
            return False
        protocol.park(functools.partial(self.discard, key), deadline)
        parked.append(protocol)
        self._count += 1
        if self._timer is None:
            self._timer = self._loop.call_later(SWEEP_INTERVAL_S, self._sweep)
        return True

    def take(self, key: object) -> P | None:
        """The most recently parked live connection to ``key``, unparked; or None."""
        parked = self._idle.get(key)
        if not parked:
            return None
        now = self._clock()
        while parked:
            protocol = parked.pop()
            self._count -= 1
            if protocol.deadline > now and protocol.unpark():
                return protocol
            protocol.close_parked()
        return None

    def discard(self, key: object, protocol: Parkable) -> None:
        """``protocol``'s connection ended while parked."""
        parked = self._idle.get(key)
        if parked and protocol in parked:
            parked.remove(protocol)
            self._count -= 1

    def close_all(self) -> None:
        """Shutdown: close every parked connection."""
        for parked in list(self._idle.values()):
            for protocol in list(parked):
                protocol.close_parked()
        self._idle.clear()
        self._count = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sweep(self) -> None:
        self._timer = None
        now = self._clock()
        for key, parked in list(self._idle.items()):
            expired = [p for p in parked if p.deadline <= now]
            for protocol in expired:
                protocol.close_parked()  # calls discard
            if not parked:
                del self._idle[key]
        if self._count:
            self._timer = self._loop.call_later(SWEEP_INTERVAL_S, self._sweep)
