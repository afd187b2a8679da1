"""The figures, the verdicts and the table of ``make bench-edge``
(:mod:`loadtests.bench_edge`), from the raw measurements in ``details``."""

from __future__ import annotations

import statistics
from typing import Any

CHAINS = ("geoedge", "haproxy")
#: Issue 26's bars (the per-hop CPU ones from the median run, in /proc times).
TARGETS = {
    "handshakes_ratio": (">=", 0.9),
    "keepalive_ratio": (">=", 0.42),
    "h2_ratio": (">=", 0.3),
    "added_latency_p50_ms": ("<=", 0.3),
    "ws_rss_kib_per_conn": ("<=", 25.0),
    "keepalive_edge_cpu_us": ("<=", 50.0),
    "keepalive_origin_cpu_us": ("<=", 25.0),
}


def best(runs: list[dict[str, Any]]) -> float:
    return float(max(run["per_s"] for run in runs))


def median_cost(runs: list[dict[str, Any]], unit: str) -> float:
    return float(statistics.median(run[f"server_cpu_us_per_{unit}"]["total"] for run in runs))


def cpu_per_hop(runs: list[dict[str, Any]], unit: str) -> dict[str, float]:
    """Microseconds of CPU per ``unit`` for each process of the chain (and in
    all), the median over the runs of each."""
    hops = runs[0][f"server_cpu_us_per_{unit}"]
    return {
        hop: round(statistics.median(run[f"server_cpu_us_per_{unit}"][hop] for run in runs), 1)
        for hop in hops
    }


def summarize(details: dict[str, Any]) -> dict[str, Any]:
    hs = details["handshakes"]["runs"]
    ka = details["keepalive"]["runs"]
    h2 = details["http2"]["runs"]
    lat = details["latency"]
    ws = details["websockets"]
    figures: dict[str, Any] = {
        "handshakes_per_s": best(hs["geoedge"]),
        "haproxy_handshakes_per_s": best(hs["haproxy"]),
        "keepalive_rps": best(ka["geoedge"]),
        "haproxy_keepalive_rps": best(ka["haproxy"]),
        "h2_rps": best(h2["geoedge"]),
        "haproxy_h2_rps": best(h2["haproxy"]),
        "added_latency_p50_ms": round(lat["geoedge"]["p50_ms"] - lat["direct"]["p50_ms"], 3),
        "haproxy_added_latency_p50_ms": round(
            lat["haproxy"]["p50_ms"] - lat["direct"]["p50_ms"], 3
        ),
        "ws_rss_kib_per_conn": ws["geoedge"]["kib_per_connection"]["edge_worker"],
        "haproxy_ws_rss_kib_per_conn": ws["haproxy"]["kib_per_connection"]["haproxy"],
    }
    figures["handshakes_ratio"] = round(
        figures["handshakes_per_s"] / max(1e-9, figures["haproxy_handshakes_per_s"]), 3
    )
    figures["keepalive_ratio"] = round(
        figures["keepalive_rps"] / max(1e-9, figures["haproxy_keepalive_rps"]), 3
    )
    figures["h2_ratio"] = round(figures["h2_rps"] / max(1e-9, figures["haproxy_h2_rps"]), 3)
    # CPU per request at each hop, from /proc (what a user pays in machines).
    for phase, key in ((ka, "keepalive"), (h2, "h2")):
        for chain in CHAINS:
            prefix = "" if chain == "geoedge" else "haproxy_"
            figures[f"{prefix}{key}_cpu_us_per_request"] = cpu_per_hop(phase[chain], "request")
    figures["keepalive_edge_cpu_us"] = figures["keepalive_cpu_us_per_request"]["edge"]
    figures["keepalive_origin_cpu_us"] = figures["keepalive_cpu_us_per_request"]["origin"]
    # Informational, and hardly moved by other load on the machine: HAProxy's
    # server CPU per unit of work over geoedge's (the median run of each).
    for phase, unit, key in (
        (hs, "connection", "handshakes_cpu_ratio"),
        (ka, "request", "keepalive_cpu_ratio"),
    ):
        cost = {chain: median_cost(phase[chain], unit) for chain in CHAINS}
        figures[key] = round(cost["haproxy"] / max(1e-9, cost["geoedge"]), 3)
    figures["passed"] = {
        key: (figures[key] >= limit if op == ">=" else figures[key] <= limit)
        for key, (op, limit) in TARGETS.items()
    }
    return figures


def warnings(details: dict[str, Any], websockets: int) -> list[str]:
    found = []
    for phase in ("handshakes", "keepalive", "http2"):
        for chain, runs in details[phase]["runs"].items():
            for run in runs:
                done = run.get("connections", run.get("requests", 0))
                if run["errors"] > 0.01 * max(1, done):
                    found.append(f"{phase} {chain}: {run['errors']} errors")
                if run["client_cpu_share"] > 0.95:
                    found.append(f"{phase} {chain}: client at {run['client_cpu_share']:.0%} CPU")
                if run["cpu0_busy"] < 0.9:
                    found.append(f"{phase} {chain}: CPU 0 only {run['cpu0_busy']:.0%} busy")
    for chain, ws in details["websockets"].items():
        if ws["held"] < websockets:
            found.append(f"websockets {chain}: {ws['failed']} failed ({ws['first_error']})")
    return found


def table(figures: dict[str, Any], details: dict[str, Any]) -> str:
    def verdict(key: str) -> str:
        return "pass" if figures["passed"][key] else "FAIL"

    def target(key: str, unit: str = "") -> str:
        op, limit = TARGETS[key]
        return f"{op} {limit:g}{unit}"

    rows = [
        ("figure", "geoedge", "haproxy", "ratio", "target", "result"),
        (
            "full handshakes/s",
            f"{figures['handshakes_per_s']:.0f}",
            f"{figures['haproxy_handshakes_per_s']:.0f}",
            f"{figures['handshakes_ratio']:.2f}",
            target("handshakes_ratio", "x"),
            verdict("handshakes_ratio"),
        ),
        (
            "keep-alive req/s",
            f"{figures['keepalive_rps']:.0f}",
            f"{figures['haproxy_keepalive_rps']:.0f}",
            f"{figures['keepalive_ratio']:.2f}",
            target("keepalive_ratio", "x"),
            verdict("keepalive_ratio"),
        ),
        (
            "http/2 req/s (h2load)",
            f"{figures['h2_rps']:.0f}",
            f"{figures['haproxy_h2_rps']:.0f}",
            f"{figures['h2_ratio']:.2f}",
            target("h2_ratio", "x"),
            verdict("h2_ratio"),
        ),
        (
            "added latency p50 ms",
            f"{figures['added_latency_p50_ms']:.3f}",
            f"{figures['haproxy_added_latency_p50_ms']:.3f}",
            "",
            target("added_latency_p50_ms"),
            verdict("added_latency_p50_ms"),
        ),
        (
            "KiB per idle WSS",
            f"{figures['ws_rss_kib_per_conn']:.1f}",
            f"{figures['haproxy_ws_rss_kib_per_conn']:.1f}",
            "",
            target("ws_rss_kib_per_conn"),
            verdict("ws_rss_kib_per_conn"),
        ),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lat = details["latency"]
    lines.append("")
    lines.append(
        "latency p50/p99 ms: "
        + ", ".join(f"{n} {s['p50_ms']:.3f}/{s['p99_ms']:.3f}" for n, s in lat.items())
    )
    for phase, unit in (
        ("handshakes", "connection"),
        ("keepalive", "request"),
        ("http2", "request"),
    ):
        parts = []
        for chain, runs in details[phase]["runs"].items():
            top = max(runs, key=lambda run: run["per_s"])
            cost = dict(top[f"server_cpu_us_per_{unit}"])
            total = cost.pop("total")
            split = ", ".join(f"{name} {us:.0f}" for name, us in cost.items())
            parts.append(
                f"  {chain}: {total:.0f} us server CPU per {unit} ({split}); "
                f"CPU0 {top['cpu0_busy']:.0%} busy, client {top['client_cpu_share']:.0%} CPU"
            )
        lines.append(f"{phase} (best run):")
        lines.extend(parts)
    lines.append(
        f"server CPU efficiency vs HAProxy: handshakes {figures['handshakes_cpu_ratio']:.2f}, "
        f"keep-alive {figures['keepalive_cpu_ratio']:.2f}"
    )
    lines.append(
        "CPU per keep-alive request, median run: edge "
        f"{figures['keepalive_edge_cpu_us']:.1f} us ({target('keepalive_edge_cpu_us')}: "
        f"{verdict('keepalive_edge_cpu_us')}), origin {figures['keepalive_origin_cpu_us']:.1f} us "
        f"({target('keepalive_origin_cpu_us')}: {verdict('keepalive_origin_cpu_us')})"
    )
    origin = details["websockets"]["geoedge"]["kib_per_connection"]["origin_worker"]
    lines.append(f"websockets: origin worker {origin:.1f} KiB per stream (not in the target)")
    return "\n".join(lines)
