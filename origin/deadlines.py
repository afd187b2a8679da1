"""Which streams' backends have been silent too long, and the sweep that resets them.

:func:`stream_deadline` is the pure decision (how long a stream's backend may
be silent now); :class:`DeadlineSweep` asks it about every stream in flight
once a second and resets the expired ones with ``TIMEOUT`` (the edge answers
504 if no response has started). The edge's counterpart is
:mod:`edge.deadlines`: the same once-a-second sweep over its client
connections.
"""

from __future__ import annotations

import asyncio
import logging
import time

from geoedge.logs import LogThrottle
from origin.balancer import Backend
from origin.dispatch import StreamDispatcher
from origin.metrics import WorkerMetrics
from origin.snapshot import PoolSnapshot

__all__ = ["DEADLINE_SWEEP_S", "DeadlineSweep", "stream_deadline"]

log = logging.getLogger("geoedge.origin")
throttled = LogThrottle(log)

#: How often stream deadlines are checked (their resolution).
DEADLINE_SWEEP_S = 1.0

_monotonic = time.monotonic


def stream_deadline(
    settings: PoolSnapshot,
    status: int,
    first_byte_at: float,
    target: str | None,
    long_poll: bool = False,
) -> float:
    """Seconds of silence a stream's backend is allowed now (0: no deadline).

    Before the response's first octet, ``first_byte_timeout_s`` (counted from
    the last octet either way, so a slow upload is not the backend's fault);
    once it has started, ``between_bytes_timeout_s``; none after a 101 (a
    WebSocket's silences are the edge's idle timeout's business), for a
    stream the edge marked as a long poll (``long_poll``: LONG_POLL,
    PROTOCOL.md §6.2, from the edge's ``[http] long_poll_prefixes``), or for a
    target in the pool's own ``long_poll_prefixes``."""
    if status == 101 or long_poll:
        return 0.0
    prefixes = settings.long_poll_prefixes
    if target is not None and prefixes and target.startswith(prefixes):
        return 0.0
    return settings.between_bytes_timeout_s if first_byte_at else settings.first_byte_timeout_s


class DeadlineSweep:
    """Owns one worker's deadline timer (armed from :meth:`start` to :meth:`stop`).

    Reads the dispatcher's streams and pools and changes nothing but the
    expired streams: each is counted in ``stream_failures`` (``TIMEOUT``) and
    reset with its backend connection (never reused). A stream is checked only
    while its backend connection is open, against its pool's current settings;
    a stream whose pool a snapshot removed has no deadline."""

    __slots__ = ("_dispatcher", "_loop", "_metrics", "_timer")

    def __init__(
        self,
        dispatcher: StreamDispatcher,
        metrics: WorkerMetrics,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._timer = self._loop.call_later(DEADLINE_SWEEP_S, self._sweep)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _sweep(self) -> None:
        self.check(_monotonic())
        self._timer = self._loop.call_later(DEADLINE_SWEEP_S, self._sweep)

    def check(self, now: float) -> None:
        """Reset the streams whose backend has been silent past its pool's
        deadline (see :func:`stream_deadline`)."""
        pools = self._dispatcher.pools
        expired = []
        for splice in self._dispatcher.splices:
            backend: Backend | None = splice.tag
            if backend is None or not splice.backend_open:
                continue
            pool = pools.get(backend.tag.pool)
            if pool is None:
                continue
            stream = splice.stream
            metadata = stream.metadata if stream is not None else None
            target = metadata.target if metadata is not None else None
            long_poll = metadata is not None and metadata.long_poll is True
            protocol = splice.backend_protocol
            last_down = protocol.last_active if protocol is not None else 0.0
            limit = stream_deadline(
                pool.settings, splice.status, splice.first_byte_at, target, long_poll
            )
            quiet_since = max(splice.last_up, last_down, splice.connected_at)
            if limit and now - quiet_since > limit:
                expired.append((splice, pool.name, backend.address))
        for splice, pool_name, address in expired:
            self._metrics.stream_failures.labels(pool_name, "TIMEOUT").inc()
            throttled.warning(
                "backend %s (pool %s) silent past its deadline: stream reset with TIMEOUT",
                address,
                pool_name,
            )
            splice.time_out()
