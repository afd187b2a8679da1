"""``make bench-tls-floor``: what a full handshake costs a Python TLS server that does nothing.

``make bench-edge`` asks for full handshakes at >= 0.85x HAProxy's rate. This
benchmark shows how the edge's cost splits between TLS itself and the rest,
side by side in one run, every server on CPU 0 and the Go client (never resumes, one
``GET`` with ``Connection: close`` per connection) on CPU 1:

- ``floor``: the edge's own TLS listener and transport
  (:mod:`edge.tls_transport`) with its own ``SSLContext``
  (:class:`edge.tls.CertificateStore`: same certificate, ciphers, ALPN, SNI
  callback, tickets), on uvloop, whose protocol answers a fixed ``200`` once
  the request head is in and closes. No HTTP parsing, no tunnel, no origin, no
  backend: the least the edge can pay per connection.
- ``haproxy``: HAProxy 2.6 terminating TLS and proxying to Node.js (its CPU
  plus Node's), as in ``make bench-edge``.
- ``geoedge``: edge -> tunnel -> origin -> Node.js (all three), as there.

Figures, server CPU per connection (what noise hardly moves; the throughput
of each run is kept too), in ``loadtests/results/tls_floor.json``:

- ``budget_us``: HAProxy's chain CPU / 0.85, the whole geoedge chain's
  allowance for the target;
- ``floor_chain_us``: floor + the origin's and Node's share measured in the
  geoedge chain: geoedge's cost if its edge did nothing but TLS;
- ``floor_chain_ratio``: HAProxy's chain CPU / ``floor_chain_us``, the best
  handshake ratio a Python edge could reach in front of this origin.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from pathlib import Path
from typing import Any

import uvloop

from edge.config import CertificateConfig, TlsConfig
from edge.listener import TlsListener
from edge.tls import CertificateStore
from geoedge.listening import bind_listener
from loadtests.bench_edge import client_prefix
from loadtests.edge_stack import CLIENT_CPU, Stack, free_port, tree_cpu_seconds
from loadtests.floor_runner import alternating_rounds, run_and_write
from loadtests.handshake_client import go_client, run_handshakes

RESULTS = Path(__file__).resolve().parent / "results" / "tls_floor.json"
TARGET_RATIO = 0.85
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
CHAINS = ("floor", "haproxy", "geoedge")


class FixedAnswer(asyncio.Protocol):
    """Answers any request with :data:`RESPONSE` once its head is in, then closes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.head += data
        if b"\r\n\r\n" in self.head and self.transport is not None:
            self.transport.write(RESPONSE)
            self.transport.close()
            self.transport = None


async def serve(port: int, cert: Path, key: Path) -> None:
    store = CertificateStore(TlsConfig(certificates=(CertificateConfig(cert=cert, key=key),)))
    sock = bind_listener("127.0.0.1", port)
    TlsListener(sock, store.context, FixedAnswer, handshake_timeout_s=10.0)
    await asyncio.Event().wait()


def measure(pids: dict[str, int], port: int, seconds: float, client: Path | None) -> dict[str, Any]:
    before = {name: tree_cpu_seconds([pid]) for name, pid in pids.items()}
    run = run_handshakes(client_prefix(), port, seconds, 32, client)
    used = {name: tree_cpu_seconds([pid]) - before[name] for name, pid in pids.items()}
    if run.connections == 0:
        raise RuntimeError(f"no handshake succeeded on port {port}: {run.first_error}")
    per_conn = {name: round(1e6 * cpu / run.connections, 1) for name, cpu in used.items()}
    return {
        "per_s": round(run.per_s, 1),
        "errors": run.errors,
        "client_cpu_share": round(run.client_cpu_share, 3),
        "server_cpu_us_per_connection": {"total": round(sum(per_conn.values()), 1), **per_conn},
    }


def run(rounds: int, seconds: float, workdir: Path) -> dict[str, Any]:
    log: list[str] = []
    client = go_client(log)
    if (os.cpu_count() or 1) > CLIENT_CPU:
        os.sched_setaffinity(0, {CLIENT_CPU})
    stack = Stack(workdir)
    try:
        stack.start()
        floor_port = free_port()
        argv = ["loadtests.tls_floor", "--serve", str(floor_port)]
        argv += ["--cert", str(stack.keys.server.cert), "--key", str(stack.keys.server.key)]
        floor = stack.start_python("floor", argv, floor_port)
        targets = {
            "floor": ({"floor": floor}, floor_port),
            "haproxy": (stack.server_pids("haproxy"), stack.ports.haproxy),
            "geoedge": (stack.server_pids("geoedge"), stack.ports.edge),
        }
        for _pids, port in targets.values():  # warm up (caches, the Go client's build)
            run_handshakes(client_prefix(), port, 1.0, 8, client)

        def measure_chain(chain: str) -> dict[str, Any]:
            pids, port = targets[chain]
            measured = measure(pids, port, seconds, client)
            stack.check_alive()
            return measured

        runs = alternating_rounds(rounds, CHAINS, measure_chain)
    finally:
        stack.stop()
    return {"client": "go" if client else "python", "notes": log, "runs": runs}


def summarize(details: dict[str, Any]) -> dict[str, Any]:
    """Medians of the per-connection CPU figures, and the budget arithmetic."""

    def median_us(chain: str, process: str) -> float:
        runs = details["runs"][chain]
        return round(
            float(statistics.median(r["server_cpu_us_per_connection"][process] for r in runs)), 1
        )

    haproxy = median_us("haproxy", "total")
    floor = median_us("floor", "floor")
    origin, node = median_us("geoedge", "origin"), median_us("geoedge", "node")
    floor_chain = round(floor + origin + node, 1)
    return {
        "haproxy_chain_us": haproxy,
        "geoedge_chain_us": median_us("geoedge", "total"),
        "geoedge_edge_us": median_us("geoedge", "edge"),
        "geoedge_origin_us": origin,
        "geoedge_node_us": node,
        "floor_us": floor,
        "budget_us": round(haproxy / TARGET_RATIO, 1),
        "floor_chain_us": floor_chain,
        "floor_chain_ratio": round(haproxy / floor_chain, 3),
        "geoedge_ratio": round(haproxy / median_us("geoedge", "total"), 3),
        "best_per_s": {chain: max(r["per_s"] for r in details["runs"][chain]) for chain in CHAINS},
    }


def report(figures: dict[str, Any]) -> str:
    rows = [
        ("HAProxy chain (HAProxy + Node)", figures["haproxy_chain_us"]),
        ("target allowance (HAProxy chain / 0.85)", figures["budget_us"]),
        ("geoedge chain (edge + origin + Node)", figures["geoedge_chain_us"]),
        ("  edge", figures["geoedge_edge_us"]),
        ("  origin", figures["geoedge_origin_us"]),
        ("  Node", figures["geoedge_node_us"]),
        ("do-nothing Python TLS server (floor)", figures["floor_us"]),
        ("floor + origin + Node", figures["floor_chain_us"]),
    ]
    lines = ["server CPU per full handshake + request (µs)"]
    lines += [f"  {name:<42} {value:>8.1f}" for name, value in rows]
    lines.append(
        f"ratio to HAProxy: geoedge {figures['geoedge_ratio']:.2f}x, "
        f"with an edge that only did TLS {figures['floor_chain_ratio']:.2f}x "
        f"(target {TARGET_RATIO}x)"
    )
    best = figures["best_per_s"]
    lines.append("best handshakes/s: " + ", ".join(f"{c} {best[c]:,.0f}" for c in CHAINS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-tls-floor", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--key", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        uvloop.run(serve(args.serve, args.cert, args.key))
        return 0
    if not 1 <= args.rounds <= 10 or not 0.5 <= args.seconds <= 60:
        parser.error("need 1 <= --rounds <= 10 and 0.5 <= --seconds <= 60")
    return run_and_write(
        "bench-tls-floor",
        args.rounds,
        args.seconds,
        args.output,
        run,
        summarize,
        report,
        environment=lambda details: {"handshake_client": details["client"]},
    )


if __name__ == "__main__":
    raise SystemExit(main())
