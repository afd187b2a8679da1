"""``make drill``: the operator's drill on the emulated WAN, read from the status pages.

Keep-alive requests flow from the user through the edge and the tunnel to the
origin and Node while, one phase after the other, a hop gets worse:

- ``baseline``: the WAN as ``make wan`` builds it;
- ``slow_backend``: 100 ms more each way between the origin and Node (every
  backend round trip 200 ms slower);
- ``slow_tunnel``: back to normal there, 50 ms more each way on the tunnel's
  path between the edge and the origin (100 ms more RTT);
- ``lossy_tunnel``: back to normal, 1% random loss each way on that path
  (the RTT does not change: only the retransmits on both pages do);
- ``drained``: back to normal, and the backend drained through the origin's
  admin API (the button on its status page does the same POST).

Each phase runs load for a little longer than the status pages' one-minute
window, then reads both pages (``/status.json``) and says which hop changed:
the edge's tunnel RTT, retransmits and time to first byte, the origin's
retransmits towards the edge, its first byte from Node and the backend's
state. Results: ``loadtests/results/drill.json`` and a table on stdout. Needs
what ``make wan`` needs (root, network namespaces).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.wan.emulator import unsupported_reason
from loadtests.wan.run import DAEMON_SYSCTLS, say
from loadtests.wan.scenarios import APP_PORT, EDGE_ADMIN, HTTPS_PORT, ORIGIN_ADMIN, SCENARIOS
from loadtests.wan.stack import Stack

RESULTS = Path(__file__).resolve().parents[1] / "results" / "drill.json"
#: The status pages' window is one minute: a phase's load outlasts it.
PHASE_S = 65.0


def admin(stack: Stack, host: str, address: str, path: str, method: str = "GET") -> Any:
    argv = ["curl", "-s", "-f", "-X", method, f"http://{address}{path}"]
    out = subprocess.run(
        stack.wan.exec_argv(host, argv), capture_output=True, text=True, timeout=20, check=True
    )
    return json.loads(out.stdout)


def table(page: dict[str, Any], title: str) -> list[list[str]]:
    found = next(t for t in page["tables"] if t["title"].startswith(title))
    return [[cell["text"] for cell in row["cells"]] for row in found["rows"]]


def ms(text: str) -> float | None:
    """A status-page duration ('3.25 ms', '1.2 s', '-') in milliseconds."""
    if text.endswith(" ms"):
        return float(text[:-3])
    if text.endswith(" s"):
        return float(text[:-2]) * 1000
    return None


def percent(text: str) -> float | None:
    """A status-page ratio ('0.12 %', '-') as a percentage."""
    return float(text[:-2]) if text.endswith(" %") else None


def read_pages(stack: Stack) -> dict[str, Any]:
    edge = admin(stack, "edge", EDGE_ADMIN, "/status.json")
    origin = admin(stack, "origin", ORIGIN_ADMIN, "/status.json")
    (tunnel,) = table(edge, "Tunnels")
    (backend,) = table(origin, "Backends")
    edges = table(origin, "Edges")
    return {
        "edge_tunnel_state": tunnel[2],
        "edge_rtt_p95_ms": ms(tunnel[6]),
        "edge_first_byte_p95_ms": ms(tunnel[8]),
        "edge_retransmitted_pct": percent(tunnel[10]),
        "origin_retransmitted_pct": max(
            (p for row in edges if (p := percent(row[3])) is not None), default=None
        ),
        "origin_backend_state": backend[2],
        "origin_first_byte_p95_ms": ms(backend[7]),
        "origin_failures": table(origin, "Failures"),
        "edge_failures": table(edge, "Refusals"),
    }


def load(stack: Stack, seconds: float) -> dict[str, int]:
    """Keep-alive GETs of the small page from the user, for ``seconds``."""
    host = stack.wan.address(SCENARIOS["edge"].terminator)
    spec = {"host": host, "port": HTTPS_PORT, "ca": stack.files.ca, "tls": "1.3", "path": "/"}
    done = {"ok": 0, "failed": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reply = stack.agent_request({**spec, "kind": "keepalive", "count": 20, "pause_s": 0.1})
        done["failed"] += len(reply["errors"])
        done["ok"] += len(reply["series"].get("total_ms", []))
    return done


def verdict(base: dict[str, Any], now: dict[str, Any]) -> str:
    """Which hop the pages point at, from the rises over the baseline."""
    if now["origin_backend_state"] != "up":
        return f"the backend is {now['origin_backend_state']} (origin's page)"

    def rise(key: str) -> float:
        return (now[key] or 0.0) - (base[key] or 0.0)

    tunnel, backend = rise("edge_rtt_p95_ms"), rise("origin_first_byte_p95_ms")
    resent = max(now["edge_retransmitted_pct"] or 0.0, now["origin_retransmitted_pct"] or 0.0)
    if resent >= 0.1 and backend < 50:
        # Before the RTT: a lost PING or PONG is answered a retransmission later,
        # so loss lifts the RTT's p95 too (measured: +77 ms at 1%).
        return (
            f"the tunnel path loses packets ({resent:.2f}% of its octets retransmitted,"
            f" RTT p95 {tunnel:+.0f} ms)"
        )
    if backend > 100 and tunnel < 50:
        return f"Node (origin's first byte +{backend:.0f} ms, tunnel RTT +{tunnel:.0f} ms)"
    if tunnel > 50 and backend < 50:
        return f"the tunnel path (RTT +{tunnel:.0f} ms, origin's first byte +{backend:.0f} ms)"
    if tunnel < 25 and backend < 25:
        return "nothing changed"
    return f"unclear (tunnel RTT +{tunnel:.0f} ms, origin's first byte +{backend:.0f} ms)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.wan.drill", description=__doc__)
    parser.add_argument("--phase-s", type=float, default=PHASE_S)
    args = parser.parse_args(argv)
    reason = unsupported_reason()
    if reason is not None:
        print(f"drill: cannot run here: {reason}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"phase_s": args.phase_s, "phases": {}}
    with (
        tempfile.TemporaryDirectory(prefix="geoedge-drill-") as tmp,
        Stack(Path(tmp), DAEMON_SYSCTLS) as stack,
    ):
        app = f"{stack.wan.address('app')}:{APP_PORT}"
        normal = {
            pair: stack.wan.link(*pair).delay_ms for pair in (("origin", "app"), ("edge", "origin"))
        }
        say("warming up")
        load(stack, 5)

        def phase(name: str) -> None:
            say(f"{name}: {args.phase_s:g} s of keep-alive requests")
            requests = load(stack, args.phase_s)
            pages = read_pages(stack)
            base = results["phases"].get("baseline", {}).get("pages", pages)
            results["phases"][name] = {
                "requests": requests,
                "pages": pages,
                "verdict": verdict(base, pages),
            }
            say(f"  {results['phases'][name]['verdict']}")

        phase("baseline")
        stack.wan.set_pair("origin", "app", delay_ms=normal[("origin", "app")] + 100)
        phase("slow_backend")
        stack.wan.set_pair("origin", "app", delay_ms=normal[("origin", "app")])
        stack.wan.set_pair("edge", "origin", delay_ms=normal[("edge", "origin")] + 50)
        phase("slow_tunnel")
        stack.wan.set_pair("edge", "origin", delay_ms=normal[("edge", "origin")])
        stack.wan.set_pair("edge", "origin", loss=0.01)
        phase("lossy_tunnel")
        stack.wan.set_pair("edge", "origin", loss=0.0)
        admin(stack, "origin", ORIGIN_ADMIN, f"/backends/app/{app}/drain", method="POST")
        phase("drained")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(
        f"\n{'phase':<14}{'tunnel RTT':>15}{'edge 1st B':>15}{'Node 1st B':>15}"
        f"{'resent e>o':>11}{'resent o>e':>11}{'backend':>10}"
    )
    for name, found in results["phases"].items():
        p = found["pages"]
        figures = [p["edge_rtt_p95_ms"], p["edge_first_byte_p95_ms"], p["origin_first_byte_p95_ms"]]
        shown = "".join(f"{value or 0:>12.0f} ms" for value in figures)
        resent = [p["edge_retransmitted_pct"], p["origin_retransmitted_pct"]]
        shown += "".join(f"{value or 0:>9.2f} %" for value in resent)
        print(f"{name:<14}{shown}{p['origin_backend_state']:>10}  {found['verdict']}")
    print(f"\nresults: {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
