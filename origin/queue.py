"""Streams waiting for a backend slot, as HAProxy's ``maxconn`` + ``timeout queue``.

With ``max_connections_per_backend`` set, a stream that finds every usable
backend of its pool at its cap waits here, first come first served, instead of
failing at once; a stream that ends frees a slot for the first in line. The
stream gives up after the pool's ``queue_timeout_s`` (the edge answers 503),
and a full queue (``max_queued``) turns new streams away at once. One queue per
pool per worker: caps are per worker too.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["StreamQueue"]


class StreamQueue:
    """FIFO of futures, each resolved when a slot may be free."""

    __slots__ = ("_waiting", "max_queued")

    def __init__(self, max_queued: int) -> None:
        self.max_queued = max_queued
        self._waiting: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self._waiting)

    def join(self, future: asyncio.Future[None]) -> bool:
        """Get in line; False (and not queued) when the queue is full."""
        if len(self._waiting) >= self.max_queued:
            return False
        self._waiting.append(future)
        return True

    def leave(self, future: asyncio.Future[None]) -> None:
        """A waiter that gave up (its timeout, or its stream went away)."""
        try:
            self._waiting.remove(future)
        except ValueError:
            pass

    def wake_next(self) -> bool:
        """A slot freed: wake the first waiter still waiting. It tries the pool
        again; if another stream took the slot first, it queues again."""
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(None)
                return True
        return False
