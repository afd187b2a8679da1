"""One worker's counts, published to the metrics once a second.

Per stream the dispatcher only adds to a :class:`~geoedge.metrics.Tally` (ten
multiprocess metric updates per stream cost 14% of the origin's CPU in
``make bench-edge``); this part adds the tally to the metrics on a timer, with
what is cheaper to read than to count: the in-flight gauges (each backend's
``active``), the edges' RTTs and the process' own gauges. The edge's worker
does the same in its once-a-second sweep.
"""

from __future__ import annotations

import asyncio

from geoedge.logs import AccessLog
from geoedge.metrics import ProcessMetrics, Tally
from origin.dispatch import StreamDispatcher
from origin.edges import EdgeConnections

__all__ = ["PUBLISH_INTERVAL_S", "MetricsPublisher"]

#: How often the edges' RTTs, the tally of per-stream counts and the process'
#: own gauges are published to the metrics: they are at most this stale.
PUBLISH_INTERVAL_S = 1.0


class MetricsPublisher:
    """Owns one worker's publish timer (armed from :meth:`start` to :meth:`stop`).

    Invariant: while it runs, the metrics are at most ``PUBLISH_INTERVAL_S``
    stale, and so are the access log's lines (flushed on each tick: a quiet
    origin's last lines within seconds); :meth:`publish_counts` makes the
    counts exact at once (the drain's last step).
    """

    __slots__ = (
        "_access_log",
        "_dispatcher",
        "_due",
        "_edges",
        "_loop",
        "_process_metrics",
        "_tally",
        "_timer",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        tally: Tally,
        dispatcher: StreamDispatcher,
        edges: EdgeConnections,
        access_log: AccessLog | None,
        process_metrics: ProcessMetrics | None,
    ) -> None:
        self._loop = loop
        self._tally = tally
        self._dispatcher = dispatcher
        self._edges = edges
        self._access_log = access_log
        self._process_metrics = process_metrics
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._schedule()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def publish_counts(self) -> None:
        """Add the tally to the metrics and set the in-flight gauges."""
        self._dispatcher.publish_counts()  # into the tally first
        self._tally.publish()
        for pool in self._dispatcher.pools.values():
            for backend in pool.backends:
                if backend.tag is not None:
                    backend.tag.active.set(backend.active)

    def _publish(self) -> None:
        if self._access_log is not None:
            self._access_log.flush()
        self._edges.publish_rtts()
        self.publish_counts()
        if self._process_metrics is not None:
            self._process_metrics.sample(event_loop_lag_s=self._loop.time() - self._due)
        self._schedule()

    def _schedule(self) -> None:
        self._due = self._loop.time() + PUBLISH_INTERVAL_S
        self._timer = self._loop.call_at(self._due, self._publish)
