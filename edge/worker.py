"""One edge worker process: listeners, client connections, tunnels to origins.

Workers share nothing but the listening sockets and the TLS contexts (made
before the fork, so session tickets resume across workers); each keeps its own
tunnel pools (DESIGN.md principle 9). Timeouts are enforced by one sweep a
second over the open connections instead of a timer per connection.

The worker is the services object its client connections and their exchanges
get (:class:`edge.services.EdgeServices`): they call it, never import it.

CONTROL messages from the origins (PROTOCOL.md §5.14) are answered by the
worker's handler table, :attr:`EdgeWorker.control_handlers`, which all its
tunnel connections share: the origin sends a message on every connection, so
it reaches every worker. ECHO is answered here; a feature adds its own kind
with ``worker.control_handlers.add(kind, handler)`` when it is built
(:mod:`tunnel.aio.control` says how a handler answers).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from edge.acme_responder import AcmeResponder
from edge.admission import ConnectionAdmission, RequestRate
from edge.cache import EdgeCache
from edge.cache.allocator import bound_large_blocks
from edge.config import EdgeConfig, ListenerConfig
from edge.deadlines import Deadlines
from edge.exchange import RequestRecord
from edge.exchange_wait import TunnelWait
from edge.front_h1 import Http1Connection
from edge.http1 import HttpLimits
from edge.http1.request_head import RequestIds
from edge.listener import Listener, ProxyListener, RedirectListener, TlsListener, is_trusted
from edge.metrics import EdgeMetrics, RequestTally
from edge.origins import OriginSet
from edge.services import ClientConnection, ClientFacts
from edge.tls import CertificateStore
from edge.ws_frames import CLOSE_SERVICE_RESTART
from geoedge.acme_wire import ACME_CERTIFICATE_SET, ACME_KINDS
from geoedge.cache_purge import PurgeError, parse_purge
from geoedge.logs import AccessLog, LogThrottle
from geoedge.metrics import ProcessMetrics, Tally
from geoedge.workers import resolve_worker_count, worker_share
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.control import ControlHandlers, ControlReply, echo
from tunnel.aio.stream import TunnelStream
from tunnel.aio.tcp_info import RetransmitTally
from tunnel.mux import ControlKind, ControlStatus

log = logging.getLogger("geoedge.edge")
throttled = LogThrottle(log)

SWEEP_INTERVAL_S = 1.0
#: How often a worker getting ready looks at its tunnels (a few seconds at most).
WARM_POLL_S = 0.05
#: How often a drain looks whether every connection is closed.
DRAIN_POLL_S = 0.05
#: A drain gives a connection with no request yet this long to send one: its
#: client finished the handshake and sent it, or is about to (one round trip
#: for TLS 1.2); answering it beats closing it unanswered.
DRAIN_FIRST_REQUEST_S = 2.0


class EdgeWorker:
    def __init__(
        self,
        config: EdgeConfig,
        certificates: CertificateStore,
        sockets: list[tuple[ListenerConfig | None, socket.socket]],
    ) -> None:
        self.config = config
        self.edge_id = config.edge.id
        http = config.http
        self.http = http
        self.http_limits: HttpLimits = http.limits
        self.tunnel_wait_s = http.tunnel_wait_s
        self.redirect = config.redirect
        self.deadlines = Deadlines(
            header_s=http.header_timeout_s,
            keepalive_s=http.keepalive_timeout_s,
            body_s=http.body_timeout_s,
            first_byte_s=http.first_byte_timeout_s,
            between_bytes_s=http.between_bytes_timeout_s,
            tunnel_idle_s=http.websocket_idle_timeout_s,
            long_poll_prefixes=http.long_poll_prefixes,
        )
        self.certificates = certificates
        hsts = config.tls.hsts_value()
        #: The Strict-Transport-Security field line of every HTTPS response, if on.
        self.hsts_field = None if hsts is None else f"Strict-Transport-Security: {hsts}".encode()
        self._sockets = sockets
        #: How this worker answers the origins' CONTROL messages, by kind.
        self.control_handlers = ControlHandlers({ControlKind.ECHO: echo})
        self.origins = OriginSet(
            config.origins,
            config.tunnel,
            self.control_handlers,
            on_goaway=self._tunnel_going_away,
        )
        self.connections: set[ClientConnection] = set()
        self.draining = False
        self._websocket_window_s = 0.0
        self._listeners: list[Listener] = []
        self._tasks: list[asyncio.Task[None]] = []
        # (a callable: the readers' request_id_factory, edge.http1.RequestIds)
        self.new_request_id = RequestIds(os.urandom(4).hex())
        self._pid = os.getpid()  # a worker never forks again; getpid is a syscall
        self.access_log = _open_access_log(config)
        self.tally = Tally()
        self._retransmits = RetransmitTally()
        self.metrics = EdgeMetrics()
        self.request_tally = RequestTally(self.metrics)
        self.process_metrics = ProcessMetrics("edge")
        caps = config.admission
        # The caps are per host: this worker enforces its share.
        workers = resolve_worker_count(config.edge.workers)
        self.admission = ConnectionAdmission(
            worker_share(caps.max_connections, workers),
            worker_share(caps.max_connections_per_client_ip, workers),
        )
        self.request_rate = RequestRate(caps.requests_per_s_per_client_ip, caps.request_burst)
        #: The worker's ACME tables (None without [acme] enabled).
        self.acme = (
            None
            if certificates.acme is None
            else AcmeResponder(
                certificates.acme,
                plain_http=config.redirect is not None,
                on_event=lambda event: self.tally.add(self.metrics.acme_events, event),
            )
        )
        if self.acme is not None:
            for kind in ACME_KINDS:
                self.control_handlers.add(kind, functools.partial(self._on_acme, kind))
        self.cache: EdgeCache | None = None
        self._cache_seen: dict[str, int] = {}
        self._cache_bytes_seen = 0
        if config.cache.enabled:
            bound_large_blocks()
        if config.cache.enabled or config.compression.enabled:
            self.cache = EdgeCache(
                config.cache,
                config.compression,
                config.edge.id,
                response_timeout_s=http.first_byte_timeout_s,
            )
        self.control_handlers.add(ControlKind.CACHE_PURGE, self.purge_from_origin)

    # -- life cycle -----------------------------------------------------------------

    async def start(self, *, accept: bool = True) -> None:
        """Dial the origins and start the sweep; accept clients now, or (``accept``
        False: other workers serve meanwhile) only once :meth:`accept` is called."""
        if self.certificates.acme is not None:
            # What other workers stored since the supervisor forked this one.
            self.certificates.load_acme()
            self._export_acme()
        self.origins.start()
        if accept:
            self.accept()
        self._tasks.append(asyncio.create_task(self._sweep()))

    def accept(self) -> None:
        """Start accepting clients on every listening socket (once; not while draining)."""
        if self._listeners or self.draining:
            return
        for listener, sock in self._sockets:
            self._listeners.append(self._listen(listener, sock))

    async def wait_warm(self) -> None:
        """Until a tunnel connection to some origin is up and warm
        (:mod:`tunnel.aio.warmup`): a request sent now crosses a grown window
        and queues behind no warm-up padding."""
        while not self.origins.any_warm:
            await asyncio.sleep(WARM_POLL_S)

    def _listen(self, listener: ListenerConfig | None, sock: socket.socket) -> Listener:
        """Start accepting on ``sock``: its listener's kind of connections."""
        tls = self.config.tls
        if listener is None:  # the plain-HTTP redirect listener
            return RedirectListener(
                sock, lambda: Http1Connection(self, trusted=False, scheme="http", redirect=True)
            )
        if listener.proxy_protocol != "off":
            return ProxyListener(
                sock,
                listener,
                self.certificates.context_for_alpn(listener.alpn),
                tls.handshake_timeout_s,
                self._proxied_factory(listener),
                lambda peer, reason: self.log_refused(peer, reason, "proxy_refused"),
                self.config.http.send_timeout_s,
                self.admit,
                self._tls_failed,
            )
        return TlsListener(
            sock,
            self.certificates.context_for_alpn(listener.alpn),
            self._factory(listener),
            tls.handshake_timeout_s,
            send_timeout_s=self.config.http.send_timeout_s,
            admit=self.admit,
            on_failed=self._tls_failed,
        )

    def _factory(self, listener: ListenerConfig) -> Callable[[], Http1Connection]:
        """Client connections of a TLS listener (HTTP/1.1, or HTTP/2 by ALPN)."""
        networks = listener.http_proxies
        if not networks:  # nobody is trusted: skip the per-connection address check
            return lambda: Http1Connection(self, trusted=False)

        def factory() -> Http1Connection:
            return _TrustCheckingConnection(self, networks)

        return factory

    def _tls_failed(self, peer: object, reason: str) -> None:
        self.log_refused(peer, reason, "tls_failed")

    def admit(self, client_ip: str) -> Callable[[], None] | None:
        """Admission of a new connection (edge.admission): the callable that
        releases its place, or None when it is refused (counted, logged rarely)."""
        refusal = self.admission.admit(client_ip)
        if refusal is not None:
            self.log_refused((client_ip,), f"{refusal.value} reached", refusal.value)
            return None
        release = self.admission.release
        return lambda: release(client_ip)

    def _proxied_factory(
        self, listener: ListenerConfig
    ) -> Callable[[tuple[str, int]], Http1Connection]:
        """Connections of a PROXY listener: the client is the header's source."""
        networks = listener.http_proxies

        def factory(client: tuple[str, int]) -> Http1Connection:
            trusted = bool(networks) and is_trusted(client[0], networks)
            return Http1Connection(self, trusted=trusted, client_address=client)

        return factory

    async def drain(self) -> None:
        """Stop accepting, close idle connections, let in-flight requests
        finish for up to ``drain_timeout_s``, then cut the rest and close the
        tunnels (GOAWAY). Idempotent."""
        if self.draining:
            return
        self.draining = True
        for accepting in self._listeners:
            accepting.close()
        # WebSockets closed at random moments over the window: their clients
        # reconnect spread out, not as one wave.
        edge = self.config.edge
        self._websocket_window_s = min(edge.drain_websocket_window_s, edge.drain_timeout_s)
        for connection in list(self.connections):
            self._drain_one(connection)
        # Until every connection this worker accepted is closed, those still in
        # their TLS handshake too (connection_opened drains them as they come):
        # a client whose handshake began before the drain gets its answer.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + edge.drain_timeout_s
        while (self.connections or self.admission.open_connections) and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        for task in self._tasks:
            task.cancel()
        for connection in list(self.connections):
            connection.close_now("drain timeout")
        await self.origins.close(drain_timeout_s=1.0)
        self.publish_metrics()
        if self.access_log is not None:
            self.access_log.close()

    def publish_metrics(self) -> None:
        """What the hot path summed since the last call, into Prometheus."""
        self.request_tally.flush(self.tally)
        self.tally.publish()

    def _tunnel_going_away(self, tunnel: TunnelConnection) -> None:
        """An origin told ``tunnel`` to go away (it reloads or stops): requests
        finish on it, new ones take another connection, but a WebSocket would
        last until the origin's drain deadline cut it. Each WebSocket on it is
        closed by the edge instead, with 1012 (service restart: reconnect),
        at a random moment within ``drain_websocket_window_s``, so its client
        reconnects through another tunnel connection, spread out. Keep that
        window below the origin's ``drain_timeout_s``."""
        loop = asyncio.get_running_loop()
        window = self.config.edge.drain_websocket_window_s
        closing = 0
        for connection in self.connections:
            for exchange in connection.websockets():
                upstream = exchange.upstream
                if upstream is not None and upstream.stream.get_extra_info("tunnel") is tunnel:
                    delay = random.uniform(0.0, window)
                    loop.call_later(delay, exchange.close_websocket, CLOSE_SERVICE_RESTART)
                    closing += 1
        if closing:
            log.info("closing %d WebSocket(s) of a tunnel going away over %g s", closing, window)

    def _drain_one(self, connection: ClientConnection) -> None:
        connection.drain(random.uniform(0.0, self._websocket_window_s), DRAIN_FIRST_REQUEST_S)

    def reopen_logs(self) -> None:
        """SIGUSR1: reopen the access log by name (after logrotate moved it)."""
        if self.access_log is not None:
            self.access_log.reopen()

    def reload_certificates(self) -> None:
        try:
            self.certificates.reload()
        except Exception as exc:  # keep serving with the old certificates
            log.error("certificate reload failed, keeping the old ones: %s", exc)

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            woke_at = loop.time() + SWEEP_INTERVAL_S
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self.process_metrics.sample(event_loop_lag_s=loop.time() - woke_at)
            self.publish_metrics()
            if self.access_log is not None:  # a quiet edge's last lines within a second
                self.access_log.flush()
            self._sweep_connections(time.monotonic())
            self._export_tunnel_metrics()
            self._export_acme()
            self._export_cache_metrics()
            if self.cache is not None:
                self.cache.apply_shared_invalidations()

    def _sweep_connections(self, now: float) -> None:
        # Not inline in _sweep: its loop variable would keep the last connection
        # alive (the sweep never returns) until the next sweep found another.
        for connection in list(self.connections):
            connection.sweep(now)

    def _export_acme(self) -> None:
        acme = self.certificates.acme
        if acme is None:
            return
        gauge = self.metrics.acme_certificate_expiry
        for stored in acme.certificates():
            for name in stored.names:
                gauge.labels(stored.id, name).set(stored.not_after)

    def _on_acme(self, kind: int, body: bytes) -> ControlReply:
        """A CONTROL message of an ACME kind (geoedge.acme_wire), applied here."""
        assert self.acme is not None
        applied = self.acme.apply(kind, body)
        if applied.applied and kind == ACME_CERTIFICATE_SET:
            self._export_acme()
        status = ControlStatus.APPLIED if applied.applied else ControlStatus.REFUSED
        return ControlReply(status, applied.reason)

    def acme_http01(self, host: str | None, path: str) -> str | None:
        return None if self.acme is None else self.acme.http01_answer(host, path)

    def _export_tunnel_metrics(self) -> None:
        self.metrics.connections_open.set(len(self.connections))
        for stats in self.origins.statistics():
            # Ready (healthz, systemd) once a connection is warm: the first large
            # response after a start then crosses a long link at full window.
            self.metrics.tunnels_up.labels(stats.name).set(stats.usable - stats.warming)
            self.metrics.streams_open.labels(stats.name).set(stats.open_streams)
            if stats.srtt_s is not None:
                self.metrics.tunnel_srtt.labels(stats.name).set(stats.srtt_s)
                self.tally.observe(self.metrics.tunnel_rtt_seconds, (stats.name,), stats.srtt_s)
        sockets = [
            (name, connection, connection.tcp_info())
            for name, pool in self.origins.pools.items()
            for connection in pool.connections
        ]
        for name, sent in self._retransmits.take(sockets).items():
            self.tally.add(self.metrics.tunnel_sent_bytes, name, sent.bytes)
            self.tally.add(self.metrics.tunnel_retransmitted_bytes, name, sent.retransmitted)

    def _export_cache_metrics(self) -> None:
        cache = self.cache
        if cache is None or not cache.enabled:
            return
        counters, store = cache.counters, cache.store
        now = {
            "hit": counters.hits,
            "miss": counters.misses,
            "stale": counters.stale_served,
            "revalidated": counters.revalidated,
            "stored": counters.stored,
            "collapsed": counters.collapsed_waits,
            "pass": counters.passes,
            "evicted": store.evictions,
            "purged": counters.purged,
            "shared": counters.shared,
        }
        seen = self._cache_seen
        for event, value in now.items():
            if value > seen.get(event, 0):
                self.metrics.cache_events.labels(event).inc(value - seen.get(event, 0))
        self._cache_seen = now
        served = counters.bytes_served - self._cache_bytes_seen
        if served > 0:
            self.metrics.cache_bytes_served.inc(served)
            self._cache_bytes_seen = counters.bytes_served
        self.metrics.cache_entries.set(len(store))
        self.metrics.cache_bytes.set(store.bytes_held)
        self.metrics.cache_max_bytes.set(store.max_bytes)

    def purge_from_origin(self, body: bytes) -> ControlReply:
        """CACHE_PURGE from an origin (PROTOCOL.md §5.14): drop what it names."""
        if self.cache is None or not self.cache.enabled:
            return ControlReply(ControlStatus.REFUSED, "the cache is off on this edge")
        try:
            purge = parse_purge(body)
        except PurgeError as exc:
            return ControlReply(ControlStatus.REFUSED, str(exc)[:200])
        count = self.cache.purge(purge.kind, purge.values)
        log.info("cache purge from an origin, %s: %d entries", purge.kind, count)
        return ControlReply(ControlStatus.APPLIED, f"purged {count} in worker {self._pid}")

    def on_control(self, message: dict[str, Any]) -> None:
        """A message from the parent (:func:`geoedge.workers.listen_control`)."""
        log.warning("unknown control message %r", message.get("op"))

    async def on_request(self, message: dict[str, Any]) -> dict[str, Any]:
        """A request from the parent that wants an answer (the admin API's purge)."""
        if message.get("op") != "cache_purge":
            raise ValueError(f"unknown request {message.get('op')!r}")
        purge = parse_purge(message["purge"])
        count = self.cache.purge(purge.kind, purge.values) if self.cache is not None else 0
        log.info("cache purge %s %s: %d entries", purge.kind, ", ".join(purge.values), count)
        self._export_cache_metrics()
        return {"purged": count}

    # -- edge.services.EdgeServices ------------------------------------------------------

    def ready(self) -> bool:
        return not self.draining and self.origins.any_usable

    def open_stream(
        self, metadata: bytes, factory: Callable[[], asyncio.BaseProtocol]
    ) -> tuple[str, TunnelStream]:
        return self.origins.open_stream(metadata, factory)

    def connection_opened(self, connection: ClientConnection, facts: ClientFacts) -> None:
        self.connections.add(connection)
        if self.draining:  # its handshake began before the drain
            self._drain_one(connection)
        tally, m = self.tally, self.metrics
        if facts.tls_version is not None:
            tally.add(m.connections, "https")
            tally.add(m.handshakes, (facts.tls_version, "yes" if facts.tls_resumed else "no"))
            if facts.tls_handshake_s is not None:
                tally.observe(m.tls_handshake_seconds, (facts.tls_version,), facts.tls_handshake_s)
        else:
            tally.add(m.connections, "http")

    def connection_closed(self, connection: ClientConnection) -> None:
        self.connections.discard(connection)

    def wait_for_tunnel(self, waiter: TunnelWait) -> bool:
        return self.origins.wait_for_tunnel(waiter)

    def stop_waiting_for_tunnel(self, waiter: TunnelWait) -> None:
        self.origins.stop_waiting(waiter)

    def count_error(self, reason: str) -> None:
        self.tally.add(self.metrics.errors, reason)

    def warn(self, message: str, *args: object) -> None:
        throttled.warning(message, *args)

    def log_refused(self, peer: object, reason: str, outcome: str) -> None:
        """A connection that ended before any request, for a reason: one line."""
        client_ip = peer[0] if isinstance(peer, tuple) and peer else None
        self.tally.add(self.metrics.refused, outcome)
        if outcome != "tls_failed":  # scanners fail handshakes all day: log line only
            throttled.warning("refused connection from %s: %s", client_ip, reason)
        if self.access_log is not None:
            self.access_log.log(
                client_ip=client_ip, method=None, host=None, path=None, status=0,
                bytes_in=0, bytes_out=0, duration_ms=0.0, worker=self._pid,
                outcome=outcome, reason=reason,
            )  # fmt: skip

    def log_request(
        self, record: RequestRecord, client_ip: str | None, sent: int, facts: ClientFacts
    ) -> None:
        """One access-log line, and the request's share of the metrics; ``sent``:
        octets of the response the client was sent. The phases: ``ttfb_ms``
        from the request's head to the response's first octet (tunnel, origin,
        backend), ``transfer_ms`` from there to the end; ``tls_ms`` is the
        connection's handshake (the user's last mile)."""
        now = time.monotonic()
        status = record.status
        protocol = record.protocol
        origin = record.origin or "-"
        duration = now - record.started
        first_byte = record.first_byte
        ttfb = first_byte - record.started if first_byte else None
        transfer = now - first_byte
        self.request_tally.add(
            status, origin, protocol, record.bytes_in, sent, duration, ttfb, transfer
        )
        if self.access_log is None:
            return
        ttfb_ms = transfer_ms = None
        if ttfb is not None:
            ttfb_ms = round(ttfb * 1000, 3)
            transfer_ms = round(transfer * 1000, 3)
        extra: dict[str, Any] = {"reason": record.reason} if record.reason else {}
        if record.cache:
            extra["cache"] = record.cache
        if protocol == "ws":
            extra["ws_close_code"] = record.ws_close_code
            extra["ws_closed_by"] = record.ws_closed_by
        handshake = facts.tls_handshake_s
        self.access_log.log(
            client_ip=client_ip,
            method=record.method,
            host=record.host,
            path=record.path,
            status=status,
            bytes_in=record.bytes_in,
            bytes_out=sent,
            duration_ms=round(duration * 1000, 3),
            upstream_ms=ttfb_ms,
            origin=record.origin,
            request_id=record.request_id or None,
            worker=self._pid,
            protocol=protocol,
            outcome=record.outcome,
            transfer_ms=transfer_ms,
            tls_ms=None if handshake is None else round(handshake * 1000, 3),
            tls_version=facts.tls_version,
            sni=facts.server_name,
            alpn=facts.alpn,
            user_agent=record.user_agent,
            trace_id=record.trace_id,
            **extra,
        )


class _TrustCheckingConnection(Http1Connection):
    """A client connection whose trust (for X-Forwarded-*) depends on its peer
    being one of the listener's ``http_proxies``."""

    def __init__(self, worker: EdgeWorker, networks: tuple[object, ...]) -> None:
        super().__init__(worker, trusted=False)
        self._networks = networks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        if peer and self._networks:
            self._trusted = is_trusted(peer[0], self._networks)
        super().connection_made(transport)


def _open_access_log(config: EdgeConfig) -> AccessLog | None:
    target = config.edge.access_log
    if not target:
        return None
    return AccessLog(sys.stdout if target == "-" else target, edge_id=config.edge.id)
