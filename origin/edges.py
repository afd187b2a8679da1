"""The tunnel connections edges hold open to one origin worker.

A connection counts once its handshake and the edge's identity check have
passed (its ``established`` future); a refused one is only counted, by
reason (:mod:`origin.admission`). The streams the connections carry are the
dispatcher's (:mod:`origin.dispatch`); this part sees the connections alone.
The edge's counterpart is :class:`edge.origins.OriginSet`, its tunnels to the
origins. :meth:`EdgeConnections.broadcast_control` sends a CONTROL message on
every connection (:mod:`origin.edge_control`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from geoedge.logs import log_event
from origin.admission import refusal_reason
from origin.edge_control import ControlOutcome, broadcast_on
from origin.metrics import WorkerMetrics
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.errors import PeerRefused
from tunnel.aio.tcp_info import RetransmitTally

__all__ = ["EdgeConnections"]

log = logging.getLogger("geoedge.origin")

#: What a GOAWAY from a draining worker says.
GOING_AWAY = "origin shutting down"


class EdgeConnections:
    """Owns one worker's established tunnel connections and their metrics
    (``edges_connected``, ``edge_rtt_seconds``, ``edge_sent_bytes``,
    ``edge_retransmitted_bytes``, ``edges_refused``).

    Invariants: a connection is a member from its ``established`` to its
    ``closed``, and ``edges_connected`` for an identity counts its members.
    Once :meth:`go_away` has run, every member has been sent GOAWAY, and so is
    a connection established later (an edge that raced the drain opens its
    streams elsewhere).
    """

    __slots__ = ("_connections", "_going_away", "_metrics", "_retransmits", "on_edge")

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics
        self._connections: set[TunnelConnection] = set()
        self._going_away = False
        self._retransmits = RetransmitTally()
        #: Called with each connection once established (the worker sends a
        #: newly connected edge the current ACME certificates from here).
        self.on_edge: Callable[[TunnelConnection], None] | None = None

    def __len__(self) -> int:
        return len(self._connections)

    def on_connection(self, connection: TunnelConnection) -> None:
        """A connection accepted, its handshake to come (``serve_tunnel``'s hook)."""
        connection.established.add_done_callback(
            lambda future: self._on_established(connection, future)
        )

    def _on_established(self, connection: TunnelConnection, future: asyncio.Future[None]) -> None:
        exc = None if future.cancelled() else future.exception()
        if isinstance(exc, PeerRefused):
            self.refused(refusal_reason(exc))
            return
        if exc is not None or future.cancelled():
            return
        identity = connection.info.peer_identity
        self._connections.add(connection)
        self._metrics.edges_connected.labels(identity).inc()
        log_event(
            log, "info", "edge connected", edge=identity, peer=str(connection.info.peer_address)
        )
        if self._going_away:
            connection.go_away(GOING_AWAY)
        elif self.on_edge is not None:
            self.on_edge(connection)

        def gone(_: object) -> None:
            self._connections.discard(connection)
            self._metrics.edges_connected.labels(identity).dec()

        connection.closed.add_done_callback(gone)

    def refused(self, reason: str) -> None:
        """An edge turned away (the TLS audit's sink, or its identity refused)."""
        self._metrics.edges_refused.labels(reason).inc()

    def publish_rtts(self) -> None:
        """Set each edge's RTT gauge (the largest smoothed RTT of its connections)
        and count the octets its tunnel sockets sent and retransmitted."""
        rtts: dict[str, float] = {}
        for connection in self._connections:
            srtt = connection.srtt_s
            identity = connection.info.peer_identity
            if srtt is not None:
                rtts[identity] = max(rtts.get(identity, 0.0), srtt)
        for identity, srtt in rtts.items():
            self._metrics.edge_rtt.labels(identity).set(srtt)
        sockets = [(c.info.peer_identity, c, c.tcp_info()) for c in self._connections]
        for identity, sent in self._retransmits.take(sockets).items():
            self._metrics.edge_sent_bytes.labels(identity).inc(sent.bytes)
            self._metrics.edge_retransmitted_bytes.labels(identity).inc(sent.retransmitted)

    async def broadcast_control(
        self, kind: int, body: bytes, timeout_s: float
    ) -> list[ControlOutcome]:
        """Send a CONTROL message (PROTOCOL.md §5.14) on every connection, and
        each one's outcome, by edge and address; ``timeout_s`` bounds each wait
        for an ACK."""
        connections = sorted(
            (c for c in self._connections if not c.closed.done()),
            key=lambda c: (c.info.peer_identity, c.info.peer_address or ("", 0)),
        )
        return await broadcast_on(connections, kind, body, timeout_s)

    # -- drain -------------------------------------------------------------------------

    def go_away(self) -> list[TunnelConnection]:
        """Send GOAWAY on every open connection, and on any established from now
        on; the connections it was sent on."""
        self._going_away = True
        connections = [c for c in self._connections if not c.closed.done()]
        for connection in connections:
            connection.go_away(GOING_AWAY)
        return connections

    @staticmethod
    async def wait_closed(
        connections: list[TunnelConnection], timeout_s: float
    ) -> list[TunnelConnection]:
        """Wait up to ``timeout_s`` for ``connections`` to close; those still open."""
        if connections:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await asyncio.gather(*(c.wait_closed() for c in connections))
        return [c for c in connections if not c.closed.done()]
