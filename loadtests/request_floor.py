"""``make bench-request-floor``: what a keep-alive request costs the cheapest
Python chain of geoedge's shape.

``make bench-edge`` asks for keep-alive requests at >= 0.42x HAProxy's rate.
This benchmark shows how geoedge's cost splits between the plumbing any Python
chain of its shape pays and its own per-request logic, side by side in one
run, every server on CPU 0 and ``wrk`` (50 connections, as there) on CPU 1:

- ``floor``: two Python processes on uvloop that only move bytes.
  ``floor-edge`` terminates the client's TLS with the edge's own listener and
  transport (:mod:`edge.tls_transport`) and carries every client connection's
  bytes as frames (4-octet stream id, 4-octet length) over one mutual-TLS
  connection made with the tunnel's own contexts (:mod:`tunnel.aio.tls`), its
  writes gathered once per turn of the event loop as the tunnel's are.
  ``floor-origin`` opens one Node.js connection per stream and carries its
  answers back the same way. No HTTP parsing, no forwarding fields, no
  request ids, no stream states, flow control, balancing or accounting: the
  least a Python edge and origin joined by one multiplexed connection can pay
  per request.
- ``haproxy``: HAProxy 2.6 terminating TLS and proxying to Node.js (its CPU
  plus Node's), as in ``make bench-edge``.
- ``geoedge``: edge -> tunnel -> origin -> Node.js (all three), as there.

Figures, server CPU per request of each chain's cheapest run (each run's rate
is kept too), in ``loadtests/results/request_floor.json``. The cheapest, not
the median: on one shared core the floor sometimes falls into a mode where
every process, Node included, wakes for about one request at a time and pays
two to three times its CPU per request (15,000 and 5,400 requests/s in two
runs of one session); geoedge's chain has not been seen to.

- ``budget_us``: HAProxy's chain CPU / 0.42, the whole geoedge chain's
  allowance for the target;
- ``floor_chain_us``: the floor's two hops + Node (in the floor's run);
- ``logic_edge_us`` / ``logic_origin_us``: geoedge's edge and origin minus the
  floor's hop in their place: what the per-request logic costs on top of the
  plumbing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

from edge.config import CertificateConfig, TlsConfig
from edge.listener import TlsListener
from edge.tls import CertificateStore
from geoedge.listening import bind_listener
from loadtests.bench_edge import Settings, client_prefix
from loadtests.edge_clients import run_wrk
from loadtests.edge_stack import CLIENT_CPU, Stack, free_port, tree_cpu_seconds
from loadtests.floor_runner import alternating_rounds, run_and_write
from tunnel.aio.tls import tunnel_client_context, tunnel_server_context

RESULTS = Path(__file__).resolve().parent / "results" / "request_floor.json"
TARGET_RATIO = 0.42
CHAINS = ("floor", "haproxy", "geoedge")
#: Stream id, length. A zero length says the client connection is gone.
FRAME = struct.Struct(">II")
#: wrk's connections, as in ``make bench-edge``.
CONNECTIONS = Settings().keepalive_connections


class FrameLink(asyncio.Protocol):
    """One end of the floor's multiplexed connection: ``send`` gathers frames
    and writes them once per turn of the loop; ``on_frame(stream_id, data)``
    gets each frame that came in whole."""

    def __init__(self, on_frame: Callable[[int, bytes], None]) -> None:
        self.on_frame = on_frame
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, stream_id: int, data: bytes) -> None:
        if not self.out:
            asyncio.get_running_loop().call_soon(self.flush)
        self.out += (FRAME.pack(stream_id, len(data)), data)

    def flush(self) -> None:
        if self.transport is not None:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        pos, end = 0, len(buffer)
        while end - pos >= FRAME.size:
            stream_id, length = FRAME.unpack_from(buffer, pos)
            stop = pos + FRAME.size + length
            if stop > end:
                break
            self.on_frame(stream_id, buffer[pos + FRAME.size : stop])
            pos = stop
        self.buffer = buffer[pos:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


class FloorClient(asyncio.Protocol):
    """A client connection at ``floor-edge``: its bytes go out as frames of its
    own stream id; the frames that come back are written to it."""

    def __init__(self, edge: FloorEdge) -> None:
        self.edge = edge
        self.stream_id = edge.next_id
        edge.next_id += 1
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.edge.clients[self.stream_id] = self

    def data_received(self, data: bytes) -> None:
        self.edge.link.send(self.stream_id, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.edge.clients.pop(self.stream_id, None)
        self.edge.link.send(self.stream_id, b"")


class FloorEdge:
    def __init__(self) -> None:
        self.next_id = 1
        self.clients: dict[int, FloorClient] = {}
        self.link = FrameLink(self.on_frame)

    def on_frame(self, stream_id: int, data: bytes) -> None:
        client = self.clients.get(stream_id)
        if client is not None and client.transport is not None:
            client.transport.write(data)


class FloorBackend(asyncio.Protocol):
    """One Node.js connection per stream at ``floor-origin``."""

    def __init__(self, origin: FloorOrigin, stream_id: int) -> None:
        self.origin = origin
        self.stream_id = stream_id
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.dial: asyncio.Task[Any] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(b"".join(self.pending))  # type: ignore[attr-defined]
        self.pending.clear()

    def write(self, data: bytes) -> None:
        if self.transport is None:
            self.pending.append(data)
        else:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.origin.link.send(self.stream_id, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.origin.backends.pop(self.stream_id, None)


class FloorOrigin:
    def __init__(self, node_port: int) -> None:
        self.node_port = node_port
        self.backends: dict[int, FloorBackend] = {}
        self.link = FrameLink(self.on_frame)

    def on_frame(self, stream_id: int, data: bytes) -> None:
        backend = self.backends.get(stream_id)
        if not data:
            if backend is not None and backend.transport is not None:
                backend.transport.close()
            return
        if backend is None:
            backend = self.backends[stream_id] = FloorBackend(self, stream_id)
            loop = asyncio.get_running_loop()
            backend.dial = loop.create_task(
                loop.create_connection(lambda: backend, "127.0.0.1", self.node_port)
            )
        backend.write(data)


async def serve_origin(port: int, node_port: int, keys: Path) -> None:
    context = tunnel_server_context(keys / "origin.pem", keys / "origin-key.pem", keys / "ca.pem")
    origin = FloorOrigin(node_port)
    loop = asyncio.get_running_loop()
    await loop.create_server(
        lambda: origin.link, sock=bind_listener("127.0.0.1", port), ssl=context
    )
    await asyncio.Event().wait()


async def serve_edge(port: int, origin_port: int, keys: Path) -> None:
    context = tunnel_client_context(keys / "edge.pem", keys / "edge-key.pem", keys / "ca.pem")
    edge = FloorEdge()
    loop = asyncio.get_running_loop()
    await loop.create_connection(
        lambda: edge.link, "127.0.0.1", origin_port, ssl=context, server_hostname="localhost"
    )
    store = CertificateStore(
        TlsConfig(
            certificates=(CertificateConfig(cert=keys / "server.pem", key=keys / "server-key.pem"),)
        )
    )
    TlsListener(bind_listener("127.0.0.1", port), store.context, lambda: FloorClient(edge), 10.0)
    await asyncio.Event().wait()


def key_directory(stack: Stack, directory: Path) -> Path:
    """The stack's certificates under the fixed names the floor's hops read."""
    directory.mkdir(exist_ok=True)
    keys = stack.keys
    for name, path in (
        ("ca.pem", keys.ca),
        ("server.pem", keys.server.cert),
        ("server-key.pem", keys.server.key),
        ("edge.pem", keys.edge.cert),
        ("edge-key.pem", keys.edge.key),
        ("origin.pem", keys.origin.cert),
        ("origin-key.pem", keys.origin.key),
    ):
        (directory / name).write_bytes(path.read_bytes())
    return directory


def measure(pids: dict[str, int], port: int, seconds: float) -> dict[str, Any]:
    before = {name: tree_cpu_seconds([pid]) for name, pid in pids.items()}
    url = f"https://127.0.0.1:{port}/"
    run = run_wrk(client_prefix(), url, seconds, CONNECTIONS)
    used = {name: tree_cpu_seconds([pid]) - before[name] for name, pid in pids.items()}
    if run.requests == 0 or run.errors >= run.requests:
        raise RuntimeError(f"wrk got no good response on port {port} ({run.errors} errors)")
    per_request = {name: round(1e6 * cpu / run.requests, 1) for name, cpu in used.items()}
    return {
        "per_s": round(run.requests_per_s, 1),
        "errors": run.errors,
        "client_cpu_share": round(run.client_cpu_share, 3),
        "server_cpu_us_per_request": {"total": round(sum(per_request.values()), 1), **per_request},
    }


def run(rounds: int, seconds: float, workdir: Path) -> dict[str, Any]:
    if (os.cpu_count() or 1) > CLIENT_CPU:
        os.sched_setaffinity(0, {CLIENT_CPU})
    stack = Stack(workdir)
    try:
        stack.start()
        keys = key_directory(stack, workdir / "floor-keys")
        hop_ports = {"origin": free_port(), "edge": free_port()}
        peer_ports = {"origin": stack.ports.node, "edge": hop_ports["origin"]}
        floor_pids = {}
        for hop in ("origin", "edge"):  # the edge hop dials the origin hop
            argv = ["loadtests.request_floor", "--serve", hop, "--port", str(hop_ports[hop])]
            argv += ["--peer-port", str(peer_ports[hop]), "--keys", str(keys)]
            floor_pids[hop] = stack.start_python(f"floor-{hop}", argv, hop_ports[hop])
        targets = {
            "floor": ({**floor_pids, "node": stack.pid("node")}, hop_ports["edge"]),
            "haproxy": (stack.server_pids("haproxy"), stack.ports.haproxy),
            "geoedge": (stack.server_pids("geoedge"), stack.ports.edge),
        }
        for _pids, port in targets.values():  # warm up (caches, parked connections)
            run_wrk(client_prefix(), f"https://127.0.0.1:{port}/", 1.0, CONNECTIONS)

        def measure_chain(chain: str) -> dict[str, Any]:
            pids, port = targets[chain]
            measured = measure(pids, port, seconds)
            stack.check_alive()
            return measured

        runs = alternating_rounds(rounds, CHAINS, measure_chain)
    finally:
        stack.stop()
    return {"runs": runs}


def summarize(details: dict[str, Any]) -> dict[str, Any]:
    """Each chain's cheapest run (least server CPU per request: noise on a
    shared machine only ever adds), and the budget arithmetic."""
    best = {
        chain: min(runs, key=lambda r: r["server_cpu_us_per_request"]["total"])[
            "server_cpu_us_per_request"
        ]
        for chain, runs in details["runs"].items()
    }
    haproxy, geoedge, floor = best["haproxy"], best["geoedge"], best["floor"]
    return {
        "haproxy_chain_us": haproxy["total"],
        "budget_us": round(haproxy["total"] / TARGET_RATIO, 1),
        "geoedge_chain_us": geoedge["total"],
        "geoedge_edge_us": geoedge["edge"],
        "geoedge_origin_us": geoedge["origin"],
        "geoedge_node_us": geoedge["node"],
        "floor_chain_us": floor["total"],
        "floor_edge_us": floor["edge"],
        "floor_origin_us": floor["origin"],
        "floor_node_us": floor["node"],
        "logic_edge_us": round(geoedge["edge"] - floor["edge"], 1),
        "logic_origin_us": round(geoedge["origin"] - floor["origin"], 1),
        "geoedge_ratio": round(haproxy["total"] / geoedge["total"], 3),
        "floor_ratio": round(haproxy["total"] / floor["total"], 3),
        "best_per_s": {chain: max(r["per_s"] for r in details["runs"][chain]) for chain in CHAINS},
    }


def report(figures: dict[str, Any]) -> str:
    rows = [
        ("HAProxy chain (HAProxy + Node)", figures["haproxy_chain_us"]),
        (f"target allowance (HAProxy chain / {TARGET_RATIO})", figures["budget_us"]),
        ("geoedge chain (edge + origin + Node)", figures["geoedge_chain_us"]),
        ("  edge", figures["geoedge_edge_us"]),
        ("  origin", figures["geoedge_origin_us"]),
        ("  Node", figures["geoedge_node_us"]),
        ("floor chain (two byte-moving hops + Node)", figures["floor_chain_us"]),
        ("  floor edge", figures["floor_edge_us"]),
        ("  floor origin", figures["floor_origin_us"]),
        ("  Node", figures["floor_node_us"]),
        ("geoedge's logic on top: edge", figures["logic_edge_us"]),
        ("geoedge's logic on top: origin", figures["logic_origin_us"]),
    ]
    lines = ["server CPU per keep-alive request (µs)"]
    lines += [f"  {name:<44} {value:>8.1f}" for name, value in rows]
    lines.append(
        f"ratio to HAProxy: geoedge {figures['geoedge_ratio']:.2f}x, "
        f"the floor chain {figures['floor_ratio']:.2f}x (target {TARGET_RATIO}x)"
    )
    best = figures["best_per_s"]
    lines.append("best requests/s: " + ", ".join(f"{c} {best[c]:,.0f}" for c in CHAINS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench-request-floor", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--serve", choices=("edge", "origin"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--peer-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve == "edge":
        uvloop.run(serve_edge(args.port, args.peer_port, args.keys))
        return 0
    if args.serve == "origin":
        uvloop.run(serve_origin(args.port, args.peer_port, args.keys))
        return 0
    if not 1 <= args.rounds <= 10 or not 1 <= args.seconds <= 60:
        parser.error("need 1 <= --rounds <= 10 and 1 <= --seconds <= 60")
    return run_and_write(
        "bench-request-floor", args.rounds, args.seconds, args.output, run, summarize, report
    )


if __name__ == "__main__":
    raise SystemExit(main())
