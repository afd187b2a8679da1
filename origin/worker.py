"""One origin worker: its lifecycle, the parent's control messages, and the
parts it is made of.

The worker composes small owned parts and stands in no per-stream path: the
tunnel listener hands every stream straight to the dispatcher.

- :class:`origin.dispatch.StreamDispatcher`: the pools, the streams in flight,
  the parked backend connections and the pools' queues; per stream, choose a
  backend, reuse a parked connection or connect, queue under a cap, release;
- :class:`origin.edges.EdgeConnections`: the edges' tunnel connections and
  their metrics; GOAWAY on drain; CONTROL messages sent on all of them at
  the parent's request (:meth:`OriginWorker.on_request`,
  :mod:`origin.edge_control`);
- :class:`origin.deadlines.DeadlineSweep`: once a second, reset the streams
  whose backend is silent past its deadline;
- :class:`origin.publisher.MetricsPublisher`: once a second, publish the
  tally, the in-flight gauges and the edges' RTTs to the metrics.

Pool state comes from the parent as snapshots (:mod:`origin.snapshot`) on the
control pipe, or directly in process (:meth:`OriginWorker.apply_snapshots`).

Drain (:meth:`OriginWorker.drain`, as the edge worker's), one idempotent sequence (STYLE.md §13):
stop accepting, GOAWAY every tunnel connection (edges open new streams
elsewhere), let in-flight streams finish until the drain deadline, then
abort what is left.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from geoedge.logs import AccessLog, log_event
from geoedge.metrics import ProcessMetrics, Tally
from origin.acme_edges import NewEdgeCertificates
from origin.admission import TlsAudit
from origin.balancer import BackendPool
from origin.config import OriginConfig
from origin.deadlines import DeadlineSweep, stream_deadline
from origin.dispatch import StreamDispatcher
from origin.edge_control import answer_request
from origin.edges import EdgeConnections
from origin.forward import Splice
from origin.metrics import WorkerMetrics
from origin.publisher import MetricsPublisher
from origin.snapshot import PoolSnapshot, decode_snapshots
from tunnel.aio.control import ControlHandlers, echo
from tunnel.aio.transport import serve_tunnel
from tunnel.mux import ControlKind

# stream_deadline lives in origin.deadlines; tests import it from here.
__all__ = ["OriginWorker", "WorkerStatistics", "stream_deadline"]

log = logging.getLogger("geoedge.origin")


@dataclass(frozen=True, slots=True)
class WorkerStatistics:
    streams_total: int
    streams_active: int
    connections: int
    draining: bool


class OriginWorker:
    """Serves tunnel streams in one process; see the module docstring.

    Owns the tunnel listener, the parts (:attr:`dispatcher`, :attr:`edges`,
    :attr:`deadlines`, :attr:`publisher`) and the drain. Invariants: the
    parts' timers run from :meth:`start` to the end of the drain; the drain
    runs once however often :meth:`drain` is called; once it has begun,
    nothing is parked and every edge connection, new or old, gets GOAWAY.
    """

    def __init__(
        self,
        config: OriginConfig,
        snapshots: tuple[PoolSnapshot, ...],
        *,
        metrics: WorkerMetrics | None = None,
        access_log: AccessLog | None = None,
        process_metrics: bool = False,
        clock: Callable[[], float] = time.monotonic,
        acme_messages: list[tuple[int, bytes]] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or WorkerMetrics()
        #: One line per stream (None: not logged); the worker flushes and closes it.
        self.access_log = access_log
        self._loop = asyncio.get_running_loop()
        self._server: asyncio.Server | None = None
        self._draining = False
        self._drain_task: asyncio.Task[None] | None = None
        #: The worker process' own gauges (None in process: the tests' origins).
        self.process_metrics = ProcessMetrics("origin") if process_metrics else None
        #: Per-stream counts, added to the metrics with the edges' RTTs (Tally).
        self.tally = Tally()
        self.dispatcher = StreamDispatcher(
            config.origin.id, self.metrics, self.tally, access_log, clock
        )
        self.edges = EdgeConnections(self.metrics)
        #: The current ACME certificates, sent to each edge as it connects.
        self.acme = NewEdgeCertificates(acme_messages)
        self.edges.on_edge = self.acme.on_edge
        #: What the origin answers to the edges' CONTROL messages: ECHO alone.
        self.control_handlers = ControlHandlers({ControlKind.ECHO: echo})
        self.deadlines = DeadlineSweep(self.dispatcher, self.metrics, self._loop)
        self.publisher = MetricsPublisher(
            self._loop, self.tally, self.dispatcher, self.edges, access_log, self.process_metrics
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
            tls_audit.sink = self.edges.refused
        self._server = await serve_tunnel(
            self.config.tunnel_listener,
            self.config.tunnel,
            self.dispatcher.on_stream,
            on_connection=self.edges.on_connection,
            sock=sock,
            ssl_context=ssl_context,
            control_handlers=self.control_handlers,
        )
        self.publisher.start()
        self.deadlines.start()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def drain(self, drain_timeout_s: float | None = None) -> asyncio.Task[None]:
        """Begin the graceful stop (GOAWAY, in-flight streams finish, the rest are
        reset); returns its task, the same one if called again."""
        if self._drain_task is None:
            timeout = (
                self.config.origin.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
            )
            self._drain_task = self._loop.create_task(self._drain(timeout))
        return self._drain_task

    async def _drain(self, drain_timeout_s: float) -> None:
        self._draining = True
        if self._server is not None:
            self._server.close()
        dispatcher = self.dispatcher
        dispatcher.stop_parking()
        connections = self.edges.go_away()
        log_event(
            log,
            "info",
            "draining: GOAWAY sent to edges",
            connections=len(connections),
            streams=len(dispatcher.splices),
            drain_timeout_s=drain_timeout_s,
        )
        left = await self.edges.wait_closed(connections, drain_timeout_s)
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
        self.publisher.stop()
        self.deadlines.stop()
        await asyncio.sleep(0)  # let the aborts' callbacks run
        self.publisher.publish_counts()
        if self.access_log is not None:
            self.access_log.close()
        log.info("worker drained")

    # -- control -----------------------------------------------------------------------

    def on_control(self, message: dict[str, Any]) -> None:
        """A message from the parent (:func:`geoedge.workers.listen_control`)."""
        if message.get("op") == "pools":
            self.apply_snapshots(decode_snapshots(message["pools"]))
        elif message.get("op") == "acme_certificates":
            self.acme.replace([(int(k), base64.b64decode(b)) for k, b in message["messages"]])
        else:
            log.warning("unknown control message %r", message.get("op"))

    async def on_request(self, message: dict[str, Any]) -> dict[str, Any]:
        """A request from the parent (:meth:`geoedge.workers.Supervisor.request`):
        a CONTROL message for every edge connection of this worker."""
        return await answer_request(message, self.edges.broadcast_control)

    def apply_snapshots(self, snapshots: tuple[PoolSnapshot, ...]) -> None:
        """Adopt the parent's pools; in-flight streams keep their backends."""
        self.dispatcher.adopt(snapshots)

    # -- views -------------------------------------------------------------------------

    @property
    def pools(self) -> dict[str, BackendPool]:
        """The pools by name, as of the last snapshots."""
        return self.dispatcher.pools

    def splices(self) -> tuple[Splice, ...]:
        """The streams in flight (their byte counts, backends and transports)."""
        return tuple(self.dispatcher.splices)

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            streams_total=self.dispatcher.streams_total,
            streams_active=len(self.dispatcher.splices),
            connections=len(self.edges),
            draining=self._draining,
        )
