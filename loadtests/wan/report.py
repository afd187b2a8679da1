"""The results of ``make wan``: ``wan.json``, the printed table and ``wan.png``.

``wan.json`` holds, for each scenario (``direct``, ``edge``, ``nginx``) and each key of
:data:`loadtests.wan.scenarios.MEASUREMENTS`, an object with ``p50_ms``,
``p90_ms``, ``p99_ms``, ``floor_ms`` and ``n`` (successful samples), plus
``failed`` (samples that errored) and ``samples_ms`` (every sample, so the chart
can be redrawn and other statistics computed later). ``speedup_p50`` is direct
p50 / edge p50 per measurement, ``vs_nginx_p50`` nginx p50 / edge p50 (above
1: geoedge's edge is faster than the nginx edge); ``locust`` summarises the
locust runs whose CSVs lie beside the file; ``config`` records delays,
sysctls, workers and counts. ``lossy`` holds one phase per loss rate
(``"loss_0.1%"``, ``"loss_1%"``): ``loss``, ``measured`` (the keys it took),
then the same per-scenario rows, ``speedup_p50`` and ``vs_nginx_p50``.

The chart has one panel per measurement: each scenario's samples as a box
(quartiles, whiskers at 1.5 IQR) over the individual samples, and the floor of
each scenario as a dashed line across its box.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loadtests.wan.scenarios import MEASUREMENTS, SCENARIOS, summarize

__all__ = ["build_results", "format_table", "read_locust_stats", "write", "write_chart"]

#: FreeAgent, "Speeding up SSL": 1322 ms direct vs 557 ms through a remote
#: balancer and an OpenVPN tunnel at 265 ms RTT.
SEED = {"direct_ms": 1322.0, "tunnel_ms": 557.0, "ratio": round(1322.0 / 557.0, 2)}
COLORS = {"direct": "#d95f02", "edge": "#1b9e77", "nginx": "#7570b3"}


def build_results(
    samples: Mapping[str, Mapping[str, list[float]]],
    errors: Mapping[str, Mapping[str, list[str]]],
    floors: Mapping[str, Mapping[str, float]],
    *,
    config: Mapping[str, Any],
    locust: Mapping[str, Any],
    elapsed_s: float,
) -> dict[str, Any]:
    """Everything that goes into ``wan.json``."""
    results: dict[str, Any] = {
        "generated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed_s, 1),
        "seed_freeagent": SEED,
    }
    results.update(_rows(samples, errors, floors, MEASUREMENTS))
    results["locust"] = dict(locust)
    results["config"] = dict(config)
    return results


def _rows(
    samples: Mapping[str, Mapping[str, list[float]]],
    errors: Mapping[str, Mapping[str, list[str]]],
    floors: Mapping[str, Mapping[str, float]],
    keys: Iterable[str],
) -> dict[str, Any]:
    """Per scenario, one row per key; then the ratios against the edge."""
    keys = list(keys)
    results: dict[str, Any] = {}
    for scenario in SCENARIOS:
        rows: dict[str, dict[str, Any]] = {}
        for key in keys:
            values = list(samples.get(scenario, {}).get(key, []))
            row: dict[str, Any] = dict(summarize(values, floors[scenario][key]))
            row["failed"] = len(errors.get(scenario, {}).get(key, []))
            row["samples_ms"] = [round(v, 2) for v in values]
            if row["failed"]:
                row["first_error"] = errors[scenario][key][0]
            rows[key] = row
        results[scenario] = rows
    results["speedup_p50"] = {key: speedup(results, key) for key in keys}
    results["vs_nginx_p50"] = {key: speedup(results, key, "nginx") for key in keys}
    return results


def build_phase(
    samples: Mapping[str, Mapping[str, list[float]]],
    errors: Mapping[str, Mapping[str, list[str]]],
    floors: Mapping[str, Mapping[str, float]],
    *,
    loss: float,
) -> dict[str, Any]:
    """One lossy phase of ``wan.json``: the keys it measured, rows as above."""
    measured = [k for k in MEASUREMENTS if any(k in samples.get(s, {}) for s in SCENARIOS)]
    return {"loss": loss, "measured": measured, **_rows(samples, errors, floors, measured)}


def speedup(results: Mapping[str, Any], key: str, over: str = "direct") -> float | None:
    """``over``'s p50 over the edge's (above 1: the edge is faster); None without samples."""
    if over not in results:
        return None
    other, edge = results[over][key]["p50_ms"], results["edge"][key]["p50_ms"]
    if not other or not edge:
        return None
    return round(float(other) / float(edge), 2)


def format_table(results: Mapping[str, Any]) -> str:
    """The tables printed at the end of the run (and pasted into the README): the
    loss-free one, then one per lossy phase."""
    lossy_only = results.get("config", {}).get("lossy_only", False)
    lines = [] if lossy_only else _table(results, list(MEASUREMENTS), "no loss")
    for label, phase in results.get("lossy", {}).items():
        lines += [""] if lines else []
        lines += _table(phase, phase["measured"], f"{label} loss on the long links")
    seed = results["seed_freeagent"]
    lines.append(
        f"speedup = direct p50 / edge p50; vs nginx = nginx p50 / edge p50; seed to beat "
        f"(FreeAgent, 265 ms RTT): {seed['direct_ms']:.0f} ms direct vs "
        f"{seed['tunnel_ms']:.0f} ms = {seed['ratio']}x"
    )
    emulator = results.get("config", {}).get("emulator")
    if emulator:
        links = emulator["links"].values()
        lines.append(
            f"emulator: {sum(x['dropped_loss'] for x in links)} packets dropped by configured "
            f"loss, {sum(x['dropped_queue'] for x in links)} by full queues, "
            f"NFQUEUE drops {emulator['nfqueue']}, netlink overruns "
            f"{emulator['netlink_overruns']}, release lateness mean "
            f"{emulator['late_mean_us']} us, max {emulator['late_max_us']} us"
        )
    for scenario, summary in results.get("locust", {}).items():
        for name, row in summary.get("requests", {}).items():
            lines.append(
                f"locust {scenario:<6} {name:<22} n={row['requests']:<6} "
                f"failures={row['failures']:<4} p50={row['p50_ms']} p90={row['p90_ms']} "
                f"p99={row['p99_ms']} ms"
            )
    return "\n".join(lines)


def _table(rows: Mapping[str, Any], keys: list[str], title: str) -> list[str]:
    header = (
        f"| {title:<26} | {'scenario':<8} | {'p50 ms':>8} | {'p90 ms':>8} | "
        f"{'p99 ms':>8} | {'floor ms':>8} | {'n':>4} | {'failed':>6} | {'speedup':>7} | "
        f"{'vs nginx':>8} |"
    )
    lines = [header, "|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|"]

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def ratio(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}x"

    for key in keys:
        for i, scenario in enumerate(SCENARIOS):
            row = rows[scenario][key]
            edge = scenario == "edge"
            lines.append(
                f"| {key if i == 0 else '':<26} | {scenario:<8} | "
                f"{num(row['p50_ms']):>8} | {num(row['p90_ms']):>8} | {num(row['p99_ms']):>8} | "
                f"{num(row['floor_ms']):>8} | {row['n']:>4} | {row['failed']:>6} | "
                f"{ratio(rows['speedup_p50'][key]) if edge else '':>7} | "
                f"{ratio(rows['vs_nginx_p50'][key]) if edge else '':>8} |"
            )
    return lines


def read_locust_stats(path: Path) -> dict[str, Any]:
    """Per request name: count, failures and percentiles from locust's ``*_stats.csv``."""
    if not path.exists():
        return {"requests": {}, "error": f"{path.name} was not written"}

    def number(text: str) -> float | None:
        try:
            value = float(text)
        except ValueError:
            return None
        return None if math.isnan(value) else value

    rows: dict[str, Any] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            name = f"{row['Type']} {row['Name']}".strip() if row["Type"] else row["Name"]
            rows[name] = {
                "requests": int(row["Request Count"]),
                "failures": int(row["Failure Count"]),
                "p50_ms": number(row["50%"]),
                "p90_ms": number(row["90%"]),
                "p99_ms": number(row["99%"]),
                "rps": number(row["Requests/s"]),
            }
    return {"requests": rows, "csv": path.name}


def write(results: Mapping[str, Any], directory: Path) -> None:
    """``wan.json``, ``wan.png`` and (after lossy phases) ``wan_lossy.png`` in ``directory``."""
    (directory / "wan.json").write_text(json.dumps(results, indent=1) + "\n")
    write_chart(results, directory / "wan.png")
    if results.get("lossy"):
        write_lossy_chart(results["lossy"], directory / "wan_lossy.png")


def write_lossy_chart(phases: Mapping[str, Any], path: Path) -> None:
    """One row per lossy phase, one panel per measurement it took."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = max(len(phase["measured"]) for phase in phases.values())
    fig, axes = plt.subplots(
        len(phases), columns, figsize=(4.0 * columns, 4.4 * len(phases)), squeeze=False
    )
    for row, (label, phase) in zip(axes, phases.items(), strict=True):
        for ax, key in zip(row, phase["measured"], strict=False):
            _panel(ax, phase, key)
            ax.set_title(f"{label}: {ax.get_title()}", fontsize=9)
        for ax in row[len(phase["measured"]) :]:
            ax.set_visible(False)
    fig.suptitle(
        "geoedge WAN latency with random loss on the long links (both ways); "
        "speedup = direct p50 / edge p50",
        fontsize=13,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_chart(results: Mapping[str, Any], path: Path) -> None:
    """One panel per measurement: direct vs edge distributions, floors dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(MEASUREMENTS)
    columns = 5
    rows = math.ceil(len(keys) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.0 * columns, 4.2 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        _panel(ax, results, key)
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    seed = results["seed_freeagent"]
    fig.suptitle(
        "geoedge WAN latency from a distant region (user 265 ms RTT from the origin, 10 ms from "
        f"the edge); speedup = direct p50 / edge p50; seed: {seed['ratio']}x",
        fontsize=13,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _panel(ax: Any, results: Mapping[str, Any], key: str) -> None:
    names = list(SCENARIOS)
    data = [results[s][key]["samples_ms"] for s in names]
    positions = list(range(1, len(names) + 1))
    plotted = [d if d else [math.nan] for d in data]
    boxes = ax.boxplot(plotted, positions=positions, widths=0.5, patch_artist=True,
                       showfliers=False, medianprops={"color": "black"})  # fmt: skip
    for patch, scenario in zip(boxes["boxes"], names, strict=True):
        patch.set_facecolor(COLORS[scenario])
        patch.set_alpha(0.35)
    for pos, values, scenario in zip(positions, data, names, strict=True):
        if values:
            jitter = [pos + 0.18 * math.sin(i * 2.399) for i in range(len(values))]
            ax.scatter(jitter, values, s=9, color=COLORS[scenario], alpha=0.7, zorder=3)
        floor = results[scenario][key]["floor_ms"]
        ax.hlines(floor, pos - 0.35, pos + 0.35, colors="black", linestyles="dashed", zorder=4)
    ratio = results["speedup_p50"][key]
    title = MEASUREMENTS[key].title
    idle_s = results.get("config", {}).get("plan", {}).get("idle_s", 30.0)
    if key.startswith("idle30") and idle_s != 30.0:  # a --quick or --idle-s run
        title = title.replace("30 s", f"{idle_s:g} s")
    title += "" if ratio is None else f"\nspeedup {ratio:.2f}x"
    ax.set_title(title, fontsize=10)
    ax.set_xticks(positions, [f"{s}\nn={results[s][key]['n']}" for s in names])
    ax.set_ylabel("ms (dashed: floor)")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
