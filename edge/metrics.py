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
TUNNEL_RTT = Gauge(
    "geoedge_edge_tunnel_rtt_seconds",
    "Smoothed tunnel RTT per origin (per worker)",
    ["origin"],
    multiprocess_mode="liveall",
)
TUNNELS_UP = Gauge(
    "geoedge_edge_tunnels_up",
    "Usable tunnel connections per origin",
    ["origin"],
    multiprocess_mode="livesum",
)
STREAMS_OPEN = Gauge(
    "geoedge_edge_tunnel_streams_open",
    "Open tunnel streams per origin",
    ["origin"],
    multiprocess_mode="livesum",
)
UPSTREAM_SECONDS = Histogram(
    "geoedge_edge_upstream_seconds",
    "Time to the first response byte through the tunnel",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
