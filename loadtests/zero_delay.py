"""``make zero-delay``: what the emulated WAN's page measurements cost in
computing, beside their floors (issue 30's cached page, issue 26's page).

A floor (:func:`loadtests.wan.scenarios.floor_ms`) counts round trips only.
A page of 30 GETs also computes: the measuring agent's TLS handshake and
its HTTP/2 client for 30 streams (Python), the emulator's work per packet
(Python, NFQUEUE) and the servers', on the machine's two cores together.
This script loads the pages of ``make wan`` through the edge and through
the nginx edge, first on the WAN as configured, then with every delay set to
0: what a page takes then is its computing alone, a second reference beside
the floor. A target "within N ms of the floor" is reachable only where the
zero-delay figure is under N, for geoedge and for nginx alike.

The stack and agent are ``make wan``'s (:mod:`loadtests.wan`), used as they
are. Root, NFQUEUE and a few minutes are needed; prints the load average.
Writes ``loadtests/results/zero_delay.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from loadtests.wan.emulator import WanEmulator
from loadtests.wan.run import DAEMON_SYSCTLS, Plan, Runner, _one_way_delays
from loadtests.wan.scenarios import MEASUREMENTS, SCENARIOS, floor_ms, path_rtts, percentile
from loadtests.wan.stack import Stack

RESULTS = Path(__file__).resolve().parent / "results" / "zero_delay.json"
PAGES = ("page30_cached_tls13", "page30_tls13")
TERMINATORS = ("edge", "nginx")


def load_pages(runner: Runner, count: int) -> dict[str, float]:
    """p50 of ``count`` loads of each page through each terminator."""
    out = {}
    for scenario in TERMINATORS:
        for key in PAGES:
            m = MEASUREMENTS[key]
            series, errors = runner.batch(
                scenario, "page", tls=m.tls, path=m.path, alpn=m.alpn, count=count
            )
            if errors:
                raise RuntimeError(f"{scenario} {key}: {len(errors)} failed: {errors[0]}")
            out[f"{scenario}/{key}"] = round(percentile(series["total_ms"], 50), 1)
    return out


def measure(count: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="geoedge-zero-delay-") as tmp:
        stack = Stack(Path(tmp), DAEMON_SYSCTLS, edge_workers=2)
        sysctls = {"edge": DAEMON_SYSCTLS, "origin": DAEMON_SYSCTLS}
        stack.wan = WanEmulator(congctl="cubic", sysctls=sysctls, tag=f"zd{os.getpid()}")
        loads = []
        with stack:
            runner = Runner(stack, Plan(warmup=10))
            runner.warm_up("edge")
            load_pages(runner, 1)  # the cached page's second user: another loaded it
            rtts = {s: path_rtts(SCENARIOS[s], _one_way_delays(stack)) for s in TERMINATORS}
            loads.append(Path("/proc/loadavg").read_text().split()[0])
            wan = load_pages(runner, count)
            stack.wan.set_every_delay(0.0)
            loads.append(Path("/proc/loadavg").read_text().split()[0])
            zero = load_pages(runner, count)
            loads.append(Path("/proc/loadavg").read_text().split()[0])
    cases = {}
    for name, p50 in wan.items():
        scenario, key = name.split("/")
        floor = floor_ms(MEASUREMENTS[key], rtts[scenario])
        cases[name] = {
            "p50_ms": p50,
            "floor_ms": floor,
            "over_floor_ms": round(p50 - floor, 1),
            "zero_delay_p50_ms": zero[name],
        }
    return {"count": count, "loadavg_1min": loads, "cases": cases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.zero_delay", description=__doc__)
    parser.add_argument("--count", type=int, default=10, help="page loads per case")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    out = measure(args.count)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=1) + "\n")
    for name, case in out["cases"].items():
        print(
            f"{name:28} p50 {case['p50_ms']:7.1f} ms  floor {case['floor_ms']:6.1f}"
            f"  (+{case['over_floor_ms']:5.1f})  with no delay {case['zero_delay_p50_ms']:6.1f} ms"
        )
    print(f"load average during the run: {', '.join(out['loadavg_1min'])}")
    print(f"results: {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
