"""``make soak``: does the edge give back what its connections took?

Real processes (:mod:`loadtests.soak_stack`): two Node.js backends, the origin
and the edge, one worker each. The soak runs *cycles*; each one

1. opens ``--websockets`` WSS connections (each echoes a message) and holds
   them for ``--hold-s`` while ``--short`` short connections of ten kinds run
   beside them: plain and keep-alive requests, TLS 1.2, clients that vanish
   mid-response or mid-request, heads cut short, bad requests, aborted TLS
   handshakes (:mod:`loadtests.soak_clients`);
2. echoes once more on every WebSocket, then closes them all (every tenth
   client vanishes with a reset instead of a close handshake);
3. waits until the edge has no connection and the origin no stream open, then
   ``--idle-s`` more (longer than the workers' 30 s heap trim interval,
   :mod:`geoedge.memory`), and takes the cycle's *idle* figures.

Every ``--sample-s`` a sampler records each worker's RSS and open descriptors
(``/proc``), asyncio tasks and open connections (admin ``/metrics``). At the end,
each daemon's memory report (``SIGUSR2``) says which of its classes have more
live instances than after the warm-up, counted before any collection.

Drift = last cycle's idle RSS against the first cycle's; the goal is within 5%.
The run stops after ``--cycles`` or, without it, at the first cycle end past
``--minutes`` (30 by default). The issue's check is
``--websockets 9000 --cycles 3``; ``--quick`` is the ~30 s smoke run of
``make test``. Mind the 20,000 descriptors per process: the edge holds one per
WebSocket, the origin one per backend connection, this client one per
connection; each Node backend holds its share.

Writes ``loadtests/results/soak.json`` (``--results``) and prints a table per cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import uvloop

from loadtests.soak_clients import Outcomes, Target, WebSocketBatch, client_context, run_short_mix
from loadtests.soak_stack import SoakStack, metric_sum

RESULTS = Path(__file__).parent / "results" / "soak.json"
DAEMONS = ("edge", "origin")
#: Drift of the idle RSS, last cycle against the first, that passes.
DRIFT_GOAL_PCT = 5.0
#: Live instances a class may gain over the whole soak, counted when all is idle.
CENSUS_SLACK = 0
#: Parked backend connections are closed after keepalive_timeout_s (3 s by default).
PARKED_S = 4.0


@dataclass(frozen=True, slots=True)
class Settings:
    minutes: float = 30.0
    cycles: int | None = None
    websockets: int = 3000
    short: int = 2000
    hold_s: float = 30.0
    idle_s: float = 45.0
    sample_s: float = 10.0
    concurrency: int = 64
    short_concurrency: int = 16
    backends: int = 2
    warmup: int = 50
    judge_drift: bool = True
    """False for the smoke run: too short for the heap trim, too small to measure."""


QUICK = Settings(
    minutes=1.0,
    cycles=3,
    websockets=150,
    short=150,
    hold_s=1.0,
    idle_s=PARKED_S,
    sample_s=2.0,
    warmup=20,
    judge_drift=False,
)


@dataclass
class Phase:
    """Where the run is, for the samples."""

    cycle: int = 0
    name: str = "warmup"


@dataclass
class CycleFigures:
    cycle: int
    websockets_ok: int
    short_ok: int
    failed: int
    seconds: float
    held_rss_kib: dict[str, int] = field(default_factory=dict)
    idle_rss_kib: dict[str, int] = field(default_factory=dict)
    peak_rss_kib: dict[str, int] = field(default_factory=dict)
    idle_fds: dict[str, int] = field(default_factory=dict)
    idle_tasks: dict[str, int] = field(default_factory=dict)


class Sampler:
    """Every ``interval_s``: RSS, fds, tasks and open connections of both workers."""

    def __init__(self, stack: SoakStack, phase: Phase, interval_s: float) -> None:
        self.stack = stack
        self.phase = phase
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self.started = time.monotonic()

    def sample(self) -> dict[str, Any]:
        stack = self.stack
        row: dict[str, Any] = {
            "t_s": round(time.monotonic() - self.started, 1),
            "cycle": self.phase.cycle,
            "phase": self.phase.name,
        }
        texts = {name: stack.metrics(name) for name in DAEMONS}
        for name in DAEMONS:
            facts = stack.facts(name)
            row[f"{name}_rss_kib"] = facts.rss_kib
            row[f"{name}_fds"] = facts.open_fds
            row[f"{name}_tasks"] = int(
                metric_sum(texts[name], f"geoedge_{name}_worker_asyncio_tasks")
            )
        row["edge_connections"] = int(metric_sum(texts["edge"], "geoedge_edge_connections_open"))
        row["origin_streams"] = int(metric_sum(texts["origin"], "geoedge_origin_streams_active"))
        return row

    async def run(self) -> None:
        while True:
            self.samples.append(await asyncio.to_thread(self.sample))
            await asyncio.sleep(self.interval_s)


async def wait_idle(stack: SoakStack, timeout_s: float = 120.0) -> None:
    """Until the edge has no client connection and the origin no stream."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        edge = metric_sum(
            await asyncio.to_thread(stack.metrics, "edge"), "geoedge_edge_connections_open"
        )
        origin = metric_sum(
            await asyncio.to_thread(stack.metrics, "origin"), "geoedge_origin_streams_active"
        )
        if edge == 0 and origin == 0:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError("connections still open long after every client closed")


async def run_cycle(
    index: int, stack: SoakStack, target: Target, settings: Settings, phase: Phase, sampler: Sampler
) -> CycleFigures:
    started = time.monotonic()
    outcomes = Outcomes()
    batch = WebSocketBatch(target, outcomes)
    phase.cycle, phase.name = index, "open"
    mix = asyncio.create_task(
        run_short_mix(target, settings.short, settings.short_concurrency, outcomes, start=index * 7)
    )
    await batch.open_many(settings.websockets, settings.concurrency)
    held = {name: stack.facts(name).rss_kib for name in DAEMONS}
    phase.name = "hold"
    await asyncio.sleep(settings.hold_s)
    await mix
    await batch.echo_all(settings.concurrency)
    phase.name = "close"
    await batch.close_all(settings.concurrency)
    await wait_idle(stack)
    phase.name = "idle"
    await asyncio.sleep(max(settings.idle_s, PARKED_S))
    idle = await asyncio.to_thread(sampler.sample)
    sampler.samples.append(idle)
    stack.check_alive()
    in_cycle = [s for s in sampler.samples if s["cycle"] == index]
    ws_ok = outcomes.ok["ws_echo"]
    short_ok = sum(n for kind, n in outcomes.ok.items() if not kind.startswith("ws_"))
    if outcomes.errors:
        print(f"  cycle {index}: {outcomes.total_failed} failed, e.g. {outcomes.errors[:3]}")
    return CycleFigures(
        cycle=index,
        websockets_ok=ws_ok,
        short_ok=short_ok,
        failed=outcomes.total_failed,
        seconds=round(time.monotonic() - started, 1),
        held_rss_kib=held,
        idle_rss_kib={name: idle[f"{name}_rss_kib"] for name in DAEMONS},
        peak_rss_kib={
            name: max([held[name], *(s[f"{name}_rss_kib"] for s in in_cycle)]) for name in DAEMONS
        },
        idle_fds={name: idle[f"{name}_fds"] for name in DAEMONS},
        idle_tasks={name: idle[f"{name}_tasks"] for name in DAEMONS},
    )


def census_growth(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Classes with more live instances in ``after``'s report than in ``before``'s."""
    old, new = before["live"], after["live"]
    return {cls: n - old.get(cls, 0) for cls, n in new.items() if n - old.get(cls, 0) > 0}


def drift_pct(cycles: list[CycleFigures], name: str) -> float:
    first, last = cycles[0].idle_rss_kib[name], cycles[-1].idle_rss_kib[name]
    return round(100.0 * (last - first) / first, 2)


def table(cycles: list[CycleFigures]) -> str:
    head = (
        f"{'cycle':>5} {'ws ok':>6} {'short ok':>8} {'failed':>6} {'s':>6} "
        f"{'edge MB held/peak/idle':>23} {'origin MB held/peak/idle':>25} "
        f"{'fds e/o':>9} {'tasks e/o':>9}"
    )
    rows = [head]
    for c in cycles:
        memory = {
            name: "/".join(
                f"{figures[name] / 1024:.1f}"
                for figures in (c.held_rss_kib, c.peak_rss_kib, c.idle_rss_kib)
            )
            for name in DAEMONS
        }
        rows.append(
            f"{c.cycle:>5} {c.websockets_ok:>6} {c.short_ok:>8} {c.failed:>6} {c.seconds:>6.0f} "
            f"{memory['edge']:>23} {memory['origin']:>25} "
            f"{c.idle_fds['edge']:>4}/{c.idle_fds['origin']:<4} "
            f"{c.idle_tasks['edge']:>4}/{c.idle_tasks['origin']:<4}"
        )
    return "\n".join(rows)


async def soak(stack: SoakStack, settings: Settings) -> dict[str, Any]:
    target = Target("127.0.0.1", stack.ports.edge, client_context(str(stack.keys.ca)))
    phase = Phase()
    sampler = Sampler(stack, phase, settings.sample_s)
    sampling = asyncio.create_task(sampler.run())
    warmup = Outcomes()
    batch = WebSocketBatch(target, warmup)
    await batch.open_many(settings.warmup, settings.concurrency)
    await run_short_mix(target, settings.warmup, settings.short_concurrency, warmup)
    await batch.close_all(settings.concurrency)
    await wait_idle(stack)
    await asyncio.sleep(PARKED_S)
    baseline = {name: await asyncio.to_thread(stack.memory_report, name) for name in DAEMONS}
    deadline = time.monotonic() + settings.minutes * 60
    cycles: list[CycleFigures] = []
    try:
        while True:
            figures = await run_cycle(len(cycles) + 1, stack, target, settings, phase, sampler)
            cycles.append(figures)
            print(
                f"cycle {figures.cycle}: {figures.websockets_ok} WebSockets, "
                f"{figures.short_ok} short, {figures.failed} failed, idle RSS edge "
                f"{figures.idle_rss_kib['edge'] / 1024:.1f} MB, origin "
                f"{figures.idle_rss_kib['origin'] / 1024:.1f} MB",
                flush=True,
            )
            if settings.cycles is not None:
                if len(cycles) >= settings.cycles:
                    break
            elif time.monotonic() >= deadline:
                break
    finally:
        sampling.cancel()
    final = {name: await asyncio.to_thread(stack.memory_report, name) for name in DAEMONS}
    growth = {name: census_growth(baseline[name], final[name]) for name in DAEMONS}
    drift = {name: drift_pct(cycles, name) for name in DAEMONS}
    leaks = {
        name: {cls: n for cls, n in growth[name].items() if n > CENSUS_SLACK} for name in DAEMONS
    }
    return {
        "cycles": [asdict(c) for c in cycles],
        "drift_pct": drift,
        "census_growth": growth,
        "unreachable_at_end": {name: final[name]["unreachable"] for name in DAEMONS},
        "tasks": {
            name: {
                "after_warmup": baseline[name]["asyncio_tasks"],
                "at_end": final[name]["asyncio_tasks"],
            }
            for name in DAEMONS
        },
        "reports": {"baseline": baseline, "final": final},
        "failed": sum(c.failed for c in cycles),
        "passed": {
            # None: not judged (a quick run is too short for the RSS to settle).
            "drift": all(abs(d) <= DRIFT_GOAL_PCT for d in drift.values())
            if settings.judge_drift
            else None,
            "no_failures": all(c.failed == 0 for c in cycles),
            "census": not any(leaks.values()),
        },
        "samples": sampler.samples,
    }


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def check_fits(settings: Settings, fd_limit: int) -> None:
    per_process = settings.websockets + settings.short_concurrency + 200
    if per_process > fd_limit:
        raise SystemExit(
            f"--websockets {settings.websockets} needs ~{per_process} descriptors per "
            f"process; the limit is {fd_limit}"
        )


def parse_args(argv: list[str] | None) -> tuple[Settings, Path]:
    parser = argparse.ArgumentParser(prog="python -m loadtests.soak", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="~30 s smoke run (make test)")
    parser.add_argument("--minutes", type=float, help="run cycles until this much time passed")
    parser.add_argument("--cycles", type=int, help="run exactly this many cycles")
    parser.add_argument("--websockets", type=int, help="WebSockets held per cycle")
    parser.add_argument("--short", type=int, help="short connections per cycle")
    parser.add_argument("--hold-s", type=float, help="how long the WebSockets are held")
    parser.add_argument("--idle-s", type=float, help="idle time before a cycle's figures")
    parser.add_argument("--sample-s", type=float, help="sampling interval")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    overrides = {
        key: value
        for key in ("minutes", "cycles", "websockets", "short", "hold_s", "idle_s", "sample_s")
        if (value := getattr(args, key)) is not None
    }
    return replace(settings, **overrides), args.results


def main(argv: list[str] | None = None) -> int:
    settings, results = parse_args(argv)
    check_fits(settings, raise_fd_limit())
    print(f"soak: {settings}", flush=True)
    with tempfile.TemporaryDirectory(prefix="geoedge-soak-") as tmp:
        stack = SoakStack(Path(tmp), settings.backends)
        try:
            stack.start()
            outcome = uvloop.run(soak(stack, settings))
        finally:
            stack.stop()
    cycles = [CycleFigures(**c) for c in outcome["cycles"]]
    print(table(cycles))
    print(
        f"drift of the idle RSS, last cycle against the first: edge "
        f"{outcome['drift_pct']['edge']:+.2f}%, origin {outcome['drift_pct']['origin']:+.2f}% "
        f"(goal: within {DRIFT_GOAL_PCT:.0f}%)"
    )
    print(f"live instances gained over the run (census): {outcome['census_growth']}")
    results.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "settings": asdict(settings),
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        **outcome,
    }
    results.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {results}")
    return 0 if all(v is not False for v in outcome["passed"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
