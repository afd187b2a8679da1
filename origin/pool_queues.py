"""One worker's streams waiting for a backend slot, a queue per pool.

The queue itself is :class:`origin.queue.StreamQueue` (HAProxy's ``maxconn`` +
``timeout queue``); this part keeps one per pool, decides whether a stream
that found no backend waits at all, and keeps the queue metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from origin.balancer import BackendPool
from origin.forward import Splice
from origin.metrics import WorkerMetrics
from origin.queue import StreamQueue

__all__ = ["PoolQueues"]


class PoolQueues:
    """Owns the per-pool :class:`~origin.queue.StreamQueue` of one worker.

    Invariants: a waiter is in its pool's queue only while it waits (it leaves
    whichever way the wait ends); ``queue_length`` for a pool counts its
    waiters; every wait's length is added to the stream's ``queued_s`` and to
    ``queue_seconds``. A queue's ``max_queued`` follows its pool's settings as
    snapshots change them.
    """

    __slots__ = ("_clock", "_loop", "_metrics", "_queues")

    def __init__(
        self,
        metrics: WorkerMetrics,
        loop: asyncio.AbstractEventLoop,
        clock: Callable[[], float],
    ) -> None:
        self._metrics = metrics
        self._loop = loop
        self._clock = clock
        self._queues: dict[str, StreamQueue] = {}

    @staticmethod
    def must_queue(pool: BackendPool, now: float) -> bool:
        """Whether a stream that found every backend of ``pool`` unavailable
        waits for a slot: the pool has caps and a queue, and some backend is
        usable (at its cap, not down)."""
        settings = pool.settings
        return (
            settings.max_connections_per_backend > 0
            and settings.queue_timeout_s > 0
            and pool.usable(now)
        )

    async def wait_for_slot(self, splice: Splice, pool: BackendPool, deadline: float) -> bool:
        """Queue behind the pool's other waiters until a stream ends (True) or
        ``deadline`` passes or the queue is full (False)."""
        queue = self._queues.get(pool.name)
        if queue is None:
            queue = self._queues[pool.name] = StreamQueue(pool.settings.max_queued)
        queue.max_queued = pool.settings.max_queued
        future: asyncio.Future[None] = self._loop.create_future()
        if not queue.join(future):
            return False
        started = self._clock()
        length = self._metrics.queue_length.labels(pool.name)
        length.inc()
        try:
            async with asyncio.timeout(max(0.0, deadline - started)):
                await future
            return True
        except TimeoutError:
            return False
        finally:
            queue.leave(future)
            length.dec()
            waited = self._clock() - started
            splice.queued_s += waited
            self._metrics.queue_seconds.labels(pool.name).observe(waited)

    def slot_freed(self, pool: str) -> None:
        """A stream of ``pool`` released its backend: wake the first waiter."""
        queue = self._queues.get(pool)
        if queue is not None and len(queue):
            queue.wake_next()
