"""``make bench-origin-streams``: what a short stream costs the origin.

The origin daemon (two workers, mutual TLS, access log off) in front of four
Node.js backends, all pinned to CPU 0; this process, the client, on CPU 1.
The client opens ``--streams`` streams over two tunnel connections,
``--concurrency`` at a time, each ``GET /ip`` with ``Connection: close``: a
new backend connection per stream, as for an edge's first request from a
client, so the figure includes the origin's connect, its forwarding fields
and its balancing.

Figures (stdout, and ``--out`` as JSON):

- ``origin_cpu_ms_per_1000_streams``: CPU time of the origin's process tree
  (parent and workers) per 1,000 streams, the cheapest of ``--rounds`` runs
  (noise on a shared machine only ever adds to it). The integration suite
  once asserted it under 5,000 ms (``test_origin_balancing``); a timed test
  on a shared machine measures the machine, so the figure lives here.
- ``streams_per_s``: of the same run (noisy: every process shares 2 cores);
- ``spread``: the busiest backend's share over the idlest's (balance; the
  suite checks it by counting, within 10% of the mean);
- ``node_cpu_ms_per_1000_streams``: Node's share, for scale.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import uvloop

from geoedge import devstack
from loadtests.edge_stack import (
    CLIENT_CPU,
    NODE_APP,
    ROOT,
    StackError,
    free_port,
    make_pki,
    pinned,
    quiet_origin_toml,
    tree_cpu_seconds,
    wait_healthy,
    wait_port,
)
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.stream import StreamIO
from tunnel.aio.transport import TunnelDialConfig, dial_tunnel
from tunnel.mux import SessionConfig, StreamMetadata

SERVER_CPU = 0
META = StreamMetadata(
    client_address=("203.0.113.7", 40001), server_address=("198.51.100.10", 443), host="app.test"
)
REQUEST = b"GET /ip HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n"


async def one_stream(connection: TunnelConnection) -> int:
    """One request on a new stream: the backend port that answered it."""
    ios: list[StreamIO] = []
    connection.open_stream(META, lambda: ios.append(StreamIO()) or ios[-1])  # type: ignore[func-returns-value]
    io = ios[0]
    io.write(REQUEST)
    data = await io.read_all()
    io.write_eof()
    _, _, body = data.partition(b"\r\n\r\n")
    return int(json.loads(body)["backend"])


async def load(
    connections: list[TunnelConnection], streams: int, concurrency: int
) -> tuple[Counter[int], int]:
    counts: Counter[int] = Counter()
    failures = 0
    queue = iter(range(streams))

    async def client(index: int) -> None:
        nonlocal failures
        for n in queue:
            try:
                counts[await one_stream(connections[(index + n) % len(connections)])] += 1
            except (ConnectionError, ValueError, KeyError):
                failures += 1

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return counts, failures


async def measure(
    dial: TunnelDialConfig, origin_pid: int, node_pids: list[int], args: argparse.Namespace
) -> list[dict[str, Any]]:
    connections = [await dial_tunnel(dial, SessionConfig()) for _ in range(2)]
    try:
        await load(connections, 200, 8)  # warm-up: first-use caches, both workers
        runs = []
        for _ in range(args.rounds):
            origin_before = tree_cpu_seconds([origin_pid])
            node_before = tree_cpu_seconds(node_pids)
            began = time.monotonic()
            counts, failures = await load(connections, args.streams, args.concurrency)
            elapsed = time.monotonic() - began
            origin_cpu = tree_cpu_seconds([origin_pid]) - origin_before
            node_cpu = tree_cpu_seconds(node_pids) - node_before
            runs.append(
                {
                    "origin_cpu_ms_per_1000_streams": round(origin_cpu / args.streams * 1e6, 1),
                    "node_cpu_ms_per_1000_streams": round(node_cpu / args.streams * 1e6, 1),
                    "streams_per_s": round(args.streams / elapsed, 1),
                    "spread": round(max(counts.values()) / max(1, min(counts.values())), 3),
                    "backends": len(counts),
                    "failures": failures,
                }
            )
        return runs
    finally:
        for connection in connections:
            connection.abort()


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    keys = make_pki(workdir / "pki")
    processes = devstack.ProcessGroup()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    deadline = time.monotonic() + 60
    try:
        node_ports = [free_port() for _ in range(args.backends)]
        nodes = []
        for port in node_ports:
            argv = pinned(SERVER_CPU, ["node", str(NODE_APP), str(port)])
            nodes.append(processes.spawn(f"node-{port}", argv, log=workdir / "node.log", cwd=ROOT))
            wait_port(port, deadline, nodes[-1], workdir / "node.log")
        tunnel_port, admin_port = free_port(), free_port()
        config = workdir / "origin.toml"
        config.write_text(
            quiet_origin_toml(
                keys,
                tunnel_port=tunnel_port,
                admin_port=admin_port,
                backends=node_ports,
                drain_timeout_s=1.0,
                workers=2,
            )
        )
        argv = pinned(SERVER_CPU, [sys.executable, "-m", "origin", "--config", str(config)])
        origin = processes.spawn("origin", argv, log=workdir / "origin.log", cwd=ROOT, env=env)
        wait_port(tunnel_port, deadline, origin, workdir / "origin.log")
        wait_healthy(admin_port, deadline, "the origin", workdir / "origin.log", [origin])
        dial = TunnelDialConfig(
            address=f"127.0.0.1:{tunnel_port}",
            server_name="localhost",
            cert=keys.edge.cert,
            key=keys.edge.key,
            ca=keys.ca,
        )
        if (os.cpu_count() or 1) > CLIENT_CPU:
            os.sched_setaffinity(0, {CLIENT_CPU})
        runs = uvloop.run(measure(dial, origin.pid, [n.pid for n in nodes], args))
    finally:
        processes.stop()
    best = min(runs, key=lambda r: r["origin_cpu_ms_per_1000_streams"])
    return {
        **{k: best[k] for k in ("origin_cpu_ms_per_1000_streams", "streams_per_s", "spread")},
        "node_cpu_ms_per_1000_streams": best["node_cpu_ms_per_1000_streams"],
        "environment": {
            "load_average": list(os.getloadavg()),
            "streams": args.streams,
            "concurrency": args.concurrency,
            "backends": args.backends,
            "origin_workers": 2,
        },
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-origin-streams-") as tmp:
        try:
            result = run(args, Path(tmp))
        except StackError as exc:
            sys.exit(f"could not start the servers: {exc}")
    failures = sum(r["failures"] for r in result["runs"])
    print(
        f"origin CPU: {result['origin_cpu_ms_per_1000_streams']:.0f} ms per 1,000 streams "
        f"(Node: {result['node_cpu_ms_per_1000_streams']:.0f} ms), "
        f"{result['streams_per_s']:.0f} streams/s, busiest/idlest backend "
        f"{result['spread']:.2f}, {failures} failures; best of {args.rounds}, "
        f"load average {result['environment']['load_average'][0]:.1f}"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
