"""One edge worker process: listeners, client connections, tunnels to origins.

Workers share nothing but the listening sockets and the TLS contexts (made
before the fork, so session tickets resume across workers); each keeps its own
tunnel pools (DESIGN.md principle 9). Timeouts are enforced by one sweep a
second over the open connections instead of a timer per connection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import sys
import time
from collections.abc import Callable

from edge import metrics
from edge.config import EdgeConfig, ListenerConfig
from edge.http1 import HttpLimits
from edge.listener import is_trusted, serve_proxy_listener
from edge.origins import OriginSet
from edge.proxy import ClientConnection
from edge.tls import CertificateStore
from edge.tls_transport import TlsListener
from edge.upstream import PendingRequest
from tunnel.aio.stream import TunnelStream
from tunnel.mux import StreamMetadata
from tunnel.runtime.logs import AccessLog

log = logging.getLogger("geoedge.edge")

SWEEP_INTERVAL_S = 1.0


class EdgeWorker:
    def __init__(
        self,
        config: EdgeConfig,
        certificates: CertificateStore,
        sockets: list[tuple[ListenerConfig | None, socket.socket]],
    ) -> None:
        self.config = config
        self.edge_id = config.edge.id
        self.http_limits: HttpLimits = config.http.limits
        self.certificates = certificates
        self._sockets = sockets
        self.origins = OriginSet(config.origins, config.tunnel)
        self.connections: set[ClientConnection] = set()
        self.draining = False
        self._servers: list[asyncio.Server] = []
        self._listeners: list[TlsListener] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._id_prefix = os.urandom(4).hex()
        self._pid = os.getpid()  # a worker never forks again; getpid is a syscall
        self._id_counter = itertools.count(1)
        self.access_log = _open_access_log(config)
        self.tally = metrics.Tally()
        self._stream_origin: dict[int, str] = {}

    # -- life cycle -----------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.origins.start()
        tls = self.config.tls
        for listener, sock in self._sockets:
            if listener is None:  # the plain-HTTP redirect listener
                server = await loop.create_server(
                    lambda r=self.config.redirect: ClientConnection(
                        self, trusted=False, scheme="http", redirect=r
                    ),
                    sock=sock,
                )
                self._servers.append(server)
            elif listener.proxy_protocol:
                self._tasks.append(
                    asyncio.create_task(
                        serve_proxy_listener(
                            sock,
                            listener,
                            self.certificates.context,
                            tls.handshake_timeout_s,
                            lambda client, trusted: ClientConnection(
                                self, trusted=trusted, client_address=client
                            ),
                            lambda reason: metrics.REFUSED.labels(reason).inc(),
                        )
                    )
                )
            else:
                self._listeners.append(
                    TlsListener(
                        sock,
                        self.certificates.context,
                        self._factory(listener),
                        tls.handshake_timeout_s,
                    )
                )
        self._tasks.append(asyncio.create_task(self._sweep()))

    def _factory(self, listener: ListenerConfig) -> Callable[[], ClientConnection]:
        networks = listener.trusted_proxies
        if not networks:  # nobody is trusted: skip the per-connection address check
            return lambda: ClientConnection(self, trusted=False)

        def factory() -> ClientConnection:
            return _TrustCheckingConnection(self, networks)

        return factory

    async def drain(self) -> None:
        """Stop accepting, close idle connections, let in-flight requests
        finish for up to ``drain_timeout_s``, then cut the rest and close the
        tunnels (GOAWAY). Idempotent."""
        if self.draining:
            return
        self.draining = True
        for server in self._servers:
            server.close()
        for tls_listener in self._listeners:
            tls_listener.close()
        for task in self._tasks:
            task.cancel()
        for connection in list(self.connections):
            if connection.state in ("idle", "head"):
                connection.close_idle("draining")
        deadline = time.monotonic() + self.config.edge.drain_timeout_s
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.close_idle("drain timeout")
        await self.origins.close(drain_timeout_s=1.0)
        self.tally.publish()
        if self.access_log is not None:
            self.access_log.close()

    def reload_certificates(self) -> None:
        try:
            self.certificates.reload()
        except Exception as exc:  # keep serving with the old certificates
            log.error("certificate reload failed, keeping the old ones: %s", exc)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self.tally.publish()
            self._close_timed_out(time.monotonic())
            self._export_tunnel_metrics()

    def _close_timed_out(self, now: float) -> None:
        # Not inline in _sweep: its loop variable would keep the last connection
        # alive (the sweep never returns) until the next sweep found another.
        http = self.config.http
        for connection in list(self.connections):
            idle_for = now - connection.last_activity
            state = connection.state
            if state == "head" and idle_for > http.header_timeout_s:
                connection.close_idle("header timeout")
            elif state == "idle" and idle_for > http.keepalive_timeout_s:
                connection.close_idle("keep-alive timeout")
            elif state == "tunnel" and idle_for > http.websocket_idle_timeout_s:
                connection.close_idle("websocket idle timeout")

    def _export_tunnel_metrics(self) -> None:
        metrics.CONNECTIONS_OPEN.set(len(self.connections))
        for stats in self.origins.statistics():
            metrics.TUNNELS_UP.labels(stats.name).set(stats.usable)
            metrics.STREAMS_OPEN.labels(stats.name).set(stats.open_streams)
            if stats.srtt_s is not None:
                metrics.TUNNEL_RTT.labels(stats.name).set(stats.srtt_s)

    # -- used by ClientConnection -----------------------------------------------------

    def new_request_id(self) -> str:
        return f"{self._id_prefix}{next(self._id_counter):08x}"

    def open_stream(
        self, metadata: StreamMetadata | bytes, factory: Callable[[], asyncio.BaseProtocol]
    ) -> TunnelStream:
        origin, stream = self.origins.open_stream(metadata, factory)
        protocol = stream.get_protocol()
        protocol.origin = origin  # type: ignore[attr-defined]
        return stream

    def connection_opened(self, connection: ClientConnection) -> None:
        self.connections.add(connection)
        tally = self.tally
        metadata = connection.metadata
        if metadata is not None and metadata.tls_version is not None:
            tally.add(metrics.CONNECTIONS, "https")
            resumed = "yes" if metadata.tls_resumed else "no"
            tally.add(metrics.HANDSHAKES, (metadata.tls_version, resumed))
        else:
            tally.add(metrics.CONNECTIONS, "http")

    def connection_closed(self, connection: ClientConnection) -> None:
        self.connections.discard(connection)

    def count_error(self, reason: str) -> None:
        self.tally.add(metrics.ERRORS, reason)

    def log_rejected(self, connection: ClientConnection, status: int) -> None:
        self.tally.add(metrics.REQUESTS, str(status))

    def log_request(
        self, connection: ClientConnection, request: PendingRequest, status_source: str = ""
    ) -> None:
        now = time.monotonic()
        status = request.status or (499 if status_source == "aborted" else 0)
        tally = self.tally
        tally.add(metrics.REQUESTS, str(status))
        tally.add(metrics.BYTES, "in", request.bytes_in)
        tally.add(metrics.BYTES, "out", request.bytes_out)
        upstream_ms = None
        if request.first_byte:
            upstream = request.first_byte - request.started
            tally.observe(upstream)
            upstream_ms = round(upstream * 1000, 3)
        if self.access_log is None:
            return
        meta = connection.metadata
        upstream_protocol = connection.upstream
        self.access_log.log(
            client_ip=meta.client_address[0] if meta and meta.client_address else None,
            method=request.method,
            host=request.host,
            path=request.path,
            status=status,
            bytes_in=request.bytes_in,
            bytes_out=request.bytes_out,
            duration_ms=round((now - request.started) * 1000, 3),
            upstream_ms=upstream_ms,
            origin=getattr(upstream_protocol, "origin", None),
            request_id=request.request_id,
            worker=self._pid,
        )


class _TrustCheckingConnection(ClientConnection):
    """A client connection whose trust (for X-Forwarded-*) depends on its peer."""

    def __init__(self, worker: EdgeWorker, networks: tuple[object, ...]) -> None:
        super().__init__(worker, trusted=False)
        self._networks = networks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        if peer and self._networks:
            self._trusted = is_trusted(peer[0], self._networks)
        super().connection_made(transport)


def _open_access_log(config: EdgeConfig) -> AccessLog | None:
    target = config.http.access_log
    if not target:
        return None
    return AccessLog(sys.stdout if target == "-" else target, edge_id=config.edge.id)
