"""The edge's Prometheus metrics.

Declared with ``prometheus_client``; in a multi-worker edge the supervisor sets
``PROMETHEUS_MULTIPROC_DIR`` before the workers start, so each worker writes its
own values and the admin endpoint merges them. Labels are bounded sets (status
codes, reasons, origin names), never client data.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CONNECTIONS = Counter("geoedge_edge_connections", "Client connections accepted", ["listener"])
CONNECTIONS_OPEN = Gauge(
    "geoedge_edge_connections_open", "Client connections open", multiprocess_mode="livesum"
)
HANDSHAKES = Counter(
    "geoedge_edge_tls_handshakes", "Completed TLS handshakes", ["version", "resumed"]
)
REQUESTS = Counter("geoedge_edge_requests", "Requests answered, by status", ["status"])
BYTES = Counter("geoedge_edge_bytes", "Request/response bytes", ["direction"])
ERRORS = Counter("geoedge_edge_errors", "Refusals and failures, by reason", ["reason"])
REFUSED = Counter("geoedge_edge_refused_connections", "Connections refused before HTTP", ["reason"])
TUNNEL_SRTT = Gauge(
    "geoedge_edge_tunnel_srtt_seconds",
    "Smoothed tunnel RTT per origin (per worker)",
    ["origin"],
    multiprocess_mode="liveall",
)
TUNNELS_UP = Gauge(
    "geoedge_edge_tunnels_up",
    "Usable tunnel connections per origin, once their window is warm",
    ["origin"],
    multiprocess_mode="livesum",
)
STREAMS_OPEN = Gauge(
    "geoedge_edge_tunnel_streams_open",
    "Open tunnel streams per origin",
    ["origin"],
    multiprocess_mode="livesum",
)

#: Request latencies span a few ms (near users, keep-alive) to seconds (far origins);
#: finer between 50 ms and 1 s, where inter-region round trips fall, so that a
#: 100-200 ms change moves a quantile (the status page's and the dashboard's).
_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.6, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip

REQUEST_SECONDS = Histogram(
    "geoedge_edge_request_duration_seconds",
    "Requests from their head to the response's last octet (WebSocket: the session)",
    ["origin", "status_class", "protocol"],
    buckets=_LATENCY_BUCKETS,
)
FIRST_BYTE_SECONDS = Histogram(
    "geoedge_edge_upstream_first_byte_seconds",
    "From a request's head to its response's first octet: tunnel, origin and backend",
    ["origin", "protocol"],
    buckets=_LATENCY_BUCKETS,
)
TRANSFER_SECONDS = Histogram(
    "geoedge_edge_response_transfer_seconds",
    "From a response's first octet to its last (the client's and the tunnel's rate)",
    ["protocol"],
    buckets=_LATENCY_BUCKETS,
)
TLS_HANDSHAKE_SECONDS = Histogram(
    "geoedge_edge_tls_handshake_seconds",
    "Client TLS handshakes, from accept() to the handshake's end (the user's last mile)",
    ["version"],
    buckets=_LATENCY_BUCKETS,
)
_RTT_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.0,
)  # fmt: skip
TUNNEL_RTT_SECONDS = Histogram(
    "geoedge_edge_tunnel_rtt_seconds",
    "Tunnel round-trip time per origin, sampled once a second per worker",
    ["origin"],
    buckets=_RTT_BUCKETS,
)


def prime() -> None:
    """Create the series whose labels are known at start, at zero.

    In multiprocess mode each value type has its own memory-mapped file, opened
    by the first series of that type; opening them all here keeps a worker's
    descriptor count flat from start (the tests count descriptors to find leaks)
    and lets dashboards see zeros instead of missing series.
    """
    for version in ("TLSv1.2", "TLSv1.3"):
        TLS_HANDSHAKE_SECONDS.labels(version)
    for protocol in ("h1", "h2", "ws"):
        TRANSFER_SECONDS.labels(protocol)
