"""The edge's Prometheus series, declared once (names are ``geoedge_edge_*``).

A worker owns one :class:`EdgeMetrics`; in multiprocess mode (the daemon always
runs one, :mod:`edge.daemon`) each worker writes its own values and the admin
merges them (:mod:`geoedge.metrics`). The hot path counts through the worker's
:class:`~geoedge.metrics.Tally`, never per request on these objects. Labels are
bounded sets (status codes, reasons, origin names), never client data.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry

from geoedge.metrics import LATENCY_BUCKETS, MetricSet, Tally

__all__ = ["CACHE_EVENTS", "EdgeMetrics", "RequestTally"]

#: The ``event`` labels of ``geoedge_edge_cache_events_total``.
CACHE_EVENTS = (
    "hit", "miss", "stale", "revalidated", "stored", "collapsed", "pass", "evicted", "purged",
    "shared",
)  # fmt: skip

NAMESPACE = "geoedge_edge"

_RTT_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.0,
)  # fmt: skip


class EdgeMetrics:
    """Series an edge worker updates."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        m = MetricSet(NAMESPACE, registry)
        self.registry = m.registry
        self.connections = m.counter("connections", "Client connections accepted", ("listener",))
        self.connections_open = m.gauge("connections_open", "Client connections open")
        self.handshakes = m.counter(
            "tls_handshakes", "Completed TLS handshakes", ("version", "resumed")
        )
        self.requests = m.counter("requests", "Requests answered, by status", ("status",))
        self.bytes = m.counter("bytes", "Request/response bytes", ("direction",))
        self.errors = m.counter("errors", "Refusals and failures, by reason", ("reason",))
        self.refused = m.counter(
            "refused_connections", "Connections refused before HTTP", ("reason",)
        )
        self.tunnel_srtt = m.gauge(
            "tunnel_srtt_seconds",
            "Smoothed tunnel RTT per origin (per worker)",
            ("origin",),
            mode="liveall",
        )
        self.tunnels_up = m.gauge(
            "tunnels_up",
            "Usable tunnel connections per origin, once their window is warm",
            ("origin",),
        )
        self.streams_open = m.gauge(
            "tunnel_streams_open", "Open tunnel streams per origin", ("origin",)
        )
        self.request_seconds = m.histogram(
            "request_duration_seconds",
            "Requests from their head to the response's last octet (WebSocket: the session)",
            ("origin", "status_class", "protocol"),
            buckets=LATENCY_BUCKETS,
        )
        self.first_byte_seconds = m.histogram(
            "upstream_first_byte_seconds",
            "From a request's head to its response's first octet: tunnel, origin and backend",
            ("origin", "protocol"),
            buckets=LATENCY_BUCKETS,
        )
        self.transfer_seconds = m.histogram(
            "response_transfer_seconds",
            "From a response's first octet to its last (the client's and the tunnel's rate)",
            ("protocol",),
            buckets=LATENCY_BUCKETS,
        )
        self.tls_handshake_seconds = m.histogram(
            "tls_handshake_seconds",
            "Client TLS handshakes, from accept() to the handshake's end (the user's last mile)",
            ("version",),
            buckets=LATENCY_BUCKETS,
        )
        self.tunnel_sent_bytes = m.counter(
            "tunnel_sent_bytes",
            "Octets the edge's tunnel sockets sent per origin, retransmissions included",
            ("origin",),
        )
        self.tunnel_retransmitted_bytes = m.counter(
            "tunnel_retransmitted_bytes",
            "Of those, octets TCP sent again (a lossy path shows here; from TCP_INFO)",
            ("origin",),
        )
        self.tunnel_rtt_seconds = m.histogram(
            "tunnel_rtt_seconds",
            "Tunnel round-trip time per origin, sampled once a second per worker",
            ("origin",),
            buckets=_RTT_BUCKETS,
        )
        self.acme_events = m.counter(
            "acme_events",
            "ACME messages from the origin, by what became of them, and HTTP-01 answers",
            ("event",),
        )
        self.acme_certificate_expiry = m.gauge(
            "acme_certificate_expiry_timestamp_seconds",
            "notAfter (Unix time) of the ACME certificate served for each name: the"
            " earliest any live worker serves",
            ("certificate", "name"),
            mode="livemin",
        )
        self.cache_events = m.counter(
            "cache_events",
            "What the edge's cache did: hit, miss, stale (served stale), revalidated,"
            " stored, collapsed (a request waited for a fetch in flight), pass"
            " (hit-for-pass marks), evicted, purged, shared (found in the workers' shared tier)",
            ("event",),
        )
        self.cache_bytes_served = m.counter(
            "cache_served_bytes", "Response body octets served from the cache"
        )
        self.cache_entries = m.gauge("cache_entries", "Responses the cache holds (per worker)")
        self.cache_bytes = m.gauge(
            "cache_bytes", "Octets the cache holds, overheads included (per worker)"
        )
        self.cache_max_bytes = m.gauge("cache_max_bytes", "The cache's byte limit (per worker)")
        self._prime()

    def _prime(self) -> None:
        """Create the series whose labels are known at start, at zero.

        In multiprocess mode each value type has its own memory-mapped file, opened
        by the first series of that type; opening them all here keeps a worker's
        descriptor count flat from start (the tests count descriptors to find leaks)
        and lets dashboards see zeros instead of missing series.
        """
        for version in ("TLSv1.2", "TLSv1.3"):
            self.tls_handshake_seconds.labels(version)
        for protocol in ("h1", "h2", "ws"):
            self.transfer_seconds.labels(protocol)
        for event in CACHE_EVENTS:
            self.cache_events.labels(event)


class RequestTally:
    """A request's share of the metrics (requests by status, bytes in and out,
    the three latency histograms), summed per (status, origin, protocol) and
    handed to the worker's :class:`~geoedge.metrics.Tally` by :meth:`flush`.

    Why not six :class:`~geoedge.metrics.Tally` calls per request: each makes
    its key and looks it up, and the labels want a string per status and
    class; in the edge's keep-alive path that was ~31,000 machine instructions
    per request, 5% of the worker's (``make bench-hop-instructions``). Here a
    request is one key, one lookup and a few additions into one list:
    ``[count, bytes in, bytes out, request buckets..., sum, first-byte
    buckets..., sum, transfer buckets..., sum]``.
    """

    __slots__ = ("_bounds", "_metrics", "_series", "_width")

    def __init__(self, metrics: EdgeMetrics) -> None:
        self._metrics = metrics
        # The three histograms share their buckets (LATENCY_BUCKETS, then +Inf).
        self._bounds: list[float] = [*LATENCY_BUCKETS, float("inf")]
        self._width = 3 + 3 * (len(self._bounds) + 1)
        self._series: dict[tuple[int, str, str], list[float]] = {}

    def add(
        self,
        status: int,
        origin: str,
        protocol: str,
        bytes_in: int,
        bytes_out: int,
        duration_s: float,
        first_byte_s: float | None,
        transfer_s: float,
    ) -> None:
        """One request; ``first_byte_s`` None: no response octet came (then
        ``transfer_s`` is not counted either)."""
        key = (status, origin, protocol)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = [0.0] * self._width
        series[0] += 1
        series[1] += bytes_in
        series[2] += bytes_out
        bounds = self._bounds
        step = len(bounds) + 1
        series[3 + bisect_left(bounds, duration_s)] += 1
        series[2 + step] += duration_s
        if first_byte_s is not None:
            series[3 + step + bisect_left(bounds, first_byte_s)] += 1
            series[2 + 2 * step] += first_byte_s
            series[3 + 2 * step + bisect_left(bounds, transfer_s)] += 1
            series[2 + 3 * step] += transfer_s

    def flush(self, tally: Tally) -> None:
        """Hand what was summed since the last flush to ``tally``."""
        series, self._series = self._series, {}
        m = self._metrics
        step = len(self._bounds) + 1
        for (status, origin, protocol), sums in series.items():
            tally.add(m.requests, str(status), sums[0])
            tally.add(m.bytes, "in", sums[1])
            tally.add(m.bytes, "out", sums[2])
            status_class = f"{status // 100}xx"
            tally.add_buckets(
                m.request_seconds, (origin, status_class, protocol), sums[3 : 3 + step]
            )
            first_byte = sums[3 + step : 3 + 2 * step]
            if any(first_byte[:-1]):
                tally.add_buckets(m.first_byte_seconds, (origin, protocol), first_byte)
                tally.add_buckets(m.transfer_seconds, (protocol,), sums[3 + 2 * step :])
