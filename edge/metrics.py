"""The edge's Prometheus metrics.

Declared with ``prometheus_client``; in a multi-worker edge the supervisor sets
``PROMETHEUS_MULTIPROC_DIR`` before the workers start, so each worker writes its
own values and the admin endpoint merges them. Labels are bounded sets (status
codes, reasons, origin names), never client data.
"""

from __future__ import annotations

import bisect

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


class Tally:
    """Hot-path counting in plain integers, added to Prometheus by :meth:`publish`
    (the worker calls it once a second and the numbers are at most that stale).

    Why: in multiprocess mode every ``inc``/``observe`` takes a lock, calls
    ``getpid()`` and writes a memory-mapped file (0.85-1.7 us each); per request
    that was 7% of the edge's CPU in ``make bench-edge``. A dict increment is
    ~0.1 us, and publishing costs one ``inc`` per label per second.
    """

    __slots__ = ("_bounds", "_buckets", "_counts", "_histogram", "_sum")

    def __init__(self, histogram: Histogram = UPSTREAM_SECONDS) -> None:
        self._counts: dict[tuple[Counter, str | tuple[str, ...]], float] = {}
        self._histogram = histogram
        self._bounds = tuple(histogram._upper_bounds)  # type: ignore[attr-defined]
        self._buckets = [0] * len(self._bounds)
        self._sum = 0.0

    def add(self, counter: Counter, label: str | tuple[str, ...], amount: float = 1) -> None:
        """``label``: the label value, or a tuple of them for several labels."""
        key = (counter, label)
        self._counts[key] = self._counts.get(key, 0) + amount

    def observe(self, seconds: float) -> None:
        self._buckets[bisect.bisect_left(self._bounds, seconds)] += 1
        self._sum += seconds

    def publish(self) -> None:
        counts, self._counts = self._counts, {}
        for (counter, label), amount in counts.items():
            child = counter.labels(*label) if isinstance(label, tuple) else counter.labels(label)
            child.inc(amount)
        if any(self._buckets):
            # prometheus_client keeps per-bucket (non-cumulative) children and a
            # sum; adding to them is what ``observe`` does one value at a time.
            histogram = self._histogram
            for index, count in enumerate(self._buckets):
                if count:
                    histogram._buckets[index].inc(count)  # type: ignore[attr-defined]
            histogram._sum.inc(self._sum)  # type: ignore[attr-defined]
            self._buckets = [0] * len(self._bounds)
            self._sum = 0.0
