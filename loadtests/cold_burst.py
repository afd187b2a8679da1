"""``make cold-burst``: the first seconds after the edge starts or reloads, on
the emulated WAN of ``make wan`` (issue 27, Deliver 4).

A burst of 20 new TLS connections (``GET /``, TLS 1.3 and TLS 1.2) is sent
from the user's namespace (10 ms from the edge, 265 ms from the origin)
right after the edge (two workers) restarts and reports ready (``/healthz``
200: every worker has a tunnel up and warm), right after a reload
(``SIGHUP``: new workers take over once their tunnels are warm), and, for
comparison, after other traffic. Each burst's p50 is set against its floor
(what the configured delays alone impose: TCP + TLS handshakes + one request
across the tunnel, :func:`loadtests.wan.scenarios.floor_ms`); the target is
within 30 ms of it.

The floor counts no computing, and a burst computes at once: the measuring
agent's 20 client handshakes (one Python thread), the emulator's per-packet
work and the daemons', on the machine's cores together. So the run ends
with the same bursts with every delay set to 0 (``zero_delay_*``): what
they take is the burst's computing alone, a second reference beside the
floor (measured last: the tunnel's congestion control sees the changed
round trip).

The WAN emulator, stack and measuring agent are ``make wan``'s
(:mod:`loadtests.wan`), used as they are; the namespaces carry this
script's tag (``gewan-reload<pid>-*``). Root, a kernel with NFQUEUE and
several minutes are needed; figures taken while the machine is busy are
noisy, so each run also prints the load average. Writes
``loadtests/results/cold_burst.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.wan.emulator import WanEmulator
from loadtests.wan.run import DAEMON_SYSCTLS, Plan, Runner, _one_way_delays
from loadtests.wan.scenarios import SCENARIOS, Measurement, floor_ms, path_rtts, percentile
from loadtests.wan.stack import Stack

RESULTS = Path(__file__).resolve().parent / "results" / "cold_burst.json"
BURST = 20
CASES = ("after_start", "after_reload", "steady")
TARGET_OVER_FLOOR_MS = 30.0


def reload_edge(stack: Stack, timeout_s: float = 180.0) -> None:
    """SIGHUP to the edge's supervisor; until it logs the reload's outcome."""
    log = stack.logs / "edge.log"
    before = log.read_text(errors="replace").count("reload ok:")
    os.kill(stack.procs["edge"].pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout_s
    while log.read_text(errors="replace").count("reload ok:") == before:
        if time.monotonic() > deadline:
            raise TimeoutError("the edge's reload did not end:\n" + log.read_text()[-2000:])
        time.sleep(0.2)


def burst(runner: Runner, tls: str) -> list[float]:
    series, errors = runner.batch("edge", "burst", tls=tls, path="/", count=1, burst=BURST)
    if errors:
        raise RuntimeError(f"{len(errors)} connection(s) of a burst failed: {errors[0]}")
    return list(series["total_ms"])


def zero_delay_bursts(stack: Stack, runner: Runner, rounds: int) -> dict[str, list[float]]:
    """The bursts again with every delay 0: their computing alone."""
    stack.wan.set_every_delay(0.0)
    runner.warm_up("edge", count=2)
    samples: dict[str, list[float]] = {"1.3": [], "1.2": []}
    for _ in range(rounds):
        for tls in samples:
            samples[tls] += burst(runner, tls)
    return samples


def measure(rounds: int, edge_workers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="geoedge-cold-burst-") as tmp:
        stack = Stack(Path(tmp), DAEMON_SYSCTLS, edge_workers=edge_workers)
        sysctls = {"edge": DAEMON_SYSCTLS, "origin": DAEMON_SYSCTLS}
        stack.wan = WanEmulator(congctl="cubic", sysctls=sysctls, tag=f"reload{os.getpid()}")
        samples: dict[str, dict[str, list[float]]] = {c: {"1.3": [], "1.2": []} for c in CASES}
        loads = []
        with stack:
            runner = Runner(stack, Plan(warmup=10))
            runner.warm_up("edge")
            rtts = path_rtts(SCENARIOS["edge"], _one_way_delays(stack))
            for n in range(rounds):
                for tls in ("1.3", "1.2"):
                    loads.append(Path("/proc/loadavg").read_text().split()[0])
                    samples["steady"][tls] += burst(runner, tls)
                    stack.restart("edge")
                    samples["after_start"][tls] += burst(runner, tls)
                    reload_edge(stack)
                    samples["after_reload"][tls] += burst(runner, tls)
                    print(f"round {n + 1}/{rounds}, TLS {tls} done", flush=True)
            zero_delay = zero_delay_bursts(stack, runner, rounds)
    floors = {
        tls: floor_ms(Measurement("burst", "burst", "new", tls, "/"), rtts)
        for tls in ("1.3", "1.2")
    }
    out: dict[str, Any] = {"burst": BURST, "rounds": rounds, "edge_workers": edge_workers,
                           "floor_ms": floors, "loadavg_1min": loads, "cases": {}}  # fmt: skip
    for case, by_tls in samples.items():
        for tls, values in by_tls.items():
            p50 = percentile(values, 50)
            out["cases"][f"{case}_tls{tls.replace('.', '')}"] = {
                "samples": len(values),
                "p50_ms": round(p50, 1),
                "p90_ms": round(percentile(values, 90), 1),
                "over_floor_ms": round(p50 - floors[tls], 1),
            }
    for tls, values in zero_delay.items():
        out["cases"][f"zero_delay_tls{tls.replace('.', '')}"] = {
            "samples": len(values),
            "p50_ms": round(percentile(values, 50), 1),
            "p90_ms": round(percentile(values, 90), 1),
            "over_floor_ms": round(percentile(values, 50), 1),  # its floor is 0
        }
    out["ok"] = all(
        case["over_floor_ms"] <= TARGET_OVER_FLOOR_MS
        for name, case in out["cases"].items()
        if not name.startswith(("steady", "zero_delay"))
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.cold_burst", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--edge-workers", type=int, default=2)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    out = measure(args.rounds, args.edge_workers)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=1) + "\n")
    for name, case in out["cases"].items():
        print(
            f"{name:22} p50 {case['p50_ms']:7.1f} ms  p90 {case['p90_ms']:7.1f} ms  "
            f"floor +{case['over_floor_ms']:5.1f} ms  ({case['samples']} samples)"
        )
    print(f"load average during the run: {', '.join(out['loadavg_1min'])}")
    print("PASS" if out["ok"] else "FAIL", f"(within {TARGET_OVER_FLOOR_MS:g} ms of the floor;",
          f"results: {args.results})")  # fmt: skip
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
