"""The origin's Prometheus series, declared once (names are ``geoedge_origin_*``).

Workers own the per-stream series, the parent owns health and worker counts;
in multiprocess mode the admin merges them (:mod:`geoedge.metrics`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from geoedge.metrics import LATENCY_BUCKETS, MetricSet

__all__ = ["ControlMetrics", "WorkerMetrics"]

NAMESPACE = "geoedge_origin"

#: Connects on the origin's own network: well under a millisecond to a timeout.
_LAN_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0, 5.0)


class WorkerMetrics:
    """Series a worker process updates."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = MetricSet(NAMESPACE, registry)
        self.registry = m.registry
        self.streams = m.counter(
            "streams", "Streams forwarded to a backend (connected).", ("pool", "backend")
        )
        self.streams_active = m.gauge(
            "streams_active", "Streams in flight to a backend.", ("pool", "backend")
        )
        self.reused = m.counter(
            "backend_connections_reused",
            "Streams that took an idle keep-alive connection instead of connecting.",
            ("pool", "backend"),
        )
        self.stream_failures = m.counter(
            "stream_failures",
            "Streams reset by the origin: NO_BACKEND, CONNECT_FAILED, UPSTREAM_RESET.",
            ("pool", "reason"),
        )
        self.bytes = m.counter(
            "bytes",
            "Stream payload octets forwarded, added when the stream ends;"
            " direction is to_backend or from_backend.",
            ("pool", "backend", "direction"),
        )
        self.connect_failures = m.counter(
            "connect_failures",
            "Failed TCP connects to a backend (refused, timeout, error).",
            ("pool", "backend", "reason"),
        )
        self.connect_retries = m.counter(
            "connect_retries", "Connects retried on another backend after a failure.", ("pool",)
        )
        self.ejections = m.counter(
            "backend_ejections",
            "Passive ejections after consecutive connect failures.",
            ("pool", "backend"),
        )
        self.ejected = m.gauge(
            "backend_ejected",
            "1 while a worker has the backend passively ejected.",
            ("pool", "backend"),
            mode="livemax",
        )
        self.edges_connected = m.gauge(
            "edges_connected", "Tunnel connections open, by edge identity.", ("edge",)
        )
        self.edge_rtt = m.gauge(
            "edge_rtt_seconds",
            "Smoothed RTT of an edge's tunnel (largest over its connections).",
            ("edge",),
            mode="livemax",
        )
        self.edge_sent_bytes = m.counter(
            "edge_sent_bytes",
            "Octets the origin's tunnel sockets sent to an edge, retransmissions included.",
            ("edge",),
        )
        self.edge_retransmitted_bytes = m.counter(
            "edge_retransmitted_bytes",
            "Of those, octets TCP sent again (a lossy path shows here; from TCP_INFO).",
            ("edge",),
        )
        self.edges_refused = m.counter(
            "edges_refused", "Tunnel connections refused, by reason.", ("reason",)
        )
        by = ("pool", "backend")
        self.connect_seconds = m.histogram(
            "backend_connect_seconds",
            "TCP connects to a backend (reused keep-alive connections not counted).",
            by,
            buckets=_LAN_BUCKETS,
        )
        self.first_byte_seconds = m.histogram(
            "backend_first_byte_seconds",
            "From a stream's arrival at the origin to the backend's first response octet.",
            by,
            buckets=LATENCY_BUCKETS,
        )
        self.queue_length = m.gauge(
            "queue_length",
            "Streams waiting for a backend slot (every usable backend at its cap).",
            ("pool",),
            mode="livesum",
        )
        self.queue_seconds = m.histogram(
            "queue_seconds",
            "Time streams waited for a backend slot (served or given up).",
            ("pool",),
            buckets=LATENCY_BUCKETS,
        )
        self.stream_seconds = m.histogram(
            "stream_duration_seconds",
            "Streams from their arrival at the origin to their end (WebSocket: the session).",
            by,
            buckets=LATENCY_BUCKETS,
        )


class ControlMetrics:
    """Series the parent (control plane) updates."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = MetricSet(NAMESPACE, registry)
        self.registry = m.registry
        self.backend_healthy = m.gauge(
            "backend_healthy",
            "1 when the backend passes its active health checks (or has none).",
            ("pool", "backend"),
            mode="livemax",
        )
        self.backend_drained = m.gauge(
            "backend_drained",
            "1 while drained through the admin API.",
            ("pool", "backend"),
            mode="livemax",
        )
        self.health_checks = m.counter(
            "health_checks",
            "Active health checks by result (pass, fail).",
            ("pool", "backend", "result"),
        )
        self.dns_resolutions = m.counter(
            "dns_resolutions", "DNS discovery lookups by result (ok, error).", ("pool", "result")
        )
        self.workers_running = m.gauge(
            "workers_running", "Worker processes running.", mode="livemax"
        )
        self.worker_restarts = m.counter("worker_restarts", "Workers restarted after dying.")
        self.reloads = m.counter("reloads", "SIGHUP reloads by result (ok, error).", ("result",))
        self.acme_expiry = m.gauge(
            "acme_certificate_expiry_timestamp_seconds",
            "notAfter (Unix time) of the ACME certificate the origin holds, per name.",
            ("certificate", "name"),
            mode="livemax",
        )
        self.acme_renew_at = m.gauge(
            "acme_renewal_due_timestamp_seconds",
            "When the ACME certificate is due for renewal (ARI or 2/3 of its lifetime).",
            ("certificate",),
            mode="livemax",
        )
        self.acme_failures = m.gauge(
            "acme_renewal_failures",
            "Failed ACME attempts in a row for the certificate (0 after a success).",
            ("certificate",),
            mode="livemax",
        )
        self.acme_edges = m.gauge(
            "acme_edges",
            "Edges by their answer to the current ACME certificate (applied, refused...).",
            ("certificate", "status"),
            mode="livemax",
        )
