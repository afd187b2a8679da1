"""The origin's status page (:mod:`geoedge.status_page`): the edges whose
tunnels it serves, and its pools and backends with their state, load and the
last minute's latency, with the drain and undrain buttons.

Backend state (health, drains) comes from the control plane; load and
latency from the workers' merged metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from geoedge.cert_expiry import CertificateWatch, certificates_table
from geoedge.status_page import Action, Cell, Row, StatusPage, Table, cell
from geoedge.status_window import (
    RETRANSMIT_BAD,
    RETRANSMIT_WARN,
    MetricsWindow,
    retransmit_ratio,
    workers_table,
)
from geoedge.version import package_version
from origin.control import ControlPlane

__all__ = ["OriginStatus"]

#: An edge's tunnel RTT this high (seconds) is shown as a warning.
RTT_WARN_S = 0.3


@dataclass
class OriginStatus:
    origin_id: str
    window: MetricsWindow
    control: ControlPlane
    #: (workers running, workers wanted, draining)
    workers: Callable[[], tuple[int, int, bool]]
    certificates: CertificateWatch | None = None
    #: The ACME certificates' table ([acme] configured).
    acme: Callable[[], Table] | None = None

    def sample(self) -> None:
        self.window.sample()

    def page(self) -> StatusPage:
        w = self.window
        running, target, draining = self.workers()
        streams = sum(w.rate("geoedge_origin_streams_total", ()).values())
        failures = sum(w.rate("geoedge_origin_stream_failures_total", ()).values())
        facts = [
            ("origin", Cell(self.origin_id)),
            ("version", Cell(package_version())),
            ("state", Cell("draining", "warn") if draining else Cell("serving", "ok")),
            ("workers", Cell(f"{running}/{target}", "" if running else "bad")),
            ("streams", cell(streams, "/s")),
            ("failed", cell(failures, "/s", bad=0.01)),
            ("queued", cell(sum(w.gauge("geoedge_origin_queue_length", ()).values()), warn=1)),
            ("window", Cell(f"{w.seconds:.0f} s")),
        ]
        return StatusPage(
            f"geoedge origin {self.origin_id}",
            facts,
            [self._edges(), self._backends(), self._failures(), workers_table(w, "origin")]
            + ([certificates_table(self.certificates)] if self.certificates else [])
            + ([self.acme()] if self.acme is not None else []),
        )

    def _edges(self) -> Table:
        w = self.window
        connections = w.gauge("geoedge_origin_edges_connected", ("edge",))
        rtt = w.gauge("geoedge_origin_edge_rtt_seconds", ("edge",), max)
        sent = w.rate("geoedge_origin_edge_sent_bytes_total", ("edge",))
        resent = w.rate("geoedge_origin_edge_retransmitted_bytes_total", ("edge",))
        rows = [
            Row(
                [
                    Cell(edge),
                    cell(count),
                    cell(rtt.get((edge,)), "s", warn=RTT_WARN_S),
                    cell(
                        retransmit_ratio(sent.get((edge,)), resent.get((edge,))),
                        "%",
                        warn=RETRANSMIT_WARN,
                        bad=RETRANSMIT_BAD,
                    ),
                ]
            )
            for (edge,), count in sorted(connections.items())
            if count > 0
        ]
        return Table(
            "Edges",
            ["edge", "tunnel connections", "RTT", "retransmitted"],
            rows,
            empty="no edge connected",
            note="Retransmitted: of the octets sent to the edge (responses), those TCP"
            " sent again (TCP_INFO). A path that loses packets shows here, not in the RTT;"
            " a slow origin shows in the backends' first byte instead.",
        )

    def _backends(self) -> Table:
        w = self.window
        by = ("pool", "backend")
        active = w.gauge("geoedge_origin_streams_active", by)
        ejected = w.gauge("geoedge_origin_backend_ejected", by, max)
        rate = w.rate("geoedge_origin_streams_total", by)
        first50 = w.quantile(0.5, "geoedge_origin_backend_first_byte_seconds", by)
        first95 = w.quantile(0.95, "geoedge_origin_backend_first_byte_seconds", by)
        connect95 = w.quantile(0.95, "geoedge_origin_backend_connect_seconds", by)
        rows = []
        for pool, backends in self.control.status().items():
            for address, state in backends.items():
                key = (pool, address)
                if state["drained"]:
                    shown = Cell("drained", "warn")
                elif not state["healthy"]:
                    shown = Cell("down", "bad")
                elif ejected.get(key, 0.0) > 0:
                    shown = Cell("ejected", "bad")
                else:
                    shown = Cell("up", "ok")
                base = f"/backends/{quote(pool, safe='')}/{quote(address, safe='')}"
                action = (
                    Action("undrain", f"{base}/undrain")
                    if state["drained"]
                    else Action("drain", f"{base}/drain")
                )
                rows.append(
                    Row(
                        [
                            Cell(pool),
                            Cell(address),
                            shown,
                            Cell(str(state["weight"])),
                            cell(active.get(key, 0.0)),
                            cell(rate.get(key), "/s"),
                            cell(first50.get(key), "s"),
                            cell(first95.get(key), "s"),
                            cell(connect95.get(key), "s"),
                        ],
                        [action],
                    )
                )
        return Table(
            "Backends",
            [
                "pool",
                "backend",
                "state",
                "weight",
                "in flight",
                "streams",
                "first byte p50",
                "first byte p95",
                "connect p95",
            ],
            rows,
            note="First byte: from a stream's arrival here to the backend's first response"
            " octet (Node's own time plus the local network). Drain: no new request goes to"
            " the backend; those in flight finish.",
            empty="no pool configured",
        )

    def _failures(self) -> Table:
        w = self.window
        rows = [
            Row([Cell(pool), Cell(reason), cell(value, "/s", bad=0.01)])
            for (pool, reason), value in sorted(
                w.rate("geoedge_origin_stream_failures_total", ("pool", "reason")).items()
            )
            if value > 0
        ]
        rows += [
            Row([Cell(pool), Cell(f"connect to {backend}: {reason}"), cell(value, "/s", warn=0.01)])
            for (pool, backend, reason), value in sorted(
                w.rate(
                    "geoedge_origin_connect_failures_total", ("pool", "backend", "reason")
                ).items()
            )
            if value > 0
        ]
        return Table(
            "Failures (last minute)",
            ["pool", "reason", "rate"],
            rows,
            empty="none in the last minute",
        )
