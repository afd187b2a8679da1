"""``make bench-edge-logic``: the edge's connection logic per request, without
sockets, TLS or a tunnel.

``make bench-edge`` measures the whole chain; this isolates the Python the
edge runs per request, the part a code change moves most, in a second and
with little noise. The front ends, the exchange and the HTTP/1.1 readers run
for real; the client transport and the tunnel stream are the unit tests'
stand-ins (``tests/edge_fakes.py``), answering every request at once with a
Node.js-like response.

- ``h1``: keep-alive HTTP/1.1 ``GET``s, one at a time on one connection;
- ``h2``: HTTP/2 ``GET``s from an ``h2`` client, 10 streams per read (as
  ``h2load -m10``), each answered, then the client reads the responses (the
  client's own work is not counted).
- ``h1_hit``: the same HTTP/1.1 ``GET``s answered from the edge's cache (the
  plain path: :meth:`edge.cache.EdgeCache.plain_hit`), after one that went up
  and stored the response: a hit's logic, which ``loadtests/bench_cache.py``
  measures through TLS on a noisy machine.

Figures (``loadtests/results/edge_logic.json``), for each build
(:mod:`tunnel.build_mode`: this process's, and the pure-Python one in a
child with ``GEOEDGE_NO_EXTENSIONS=1``): microseconds of CPU per request
(best of ``--rounds``), Python function calls per request (``cProfile``; the
stand-ins' own calls included, a few per request; compiled functions are not
counted), and with ``--instructions`` the machine instructions per request
(valgrind's callgrind, the difference of two runs of different lengths: a
figure that does not move with the load of a shared machine, as CPU time
does; it counts the whole round, so for ``h2`` it includes the ``h2``
client's own work, the same in both builds).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import h2.config
import h2.connection
import uvloop

from edge.cache.cache import EdgeCache
from edge.cache.config import CacheConfig, CompressionConfig
from edge.front_h1 import Http1Connection
from edge.front_h2 import Http2Connection
from tests.edge_fakes import FakeClientTransport, FakeServices
from tunnel.build_mode import NO_EXTENSIONS_VARIABLE, build_mode

RESULTS = Path(__file__).resolve().parent / "results" / "edge_logic.json"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nX-Powered-By: Express\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b'Content-Length: 13\r\nETag: W/"d-lDpwLQbzRZmu4fjajvn3KWAx1pk"\r\n'
    b"Date: Thu, 26 Nov 2026 00:00:00 GMT\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n"
    b"\r\nHello, world!"
)
CACHEABLE = RESPONSE.replace(  # fresh for years (its Date is fixed)
    b"Connection:", b"Cache-Control: public, max-age=315360000\r\nConnection:"
)
H1_REQUEST = (
    b"GET /index.html HTTP/1.1\r\nHost: app.example.com\r\nUser-Agent: Mozilla/5.0\r\n"
    b"Accept: */*\r\nAccept-Encoding: gzip, deflate, br\r\n\r\n"
)
H2_REQUEST = [
    (b":method", b"GET"),
    (b":scheme", b"https"),
    (b":authority", b"app.example.com"),
    (b":path", b"/index.html"),
    (b"user-agent", b"Mozilla/5.0"),
    (b"accept", b"*/*"),
    (b"accept-encoding", b"gzip, deflate, br"),
]
H2_STREAMS_PER_READ = 10


class Workload:
    """One connection of one front end. A round is :meth:`serve` (the client's
    requests in, each answered by the stand-in tunnel stream), then
    :meth:`finish` (the edge's work deferred to the event loop: its batched
    writes), both the edge's; then :meth:`reset` (the client reads, the
    stand-ins forget), not counted."""

    requests_per_round = 1

    def serve(self) -> None:
        raise NotImplementedError

    async def finish(self) -> None:
        await asyncio.sleep(0)

    def reset(self) -> None:
        raise NotImplementedError


class Http1Workload(Workload):
    def __init__(self) -> None:
        self.services = FakeServices()
        self.transport = FakeClientTransport()
        self.conn = Http1Connection(self.services, trusted=False)  # type: ignore[arg-type]  # a stand-in
        self.conn.connection_made(self.transport)

    def serve(self) -> None:
        self.conn.data_received(H1_REQUEST)
        self.services.streams[-1].respond(RESPONSE)

    def reset(self) -> None:
        self.transport.take()
        self.services.streams.clear()
        self.services.logged.clear()


class Http1HitWorkload(Workload):
    def __init__(self) -> None:
        cache = EdgeCache(CacheConfig(enabled=True), CompressionConfig(), "edge-logic")
        self.services = FakeServices(cache=cache)
        self.transport = FakeClientTransport()
        self.conn = Http1Connection(self.services, trusted=False)  # type: ignore[arg-type]  # a stand-in
        self.conn.connection_made(self.transport)
        self.conn.data_received(H1_REQUEST)
        self.services.streams[-1].respond(CACHEABLE)
        assert b"; stored" in self.transport.take(), "the response was not stored"
        self.services.streams.clear()

    def serve(self) -> None:
        self.conn.data_received(H1_REQUEST)

    def reset(self) -> None:
        if self.services.streams:
            raise AssertionError("a hit went up to the origin")
        self.transport.take()
        self.services.logged.clear()


class Http2Workload(Workload):
    requests_per_round = H2_STREAMS_PER_READ

    def __init__(self) -> None:
        self.services = FakeServices()
        self.transport = FakeClientTransport()
        self.conn = Http2Connection(self.services, trusted=False)  # type: ignore[arg-type]  # a stand-in
        self.conn.connection_made(self.transport)
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.client = h2.connection.H2Connection(config)
        self.client.initiate_connection()
        self.client.increment_flow_control_window(2**30)
        self.conn.data_received(self.client.data_to_send())
        self.client.receive_data(self.transport.take())
        self.conn.data_received(self.client.data_to_send())
        self.pending = self._requests()

    def _requests(self) -> bytes:
        client = self.client
        for _ in range(H2_STREAMS_PER_READ):
            client.send_headers(client.get_next_available_stream_id(), H2_REQUEST, end_stream=True)
        return client.data_to_send()

    def serve(self) -> None:
        self.conn.data_received(self.pending)
        for stream in self.services.streams:
            stream.respond(RESPONSE)

    async def finish(self) -> None:
        await asyncio.sleep(0)  # the session writes once per turn of the event loop
        await asyncio.sleep(0)

    def reset(self) -> None:
        self.client.receive_data(self.transport.take())
        self.services.streams.clear()
        self.services.logged.clear()
        self.pending = self._requests()


async def cpu_us(make: Callable[[], Workload], rounds: int, requests: int) -> float:
    """Best of ``rounds`` runs of ``requests`` requests: CPU microseconds per request."""
    best = float("inf")
    for _ in range(rounds):
        workload = await _warm(make())
        spent = 0.0
        served = 0
        while served < requests:
            started = time.process_time()
            workload.serve()
            await workload.finish()
            spent += time.process_time() - started
            served += workload.requests_per_round
            workload.reset()
        best = min(best, 1e6 * spent / served)
    return best


async def _warm(workload: Workload) -> Workload:
    """A few rounds first, so that every cache on the path is warm."""
    for _ in range(20):
        workload.serve()
        await workload.finish()
        workload.reset()
    return workload


async def calls_per_request(make: Callable[[], Workload], requests: int) -> float:
    workload = await _warm(make())
    profile = cProfile.Profile()
    served = 0
    while served < requests:
        profile.enable()
        workload.serve()
        await workload.finish()
        profile.disable()
        served += workload.requests_per_round
        workload.reset()
    stats = pstats.Stats(profile)
    return sum(entry[1] for entry in stats.stats.values()) / served  # type: ignore[attr-defined]


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "h1": Http1Workload,
    "h2": Http2Workload,
    "h1_hit": Http1HitWorkload,
}


async def serve(make: Callable[[], Workload], requests: int) -> None:
    """Warm up, then serve ``requests`` requests (what callgrind counts)."""
    workload = await _warm(make())
    served = 0
    while served < requests:
        workload.serve()
        await workload.finish()
        served += workload.requests_per_round
        workload.reset()


def instructions_per_request(name: str, short: int = 200, long: int = 1200) -> float:
    """Machine instructions per request under callgrind: two runs of this
    module serving ``short`` and ``long`` requests, the difference divided by
    the difference (start-up, imports and warm-up cancel out)."""
    counts = []
    for requests in (short, long):
        result = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
             sys.executable, "-m", "loadtests.edge_logic", "--serve", name, str(requests)],
            capture_output=True, text=True, timeout=1800, check=True,
        )  # fmt: skip
        match = re.search(r"Collected : (\d+)", result.stderr)
        assert match is not None, result.stderr[-500:]
        counts.append(int(match[1]))
    return (counts[1] - counts[0]) / (long - short)


async def measure(rounds: int, requests: int, instructions: bool) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, make in WORKLOADS.items():
        out[name] = {
            "cpu_us_per_request": round(await cpu_us(make, rounds, requests), 1),
            "python_calls_per_request": round(await calls_per_request(make, 1000), 1),
        }
        if instructions:
            out[name]["instructions_per_request"] = round(instructions_per_request(name))
    return out


def pure_figures(argv: list[str]) -> dict[str, dict[str, float]]:
    """The same figures from the pure-Python build, in a child process."""
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "pure.json"
        subprocess.run(
            [sys.executable, "-m", "loadtests.edge_logic", *argv, "--this-build-only",
             "--output", str(output)],
            env=os.environ | {NO_EXTENSIONS_VARIABLE: "1"}, check=True, timeout=3600,
        )  # fmt: skip
        figures: dict[str, dict[str, float]] = json.loads(output.read_text())["pure Python"]
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-edge-logic", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs per front end (best kept)")
    parser.add_argument("--requests", type=int, default=5000, help="requests per run")
    parser.add_argument("--output", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument(
        "--instructions", action="store_true", help="also count instructions (valgrind, slow)"
    )
    parser.add_argument(
        "--this-build-only", action="store_true", help="not the pure-Python build beside it"
    )
    parser.add_argument("--serve", nargs=2, metavar=("FRONT", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        uvloop.run(serve(WORKLOADS[args.serve[0]], int(args.serve[1])))
        return 0
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind (apt-get install valgrind)")
    results = {build_mode(): uvloop.run(measure(args.rounds, args.requests, args.instructions))}
    if build_mode() == "compiled" and not args.this_build_only:
        passed = ["--rounds", str(args.rounds), "--requests", str(args.requests)]
        results["pure Python"] = pure_figures(passed + ["--instructions"] * args.instructions)
    for mode, figures in results.items():
        for name, values in figures.items():
            extra = values.get("instructions_per_request")
            print(
                f"{mode:>11} {name}: {values['cpu_us_per_request']} us of CPU, "
                f"{values['python_calls_per_request']} Python calls"
                + (f", {extra:,.0f} instructions" if extra is not None else "")
                + " per request"
            )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
