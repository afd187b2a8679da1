"""One origin worker: accepts edges' streams, picks a backend, splices.

Per stream, the dispatcher (:class:`origin.dispatch.StreamDispatcher`): the
tunnel listener hands it every stream; the worker stands in no per-stream path.

Pool state comes from the parent as snapshots (:mod:`origin.snapshot`) on the
control pipe, or directly in process (:meth:`OriginWorker.apply_snapshots`).

Shutdown (:meth:`OriginWorker.shutdown`), one idempotent sequence (STYLE.md §13):
stop accepting, GOAWAY every tunnel connection (edges open new streams
elsewhere), let in-flight streams finish until the drain deadline, then
abort what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from geoedge.logs import AccessLog, LogThrottle, log_event
from geoedge.metrics import ProcessMetrics, Tally
from origin.admission import TlsAudit, refusal_reason
from origin.balancer import Backend, BackendPool
from origin.config import OriginConfig
from origin.dispatch import StreamDispatcher
from origin.forward import Splice
from origin.metrics import WorkerMetrics
from origin.snapshot import PoolSnapshot, decode_snapshots
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.errors import PeerRefused
from tunnel.aio.transport import serve_tunnel

__all__ = ["OriginWorker", "WorkerStatistics"]

log = logging.getLogger("geoedge.origin")
throttled = LogThrottle(log)

#: How often the edges' RTTs, the tally of per-stream counts and the process'
#: own gauges are published to the metrics: they are at most this stale.
PUBLISH_INTERVAL_S = 1.0
#: How often stream deadlines are checked (their resolution).
DEADLINE_SWEEP_S = 1.0


@dataclass(frozen=True, slots=True)
class WorkerStatistics:
    streams_total: int
    streams_active: int
    connections: int
    draining: bool


_monotonic = time.monotonic


def stream_deadline(
    settings: PoolSnapshot, status: int, first_byte_at: float, target: str | None
) -> float:
    """Seconds of silence a stream's backend is allowed now (0: no deadline).

    Before the response's first octet, ``response_timeout_s`` (counted from the
    last octet either way, so a slow upload is not the backend's fault); once
    it has started, ``read_timeout_s``; none after a 101 (a WebSocket's
    silences are the edge's idle timeout's business) or for a long-poll target."""
    if status == 101:
        return 0.0
    prefixes = settings.long_poll_prefixes
    if target is not None and prefixes and target.startswith(prefixes):
        return 0.0
    return settings.read_timeout_s if first_byte_at else settings.response_timeout_s


class OriginWorker:
    """Serves tunnel streams in one process; see the module docstring."""

    def __init__(
        self,
        config: OriginConfig,
        snapshots: tuple[PoolSnapshot, ...],
        *,
        metrics: WorkerMetrics | None = None,
        access_log: AccessLog | None = None,
        process_metrics: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.metrics = metrics or WorkerMetrics()
        #: One line per stream (None: not logged); the worker flushes and closes it.
        self.access_log = access_log
        self._loop = asyncio.get_running_loop()
        self._server: asyncio.Server | None = None
        self._connections: set[TunnelConnection] = set()
        self._draining = False
        self._shutdown_task: asyncio.Task[None] | None = None
        self._edge_timer: asyncio.TimerHandle | None = None
        self._publish_due = 0.0
        self._deadline_timer: asyncio.TimerHandle | None = None
        #: The worker process' own gauges (None in process: the tests' origins).
        self.process_metrics = ProcessMetrics("origin") if process_metrics else None
        #: Per-stream counts, added to the metrics with the edges' RTTs (Tally).
        self.tally = Tally()
        self.dispatcher = StreamDispatcher(
            config.origin.id, self.metrics, self.tally, access_log, clock
        )
        self.dispatcher.adopt(snapshots)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(
        self,
        *,
        sock: socket.socket | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tls_audit: TlsAudit | None = None,
    ) -> None:
        """Listen (on the parent's shared ``sock`` in a worker process)."""
        if tls_audit is not None:
            tls_audit.sink = self._edge_refused
        self._server = await serve_tunnel(
            self.config.tunnel_listener,
            self.config.tunnel,
            self.dispatcher.on_stream,
            on_connection=self._on_connection,
            sock=sock,
            ssl_context=ssl_context,
        )
        self._schedule_publish()
        self._deadline_timer = self._loop.call_later(DEADLINE_SWEEP_S, self._sweep_deadlines)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def shutdown(self, drain_timeout_s: float | None = None) -> asyncio.Task[None]:
        """Begin the graceful shutdown; returns its task (the same one if called again)."""
        if self._shutdown_task is None:
            timeout = (
                self.config.origin.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
            )
            self._shutdown_task = self._loop.create_task(self._shutdown(timeout))
        return self._shutdown_task

    async def _shutdown(self, drain_timeout_s: float) -> None:
        self._draining = True
        if self._server is not None:
            self._server.close()
        dispatcher = self.dispatcher
        connections = [c for c in self._connections if not c.closed.done()]
        log_event(
            log,
            "info",
            "draining: GOAWAY sent to edges",
            connections=len(connections),
            streams=len(dispatcher.splices),
            drain_timeout_s=drain_timeout_s,
        )
        dispatcher.stop_parking()
        for connection in connections:
            connection.go_away("origin shutting down")
        if connections:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_timeout_s):
                    await asyncio.gather(*(c.wait_closed() for c in connections))
        left = [c for c in connections if not c.closed.done()]
        if left or dispatcher.splices:
            log_event(
                log,
                "warning",
                "drain deadline passed: resetting the rest",
                connections=len(left),
                streams=len(dispatcher.splices),
            )
        for connection in left:
            connection.abort("drain deadline passed")
        dispatcher.cancel_all()
        if self._edge_timer is not None:
            self._edge_timer.cancel()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        await asyncio.sleep(0)  # let the aborts' callbacks run
        self.publish_counts()
        if self.access_log is not None:
            self.access_log.close()
        log.info("worker drained")

    # -- control -----------------------------------------------------------------------

    def on_control(self, message: dict[str, Any]) -> None:
        """A message from the parent (:func:`geoedge.workers.listen_control`)."""
        if message.get("op") == "pools":
            self.apply_snapshots(decode_snapshots(message["pools"]))
        else:
            log.warning("unknown control message %r", message.get("op"))

    def apply_snapshots(self, snapshots: tuple[PoolSnapshot, ...]) -> None:
        """Adopt the parent's pools; in-flight streams keep their backends."""
        self.dispatcher.adopt(snapshots)

    @property
    def pools(self) -> dict[str, BackendPool]:
        """The pools by name, as of the last snapshots."""
        return self.dispatcher.pools

    # -- deadlines ---------------------------------------------------------------------

    def _sweep_deadlines(self) -> None:
        self.check_deadlines(_monotonic())
        self._deadline_timer = self._loop.call_later(DEADLINE_SWEEP_S, self._sweep_deadlines)

    def check_deadlines(self, now: float) -> None:
        """Reset the streams whose backend has been silent past its pool's
        deadline (see :func:`stream_deadline`); called once a second."""
        pools = self.dispatcher.pools
        expired = []
        for splice in self.dispatcher.splices:
            backend: Backend | None = splice.tag
            if backend is None or not splice.backend_open:
                continue
            pool = pools.get(backend.tag.pool)
            if pool is None:
                continue
            stream = splice.stream
            target = stream.metadata.target if stream is not None and stream.metadata else None
            protocol = splice.backend_protocol
            last_down = protocol.last_active if protocol is not None else 0.0
            limit = stream_deadline(pool.settings, splice.status, splice.first_byte_at, target)
            quiet_since = max(splice.last_up, last_down, splice.connected_at)
            if limit and now - quiet_since > limit:
                expired.append((splice, pool.name, backend.address))
        for splice, pool_name, address in expired:
            self.metrics.stream_failures.labels(pool_name, "TIMEOUT").inc()
            throttled.warning(
                "backend %s (pool %s) silent past its deadline: stream reset with TIMEOUT",
                address,
                pool_name,
            )
            splice.time_out()

    # -- edges -------------------------------------------------------------------------

    def _on_connection(self, connection: TunnelConnection) -> None:
        connection.established.add_done_callback(
            lambda future: self._on_established(connection, future)
        )

    def _on_established(self, connection: TunnelConnection, future: asyncio.Future[None]) -> None:
        exc = None if future.cancelled() else future.exception()
        if isinstance(exc, PeerRefused):
            self._edge_refused(refusal_reason(exc))
            return
        if exc is not None or future.cancelled():
            return
        identity = connection.info.peer_identity
        self._connections.add(connection)
        self.metrics.edges_connected.labels(identity).inc()
        log_event(
            log, "info", "edge connected", edge=identity, peer=str(connection.info.peer_address)
        )
        if self._draining:
            connection.go_away("origin shutting down")

        def gone(_: object) -> None:
            self._connections.discard(connection)
            self.metrics.edges_connected.labels(identity).dec()

        connection.closed.add_done_callback(gone)

    def _edge_refused(self, reason: str) -> None:
        self.metrics.edges_refused.labels(reason).inc()

    def _publish(self) -> None:
        if self.access_log is not None:  # a quiet origin's last lines within seconds
            self.access_log.flush()
        rtts: dict[str, float] = {}
        for connection in self._connections:
            srtt = connection.srtt_s
            identity = connection.info.peer_identity
            if srtt is not None:
                rtts[identity] = max(rtts.get(identity, 0.0), srtt)
        for identity, srtt in rtts.items():
            self.metrics.edge_rtt.labels(identity).set(srtt)
        self.publish_counts()
        if self.process_metrics is not None:
            self.process_metrics.sample(event_loop_lag_s=self._loop.time() - self._publish_due)
        self._schedule_publish()

    def publish_counts(self) -> None:
        """Add the tally to the metrics and set the in-flight gauges (at most
        PUBLISH_INTERVAL_S stale; at once on stop)."""
        self.tally.publish()
        for pool in self.dispatcher.pools.values():
            for backend in pool.backends:
                if backend.tag is not None:
                    backend.tag.active.set(backend.active)

    def _schedule_publish(self) -> None:
        self._publish_due = self._loop.time() + PUBLISH_INTERVAL_S
        self._edge_timer = self._loop.call_at(self._publish_due, self._publish)

    def splices(self) -> tuple[Splice, ...]:
        """The streams in flight (their byte counts, backends and transports)."""
        return tuple(self.dispatcher.splices)

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            streams_total=self.dispatcher.streams_total,
            streams_active=len(self.dispatcher.splices),
            connections=len(self._connections),
            draining=self._draining,
        )
