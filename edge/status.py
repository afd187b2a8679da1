"""The edge's status page (:mod:`geoedge.status_page`), from its merged metrics.

It answers "which hop got slower" for this edge over the last minute: the
clients' TLS handshakes (their last mile), each origin's tunnel RTT and time
to first byte through it (tunnel + origin + Node), and the transfer back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edge.acme_status import HeldCertificates
from edge.config import EdgeConfig
from geoedge.cert_expiry import CertificateWatch, certificates_table
from geoedge.status_page import Cell, Row, StatusPage, Table, cell
from geoedge.status_window import (
    RETRANSMIT_BAD,
    RETRANSMIT_WARN,
    MetricsWindow,
    retransmit_ratio,
    workers_table,
)
from geoedge.version import package_version
from geoedge.workers import SupervisorStatistics

__all__ = ["EdgeStatus"]

#: A tunnel RTT this high (seconds) is shown as a warning: slower than most paths.
RTT_WARN_S = 0.3


@dataclass
class EdgeStatus:
    config: EdgeConfig
    window: MetricsWindow
    supervisor: Callable[[], SupervisorStatistics]
    certificates: CertificateWatch | None = None
    #: The ACME certificates the edge holds ([acme] enabled), for their table.
    acme: HeldCertificates | None = None

    def sample(self) -> None:
        self.window.sample()

    def page(self) -> StatusPage:
        w = self.window
        stats = self.supervisor()
        requests = w.rate("geoedge_edge_requests_total", ("status",))
        total = sum(requests.values())
        errors = sum(rate for (status,), rate in requests.items() if status.startswith("5"))
        facts = [
            ("edge", Cell(self.config.edge.id)),
            ("version", Cell(package_version())),
            ("state", Cell("draining", "warn") if stats.stopping else Cell("serving", "ok")),
            ("workers", Cell(f"{stats.running}/{stats.target}", "" if stats.running else "bad")),
            ("requests", cell(total, "/s")),
            ("5xx", cell(errors / total if total else None, "%", warn=0.01, bad=0.05)),
            ("window", Cell(f"{w.seconds:.0f} s")),
        ]
        return StatusPage(
            f"geoedge edge {self.config.edge.id}",
            facts,
            [
                self._tunnels(),
                *([self._cache()] if self.config.cache.enabled else []),
                self._phases(),
                self._errors(),
                self._workers(),
            ]
            + ([certificates_table(self.certificates)] if self.certificates else [])
            + ([self.acme.table()] if self.acme is not None else []),
        )

    def _cache(self) -> Table:
        """What the cache did in the window and holds now (edge.cache; all workers)."""
        w = self.window
        events = {k[0]: v for k, v in w.rate("geoedge_edge_cache_events_total", ("event",)).items()}
        served = w.rate("geoedge_edge_cache_served_bytes_total", ()).get((), 0.0)
        entries = w.gauge("geoedge_edge_cache_entries", ()).get((), 0.0)
        held = w.gauge("geoedge_edge_cache_bytes", ()).get((), 0.0)
        limit = w.gauge("geoedge_edge_cache_max_bytes", ()).get((), 0.0)
        hits, misses = events.get("hit", 0.0), events.get("miss", 0.0)
        ratio = hits / (hits + misses) if hits + misses else None
        memory = f"{entries:.0f} responses, {held / 2**20:.1f} of {limit / 2**20:.0f} MiB"
        lines = [
            ("hit ratio", cell(ratio, "%"), "hits / (hits + misses)"),
            ("hits", cell(hits, "/s"), "served from the edge, stale ones too"),
            ("misses", cell(misses, "/s"), "went to the origin (revalidations too)"),
            ("stale served", cell(events.get("stale"), "/s"), "stale-while-revalidate, -if-error"),
            ("revalidated", cell(events.get("revalidated"), "/s"), "304s that freshened one"),
            ("collapsed", cell(events.get("collapsed"), "/s"), "waited for a fetch in flight"),
            ("evicted", cell(events.get("evicted"), "/s", warn=1.0), "the byte limit made room"),
            ("purged", cell(events.get("purged"), "/s"), "by the admin API or an origin"),
            ("served from the cache", Cell(f"{served / 1e6:.2f} MB/s"), "response bodies"),
            ("held", Cell(memory), "all workers; each has its own cache"),
        ]
        rows = [Row([Cell(what), value, Cell(meaning)]) for what, value, meaning in lines]
        return Table("Cache (last minute)", ["what", "value", "meaning"], rows)

    def _tunnels(self) -> Table:
        w = self.window
        up = w.gauge("geoedge_edge_tunnels_up", ("origin",))
        streams = w.gauge("geoedge_edge_tunnel_streams_open", ("origin",))
        srtt = w.gauge("geoedge_edge_tunnel_srtt_seconds", ("origin",), max)
        rtt95 = w.quantile(0.95, "geoedge_edge_tunnel_rtt_seconds", ("origin",))
        ttfb50 = w.quantile(0.5, "geoedge_edge_upstream_first_byte_seconds", ("origin",))
        ttfb95 = w.quantile(0.95, "geoedge_edge_upstream_first_byte_seconds", ("origin",))
        rate = w.rate("geoedge_edge_request_duration_seconds_count", ("origin",))
        sent = w.rate("geoedge_edge_tunnel_sent_bytes_total", ("origin",))
        resent = w.rate("geoedge_edge_tunnel_retransmitted_bytes_total", ("origin",))
        rows = []
        for origin in self.config.origins:
            key = (origin.name,)
            usable = up.get(key, 0.0)
            rows.append(
                Row(
                    [
                        Cell(origin.name),
                        Cell(origin.tunnel.address),
                        Cell("up", "ok") if usable > 0 else Cell("down", "bad"),
                        cell(usable),
                        cell(streams.get(key, 0.0)),
                        cell(srtt.get(key), "s", warn=RTT_WARN_S),
                        cell(rtt95.get(key), "s", warn=RTT_WARN_S),
                        cell(ttfb50.get(key), "s"),
                        cell(ttfb95.get(key), "s"),
                        cell(rate.get(key), "/s"),
                        cell(
                            retransmit_ratio(sent.get(key), resent.get(key)),
                            "%",
                            warn=RETRANSMIT_WARN,
                            bad=RETRANSMIT_BAD,
                        ),
                    ]
                )
            )
        return Table(
            "Tunnels",
            [
                "origin",
                "address",
                "state",
                "connections",
                "streams open",
                "RTT now",
                "RTT p95",
                "first byte p50",
                "first byte p95",
                "requests",
                "retransmitted",
            ],
            rows,
            note="First byte: from a request's head at the edge to its response's first"
            " octet, i.e. tunnel + origin + Node. Compare it with the RTT: the rest is the"
            " origin's side (see its status page). Retransmitted: of the octets the edge's"
            " tunnel sockets sent, those TCP sent again (TCP_INFO): a path that loses"
            " packets shows here, and on the origin's page for the other direction.",
        )

    def _phases(self) -> Table:
        w = self.window
        rows = []
        handshake = w.quantile(0.5, "geoedge_edge_tls_handshake_seconds", ("version",))
        handshake95 = w.quantile(0.95, "geoedge_edge_tls_handshake_seconds", ("version",))
        for (version,), p50 in sorted(handshake.items()):
            if p50 is None:  # a series primed at start that saw nothing yet
                continue
            rows.append(
                Row(
                    [
                        Cell(f"TLS handshake ({version})"),
                        cell(p50, "s"),
                        cell(handshake95.get((version,)), "s"),
                        Cell("the client's last mile"),
                    ]
                )
            )
        transfer = w.quantile(0.5, "geoedge_edge_response_transfer_seconds", ("protocol",))
        transfer95 = w.quantile(0.95, "geoedge_edge_response_transfer_seconds", ("protocol",))
        for (protocol,), p50 in sorted(transfer.items()):
            if p50 is None:
                continue
            rows.append(
                Row(
                    [
                        Cell(f"transfer ({protocol})"),
                        cell(p50, "s"),
                        cell(transfer95.get((protocol,)), "s"),
                        Cell("first to last response octet: the client's and the tunnel's rate"),
                    ]
                )
            )
        total = w.quantile(0.5, "geoedge_edge_request_duration_seconds", ("protocol",))
        total95 = w.quantile(0.95, "geoedge_edge_request_duration_seconds", ("protocol",))
        for (protocol,), p50 in sorted(total.items()):
            if p50 is None:
                continue
            what = "a WebSocket's whole session" if protocol == "ws" else "head to last octet"
            p95 = total95.get((protocol,))
            rows.append(
                Row([Cell(f"request ({protocol})"), cell(p50, "s"), cell(p95, "s"), Cell(what)])
            )
        return Table(
            "Where the time goes (last minute)",
            ["phase", "p50", "p95", "what it measures"],
            rows,
            empty="no requests in the last minute",
        )

    def _errors(self) -> Table:
        w = self.window
        rows = [
            Row([Cell(reason), cell(rate, "/s", bad=0.01)])
            for (reason,), rate in sorted(w.rate("geoedge_edge_errors_total", ("reason",)).items())
            if rate > 0
        ]
        rows += [
            Row([Cell(f"refused: {reason}"), cell(rate, "/s", warn=0.01)])
            for (reason,), rate in sorted(
                w.rate("geoedge_edge_refused_connections_total", ("reason",)).items()
            )
            if rate > 0
        ]
        return Table(
            "Refusals and failures (last minute)",
            ["reason", "rate"],
            rows,
            empty="none in the last minute",
        )

    def _workers(self) -> Table:
        return workers_table(self.window, "edge")
