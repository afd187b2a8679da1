"""One origin worker: accepts edges' streams, picks a backend, splices.

Per stream (:meth:`OriginWorker.on_stream`): route to a pool by Host/SNI
(:class:`origin.balancer.PoolRouter`), answer with a :class:`~origin.forward.Splice`
at once (its reading paused: the 0-RTT bytes wait), then connect in a task:

1. choose a backend (:meth:`origin.balancer.BackendPool.choose`), counting the
   stream against it *before* the connect, so a burst of streams spreads
   under least_connections instead of all seeing zero in flight;
2. connect within ``connect_timeout_s``; on failure record it (passive
   ejection), exclude that backend and try another, up to ``connect_retries``
   more times: nothing has been sent, so a retry is always safe;
3. none left: reset the stream with ``NO_BACKEND`` if the pool had no usable
   backend to begin with, else ``CONNECT_FAILED``; the edge answers 503/502.

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

from geoedge.logs import AccessLog, LogThrottle, debug_enabled, log_event
from geoedge.metrics import ProcessMetrics, Tally
from origin.admission import TlsAudit, refusal_reason
from origin.balancer import (
    Backend,
    BackendPool,
    PoolRouter,
    record_connect_failure,
    record_connect_success,
)
from origin.config import OriginConfig
from origin.forward import BackendProtocol, Splice, proxy_preamble
from origin.hash_key import MAX_HEAD, HashKey, key_for, needs_head
from origin.keepalive import IdleBackends
from origin.metrics import WorkerMetrics
from origin.queue import StreamQueue
from origin.snapshot import PoolSnapshot, decode_snapshots
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.errors import PeerRefused, TunnelError
from tunnel.aio.stream import TunnelStream
from tunnel.aio.transport import serve_tunnel
from tunnel.mux import ErrorCode

__all__ = ["OriginWorker", "WorkerStatistics"]

log = logging.getLogger("geoedge.origin")
throttled = LogThrottle(log)

#: How often the edges' RTTs, the tally of per-stream counts and the process'
#: own gauges are published to the metrics: they are at most this stale.
PUBLISH_INTERVAL_S = 1.0
#: How long a stream hashed on a header or cookie waits for its request head.
HEAD_WAIT_S = 0.1
#: How often stream deadlines are checked (their resolution).
DEADLINE_SWEEP_S = 1.0


@dataclass(slots=True, eq=False)
class _BackendTag:
    """Per-backend metric handles, looked up once (not per stream)."""

    streams: Any
    active: Any
    reused: Any
    bytes_up: Any
    bytes_down: Any
    ejected: Any
    connect_seconds: Any
    first_byte_seconds: Any
    stream_seconds: Any
    pool: str


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


def stream_outcome(code: int | None, backend_ended: bool = False) -> str:
    """The access log's ``outcome`` for a stream that ended with ``code``
    (None: a graceful end). IDLE is the edge ending the stream after a whole
    exchange, so the backend connection can be reused: a success; so is a
    CANCEL after the backend ended its response by closing (the connection
    could not be reused, nothing was cut)."""
    if code is None or code == ErrorCode.IDLE:
        return "ok"
    if code == ErrorCode.CANCEL and backend_ended:
        return "ok"
    return ErrorCode.name_of(code).lower()


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
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self.pools: dict[str, BackendPool] = {}
        self.router = PoolRouter(())
        self._server: asyncio.Server | None = None
        self._connections: set[TunnelConnection] = set()
        self._splices: set[Splice] = set()
        self._queues: dict[str, StreamQueue] = {}
        self.idle: IdleBackends[BackendProtocol] = IdleBackends(self._loop, clock)
        self._draining = False
        self._shutdown_task: asyncio.Task[None] | None = None
        self._edge_timer: asyncio.TimerHandle | None = None
        self._publish_due = 0.0
        self._deadline_timer: asyncio.TimerHandle | None = None
        #: The worker process' own gauges (None in process: the tests' origins).
        self.process_metrics = ProcessMetrics("origin") if process_metrics else None
        self._streams_total = 0
        #: Per-stream counts, added to the metrics with the edges' RTTs (Tally).
        self.tally = Tally()
        self._debug = debug_enabled(log)
        self.apply_snapshots(snapshots)

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
            self.on_stream,
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
        connections = [c for c in self._connections if not c.closed.done()]
        log_event(
            log,
            "info",
            "draining: GOAWAY sent to edges",
            connections=len(connections),
            streams=len(self._splices),
            drain_timeout_s=drain_timeout_s,
        )
        self.idle.close_all()
        for connection in connections:
            connection.go_away("origin shutting down")
        if connections:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_timeout_s):
                    await asyncio.gather(*(c.wait_closed() for c in connections))
        left = [c for c in connections if not c.closed.done()]
        if left or self._splices:
            log_event(
                log,
                "warning",
                "drain deadline passed: resetting the rest",
                connections=len(left),
                streams=len(self._splices),
            )
        for connection in left:
            connection.abort("drain deadline passed")
        for splice in list(self._splices):
            if splice.stream is not None:
                splice.stream.abort(ErrorCode.CANCEL)
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
        pools: dict[str, BackendPool] = {}
        for snapshot in snapshots:
            pool = self.pools.get(snapshot.name)
            if pool is None:
                pool = BackendPool(snapshot)
            pool.apply(snapshot)
            for backend in pool.backends:
                if backend.tag is None:
                    backend.tag = self._tag(pool.name, backend.address)
            pools[snapshot.name] = pool
        self.pools = pools
        self.router = PoolRouter(snapshots)

    def _tag(self, pool: str, address: str) -> _BackendTag:
        m = self.metrics
        return _BackendTag(
            streams=m.streams.labels(pool, address),
            active=m.streams_active.labels(pool, address),
            reused=m.reused.labels(pool, address),
            bytes_up=m.bytes.labels(pool, address, "to_backend"),
            bytes_down=m.bytes.labels(pool, address, "from_backend"),
            ejected=m.ejected.labels(pool, address),
            connect_seconds=m.connect_seconds.labels(pool, address),
            first_byte_seconds=m.first_byte_seconds.labels(pool, address),
            stream_seconds=m.stream_seconds.labels(pool, address),
            pool=pool,
        )

    # -- streams -----------------------------------------------------------------------

    def on_stream(self, stream: TunnelStream) -> Splice:
        splice = Splice(self._finished, self.park)
        self._splices.add(splice)
        metadata = stream.metadata
        name = (
            self.router.route(metadata.host, metadata.server_name)
            if metadata
            else (self.router.default)
        )
        pool = self.pools.get(name) if name is not None else None
        if pool is not None:
            splice.pool = pool.name
        self._loop.call_soon(self._begin, splice, pool)
        return splice

    def _begin(self, splice: Splice, pool: BackendPool | None) -> None:
        """Serve the stream from a parked connection at once when the pool's
        choice has one; whatever may wait (a hash key read from the request, a
        connect, the queue) runs as a task. Called soon after connection_made:
        ``splice.stream`` is set.

        The choice counts against the backend's cap as it is made (a choice
        counted only later, in the task, let two streams past a cap of one): a
        backend chosen here without a parked connection is reserved for the
        task (``splice.reserved``), and released by :meth:`_finished` if the
        stream ends before the task runs."""
        if splice.finished:
            return
        if pool is not None and pool.settings.algorithm != "consistent_hash":
            chosen = pool.choose(self._clock(), b"", [])
            if chosen is not None:
                if self._reuse(splice, chosen):
                    return
                chosen.active += 1
                splice.reserved = chosen
        splice.connect_task = self._loop.create_task(self._connect(splice, pool))

    def _reuse(self, splice: Splice, backend: Backend, *, counted: bool = False) -> bool:
        """Give ``splice`` a parked connection to ``backend``, if there is one
        (``counted``: the stream already counts in ``backend.active``)."""
        reused = self.idle.take(backend)
        if reused is None:
            return False
        if not counted:
            backend.active += 1
        splice.reused = True
        self._started(splice, backend, reused.transport, reused, b"")  # type: ignore[arg-type]
        self.tally.inc(backend.tag.reused)
        return True

    async def _connect(self, splice: Splice, pool: BackendPool | None) -> None:
        if pool is None:
            self._fail(splice, "-", ErrorCode.NO_BACKEND)
            return
        stream = splice.stream
        metadata = stream.metadata if stream is not None else None
        settings = pool.settings
        hashed = settings.algorithm == "consistent_hash"
        key = await self._hash_key(settings, stream) if hashed else b""
        tried: list[Backend] = []
        attempt = 0
        queue_deadline = 0.0
        while attempt <= settings.connect_retries:
            now = self._clock()
            backend, splice.reserved = splice.reserved, None  # counted by _begin
            if backend is None:
                backend = pool.choose(now, key, tried)
                if backend is not None:
                    backend.active += 1
            if backend is None:
                if not tried and self._must_queue(pool, now):
                    # Every usable backend is at its cap: wait in line for a slot.
                    queue_deadline = queue_deadline or now + settings.queue_timeout_s
                    if await self._wait_for_slot(splice, pool, queue_deadline):
                        continue
                    self._fail(splice, pool.name, ErrorCode.NO_BACKEND, "QUEUE_TIMEOUT")
                    return
                code = ErrorCode.NO_BACKEND if not tried else ErrorCode.CONNECT_FAILED
                self._fail(splice, pool.name, code)
                return
            if attempt:
                self.metrics.connect_retries.labels(pool.name).inc()
            attempt += 1
            if self._reuse(splice, backend, counted=True):
                return
            started = self._clock()
            try:
                async with asyncio.timeout(settings.connect_timeout_s):
                    transport, protocol = await self._loop.create_connection(
                        lambda: BackendProtocol(splice), backend.host, backend.port
                    )
            except asyncio.CancelledError:
                backend.active -= 1
                raise
            except (OSError, TimeoutError) as exc:
                backend.active -= 1
                self._slot_freed(pool.name)
                self._connect_failed(pool, backend, exc)
                tried.append(backend)
                continue
            record_connect_success(backend)
            splice.connected_at = self._clock()
            self.tally.observe_child(backend.tag.connect_seconds, splice.connected_at - started)
            preamble = proxy_preamble(settings.proxy_protocol, metadata)
            self._started(splice, backend, transport, protocol, preamble)
            return
        self._fail(splice, pool.name, ErrorCode.CONNECT_FAILED)

    def _sweep_deadlines(self) -> None:
        self.check_deadlines(_monotonic())
        self._deadline_timer = self._loop.call_later(DEADLINE_SWEEP_S, self._sweep_deadlines)

    def check_deadlines(self, now: float) -> None:
        """Reset the streams whose backend has been silent past its pool's
        deadline (see :func:`stream_deadline`); called once a second."""
        expired = []
        for splice in self._splices:
            backend: Backend | None = splice.tag
            if backend is None or not splice.backend_open:
                continue
            pool = self.pools.get(backend.tag.pool)
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

    def _started(
        self,
        splice: Splice,
        backend: Backend,
        transport: asyncio.Transport,
        protocol: BackendProtocol,
        preamble: bytes,
    ) -> None:
        self._streams_total += 1
        if not splice.connected_at:  # a reused connection: it is ours from now
            splice.connected_at = self._clock()
        self.tally.inc(backend.tag.streams)
        splice.tag = backend
        splice.attach(transport, preamble, protocol)

    def park(self, splice: Splice) -> bool:
        """The edge ended ``splice``'s stream between exchanges: keep its backend
        connection for the next stream to that backend if the pool allows it."""
        backend: Backend | None = splice.tag
        protocol = splice.backend_protocol
        if backend is None or protocol is None or self._draining:
            return False
        pool = self.pools.get(backend.tag.pool)
        if pool is None or backend not in pool.backends or backend.drained or not backend.healthy:
            return False
        settings = pool.settings
        if settings.keepalive_idle_s <= 0 or settings.proxy_protocol != "off":
            return False
        deadline = (protocol.last_active or self._clock()) + settings.keepalive_idle_s
        return self.idle.park(backend, protocol, deadline, settings.keepalive_max_idle)

    def _connect_failed(self, pool: BackendPool, backend: Backend, exc: BaseException) -> None:
        if isinstance(exc, TimeoutError):
            reason = "timeout"
        elif isinstance(exc, ConnectionRefusedError):
            reason = "refused"
        else:
            reason = "error"
        self.metrics.connect_failures.labels(pool.name, backend.address, reason).inc()
        if record_connect_failure(backend, self._clock(), pool.settings.passive):
            self.metrics.ejections.labels(pool.name, backend.address).inc()
            backend.tag.ejected.set(1)
            delay = max(0.0, backend.ejected_until - self._clock())
            self._loop.call_later(delay, backend.tag.ejected.set, 0)
            log_event(
                log,
                "warning",
                "backend ejected after connect failures",
                pool=pool.name,
                backend=backend.address,
                reason=reason,
                eject_s=round(delay, 3),
            )
        elif self._debug:
            log.debug("connect to %s failed: %s", backend.address, exc)

    async def _hash_key(self, settings: PoolSnapshot, stream: TunnelStream | None) -> bytes:
        """What consistent_hash hashes for this stream (origin.hash_key). A key in
        the request head waits (briefly) for the head: it follows OPEN at once."""
        metadata = stream.metadata if stream is not None else None
        client = metadata.client_address if metadata is not None else None
        client_ip = client[0] if client else ""
        target = metadata.target if metadata is not None else None
        key = HashKey.parse(settings.hash_key)
        head = b""
        if needs_head(key) and stream is not None:
            deadline = self._clock() + HEAD_WAIT_S
            head = stream.held()
            while b"\r\n\r\n" not in head and len(head) < MAX_HEAD:
                if self._clock() > deadline:
                    break  # no whole head yet: the client address it is
                await asyncio.sleep(0.002)
                head = stream.held()
        return key_for(key, client_ip, target, head)

    def _must_queue(self, pool: BackendPool, now: float) -> bool:
        settings = pool.settings
        return (
            settings.max_connections_per_backend > 0
            and settings.queue_timeout_s > 0
            and pool.usable(now)
        )

    async def _wait_for_slot(self, splice: Splice, pool: BackendPool, deadline: float) -> bool:
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
        length = self.metrics.queue_length.labels(pool.name)
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
            self.metrics.queue_seconds.labels(pool.name).observe(waited)

    def _slot_freed(self, pool: str) -> None:
        queue = self._queues.get(pool)
        if queue is not None and len(queue):
            queue.wake_next()

    def _fail(self, splice: Splice, pool: str, code: ErrorCode, reason: str = "") -> None:
        self.metrics.stream_failures.labels(pool, reason or code.name).inc()
        if self._debug:
            log.debug("stream reset: %s (pool %s)", code.name, pool)
        splice.fail(code)

    def _finished(self, splice: Splice, exc: BaseException | None) -> None:
        self._splices.discard(splice)
        code = exc.code if isinstance(exc, TunnelError) else None
        if self.access_log is not None:
            self._log_stream(splice, code)
        backend = splice.tag
        if backend is None:
            reserved, splice.reserved = splice.reserved, None
            if reserved is not None:  # ended before its connect task ran
                reserved.active -= 1
                self._slot_freed(reserved.tag.pool)
            return
        backend.active -= 1
        tag = backend.tag
        self._slot_freed(tag.pool)
        tally = self.tally
        if splice.bytes_up:
            tally.inc(tag.bytes_up, splice.bytes_up)
        if splice.bytes_down:
            tally.inc(tag.bytes_down, splice.bytes_down)
        if splice.first_byte_at:
            tally.observe_child(tag.first_byte_seconds, splice.first_byte_at - splice.opened_at)
        tally.observe_child(tag.stream_seconds, _monotonic() - splice.opened_at)
        if code == ErrorCode.UPSTREAM_RESET:
            self.metrics.stream_failures.labels(tag.pool, "UPSTREAM_RESET").inc()

    def _log_stream(self, splice: Splice, code: int | None) -> None:
        """The stream's access-log line: joins the edge's by ``request_id``."""
        assert self.access_log is not None
        stream = splice.stream
        metadata = stream.metadata if stream is not None else None
        backend: Backend | None = splice.tag
        opened = splice.opened_at
        client = metadata.client_address if metadata is not None else None
        self.access_log.log(
            client_ip=client[0] if client else None,
            method=metadata.method if metadata is not None else None,
            host=metadata.host if metadata is not None else None,
            path=metadata.target if metadata is not None else None,
            status=splice.status,
            bytes_in=splice.bytes_up,
            bytes_out=splice.bytes_down,
            duration_ms=(_monotonic() - opened) * 1000,
            upstream_ms=(splice.first_byte_at - opened) * 1000 if splice.first_byte_at else None,
            edge_id=metadata.edge_id if metadata is not None else None,
            origin=self.config.origin.id,
            request_id=metadata.request_id if metadata is not None else None,
            pool=splice.pool,
            backend=backend.address if backend is not None else None,
            reused=splice.reused,
            connect_ms=(
                round((splice.connected_at - opened) * 1000, 3) if splice.connected_at else None
            ),
            queue_ms=round(splice.queued_s * 1000, 3) if splice.queued_s else None,
            outcome=stream_outcome(code, splice.backend_eof),
        )

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
        for pool in self.pools.values():
            for backend in pool.backends:
                if backend.tag is not None:
                    backend.tag.active.set(backend.active)

    def _schedule_publish(self) -> None:
        self._publish_due = self._loop.time() + PUBLISH_INTERVAL_S
        self._edge_timer = self._loop.call_at(self._publish_due, self._publish)

    def splices(self) -> tuple[Splice, ...]:
        """The streams in flight (their byte counts, backends and transports)."""
        return tuple(self._splices)

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            streams_total=self._streams_total,
            streams_active=len(self._splices),
            connections=len(self._connections),
            draining=self._draining,
        )
