"""One worker's streams, each sent to a backend of its pool.

Per stream (:meth:`StreamDispatcher.on_stream`): route to a pool by Host/SNI
(:class:`origin.balancer.PoolRouter`), answer with a :class:`~origin.forward.Splice`
at once (its reading paused: the 0-RTT bytes wait), then, soon after:

1. choose a backend (:meth:`origin.balancer.BackendPool.choose`), counting the
   stream against it *before* the connect, so a burst of streams spreads
   under least_connections instead of all seeing zero in flight; a parked
   connection to it (:mod:`origin.keepalive`) serves the stream at once, from a
   callback;
2. otherwise connect, in a task, within ``connect_timeout_s``; on failure
   record it (passive ejection), exclude that backend and try another, up to
   ``connect_retries`` more times: nothing has been sent, so a retry is always
   safe; every usable backend at its cap (``max_connections_per_backend``):
   wait in the pool's queue (:class:`origin.pool_queues.PoolQueues`);
3. none left: reset the stream with ``NO_BACKEND`` if the pool had no usable
   backend to begin with, else ``CONNECT_FAILED``; the edge answers 503/502.

When the stream ends (:meth:`StreamDispatcher._finished`) its backend's slot is
released and its counts go to the backend's sums (:mod:`origin.backend_counts`);
a stream the edge ended between exchanges offers its backend connection for
the next one (:meth:`StreamDispatcher.park`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from geoedge.logs import AccessLog, debug_enabled, log_event
from geoedge.metrics import Tally
from origin.backend_counts import BackendCounts
from origin.balancer import (
    Backend,
    BackendPool,
    PoolRouter,
    record_connect_failure,
    record_connect_success,
)
from origin.forward import BackendProtocol, Splice, proxy_preamble
from origin.hash_key import MAX_HEAD, HashKey, key_for, needs_head
from origin.keepalive import IdleBackends
from origin.metrics import WorkerMetrics
from origin.pool_queues import PoolQueues
from origin.snapshot import PoolSnapshot
from origin.stream_log import log_stream
from tunnel.aio.errors import TunnelError
from tunnel.aio.stream import TunnelStream
from tunnel.mux import ErrorCode

__all__ = ["BackendTag", "StreamDispatcher"]

log = logging.getLogger("geoedge.origin")

#: How long a stream hashed on a header or cookie waits for its request head.
HEAD_WAIT_S = 0.1

_monotonic = time.monotonic
_UPSTREAM_RESET = ErrorCode.UPSTREAM_RESET  # not read off the class per stream


@dataclass(slots=True, eq=False)
class BackendTag:
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
    counts: BackendCounts  # summed per stream, published by publish_counts

    def publish_counts(self, tally: Tally) -> None:
        self.counts.publish(
            tally, self.streams, self.reused, self.bytes_up, self.bytes_down,
            self.first_byte_seconds, self.stream_seconds,
        )  # fmt: skip


class StreamDispatcher:
    """Owns, for one worker: the pools (adopted from the parent's snapshots),
    the streams in flight (:attr:`splices`), the parked backend connections
    (:attr:`idle`) and the pools' queues; decides per stream: choose a backend,
    reuse a parked connection or connect, queue under a cap, release.

    Invariants:

    - ``backend.active`` counts the streams that chose the backend and have not
      finished: it is raised when the choice is made (a backend reserved for a
      connect task is ``splice.reserved``; one serving the stream is
      ``splice.tag``) and lowered once, by a failed connect or by
      :meth:`_finished`; every release wakes the pool's first waiter.
    - A stream is in :attr:`splices` from :meth:`on_stream` to :meth:`_finished`.
    - Nothing is parked once :meth:`stop_parking` has run.
    - Every backend of :attr:`pools` has its :class:`BackendTag`; a stream keeps
      its backend (and pool) when a snapshot removes them.
    """

    def __init__(
        self,
        origin_id: str,
        metrics: WorkerMetrics,
        tally: Tally,
        access_log: AccessLog | None,
        clock: Callable[[], float],
    ) -> None:
        self._origin_id = origin_id
        self.metrics = metrics
        self.tally = tally
        self.access_log = access_log
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self.pools: dict[str, BackendPool] = {}
        self.router = PoolRouter(())
        self.splices: set[Splice] = set()
        self.idle: IdleBackends[BackendProtocol] = IdleBackends(self._loop, clock)
        self.queues = PoolQueues(metrics, self._loop, clock)
        #: Streams that got a backend connection since the start.
        self.streams_total = 0
        #: Every backend's metric handles and counts, by (pool, address): a
        #: backend that leaves and comes back (DNS discovery) gets its tag again.
        self.tags: dict[tuple[str, str], BackendTag] = {}
        self._parking = True
        self._debug = debug_enabled(log)

    # -- pools -------------------------------------------------------------------------

    def adopt(self, snapshots: tuple[PoolSnapshot, ...]) -> None:
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

    def _tag(self, pool: str, address: str) -> BackendTag:
        tag = self.tags.get((pool, address))
        if tag is not None:
            return tag
        m = self.metrics
        first_byte_seconds = m.first_byte_seconds.labels(pool, address)
        stream_seconds = m.stream_seconds.labels(pool, address)
        tag = BackendTag(
            streams=m.streams.labels(pool, address),
            active=m.streams_active.labels(pool, address),
            reused=m.reused.labels(pool, address),
            bytes_up=m.bytes.labels(pool, address, "to_backend"),
            bytes_down=m.bytes.labels(pool, address, "from_backend"),
            ejected=m.ejected.labels(pool, address),
            connect_seconds=m.connect_seconds.labels(pool, address),
            first_byte_seconds=first_byte_seconds,
            stream_seconds=stream_seconds,
            pool=pool,
            counts=BackendCounts(first_byte_seconds, stream_seconds),
        )
        self.tags[pool, address] = tag
        return tag

    def publish_counts(self) -> None:
        """Every backend's per-stream counts into the tally (those of a
        backend no longer in a pool too: its last streams count)."""
        for tag in self.tags.values():
            tag.publish_counts(self.tally)

    # -- a stream's start --------------------------------------------------------------

    def on_stream(self, stream: TunnelStream) -> Splice:
        """A stream opened by an edge (the tunnel's stream acceptor)."""
        splice = Splice(self._finished, self.park)
        self.splices.add(splice)
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
        backend.tag.counts.reused += 1
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
        queues = self.queues
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
                if not tried and queues.must_queue(pool, now):
                    # Every usable backend is at its cap: wait in line for a slot.
                    queue_deadline = queue_deadline or now + settings.queue_timeout_s
                    if await queues.wait_for_slot(splice, pool, queue_deadline):
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
                queues.slot_freed(pool.name)
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

    def _started(
        self,
        splice: Splice,
        backend: Backend,
        transport: asyncio.Transport,
        protocol: BackendProtocol,
        preamble: bytes,
    ) -> None:
        self.streams_total += 1
        if not splice.connected_at:  # a reused connection: it is ours from now
            splice.connected_at = self._clock()
        backend.tag.counts.streams += 1
        splice.tag = backend
        splice.attach(transport, preamble, protocol)

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

    def _fail(self, splice: Splice, pool: str, code: ErrorCode, reason: str = "") -> None:
        self.metrics.stream_failures.labels(pool, reason or code.name).inc()
        if self._debug:
            log.debug("stream reset: %s (pool %s)", code.name, pool)
        splice.fail(code)

    # -- a stream's end ----------------------------------------------------------------

    def park(self, splice: Splice) -> bool:
        """The edge ended ``splice``'s stream between exchanges: keep its backend
        connection for the next stream to that backend if the pool allows it."""
        backend: Backend | None = splice.tag
        protocol = splice.backend_protocol
        if backend is None or protocol is None or not self._parking:
            return False
        pool = self.pools.get(backend.tag.pool)
        if pool is None or backend not in pool.backends or backend.drained or not backend.healthy:
            return False
        settings = pool.settings
        if settings.keepalive_timeout_s <= 0 or settings.proxy_protocol != "off":
            return False
        deadline = (protocol.last_active or self._clock()) + settings.keepalive_timeout_s
        return self.idle.park(backend, protocol, deadline, settings.keepalive_max_idle)

    def _finished(self, splice: Splice, exc: BaseException | None) -> None:
        self.splices.discard(splice)
        code = exc.code if isinstance(exc, TunnelError) else None
        if self.access_log is not None:
            log_stream(self.access_log, self._origin_id, splice, code)
        backend = splice.tag
        if backend is None:
            reserved, splice.reserved = splice.reserved, None
            if reserved is not None:  # ended before its connect task ran
                reserved.active -= 1
                self.queues.slot_freed(reserved.tag.pool)
            return
        backend.active -= 1
        tag = backend.tag
        self.queues.slot_freed(tag.pool)
        opened_at = splice.opened_at
        first_byte_at = splice.first_byte_at
        tag.counts.finished(
            splice.bytes_up,
            splice.bytes_down,
            first_byte_at - opened_at if first_byte_at else None,
            _monotonic() - opened_at,
        )
        if code == _UPSTREAM_RESET:
            self.metrics.stream_failures.labels(tag.pool, "UPSTREAM_RESET").inc()

    # -- shutdown ----------------------------------------------------------------------

    def stop_parking(self) -> None:
        """The drain has begun: close the parked connections and park no more."""
        self._parking = False
        self.idle.close_all()

    def cancel_all(self) -> None:
        """The drain deadline passed: reset every stream still in flight."""
        for splice in list(self.splices):
            if splice.stream is not None:
                splice.stream.abort(ErrorCode.CANCEL)
