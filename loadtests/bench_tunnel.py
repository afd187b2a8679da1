"""``make bench-tunnel``: one mutual-TLS tunnel connection on loopback, the two
ends in separate processes pinned to separate cores (server CPU 0, client CPU 1).

Figures (written to ``loadtests/results/tunnel.json``):

- ``opens_per_s``: stream open + 1 KB each way + close, 100 streams in flight;
- ``bulk_mb_s``: one stream carrying bulk data server → client;
- ``small_p50_idle_ms``: 1 KB request/response on one stream, nothing else running;
- ``small_p99_under_bulk_ms``: the same while another stream carries a bulk transfer.

Targets (issue 2): p99 under bulk within 2 ms of the idle p50; bulk >= 400 MB/s;
opens >= 20,000/s. The hot paths use the callback (Protocol) API, as the daemons do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from geoedge import pki
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.stream import TunnelStream
from tunnel.aio.transport import (
    TunnelDialConfig,
    TunnelListenerConfig,
    dial_tunnel,
    serve_tunnel,
)
from tunnel.mux import SessionConfig, StreamMetadata

RESULTS = Path(__file__).parent / "results" / "tunnel.json"
SMALL = 1024
BULK_CHUNK = 64 * 1024
META = StreamMetadata(client_address=("192.0.2.10", 40000), edge_id="bench")


def pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


# ----------------------------------------------------------------------- server


class ServerStream(asyncio.Protocol):
    """Mode from the first octet: b"O" open test (answer 1 KB at EOF), b"E"
    echo, b"B" bulk (send until the peer closes)."""

    def __init__(self) -> None:
        self.mode = b""
        self.transport: TunnelStream | None = None
        self.writable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.mode:
            self.mode = data[:1]
            data = data[1:]
            if self.mode == b"B":
                self._pump()
        if self.mode == b"E" and data:
            self.transport.write(data)  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        if self.mode == b"O":
            self.transport.write(b"r" * SMALL)  # type: ignore[union-attr]
        self.transport.write_eof()  # type: ignore[union-attr]
        return True

    def _pump(self) -> None:
        chunk = b"b" * BULK_CHUNK
        transport = self.transport
        while self.writable and transport is not None and not transport.is_closing():
            transport.write(chunk)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        asyncio.get_running_loop().call_soon(self._pump)

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable = False


async def serve(port_file: Path, pki_dir: Path) -> None:
    config = TunnelListenerConfig(
        address="127.0.0.1:0",
        cert=pki_dir / "origin.pem",
        key=pki_dir / "origin-key.pem",
        ca=pki_dir / "ca" / "ca.pem",
        allowed_identities=("bench-edge",),
    )
    server = await serve_tunnel(config, SessionConfig(), lambda stream: ServerStream())
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


# ----------------------------------------------------------------------- client


class OpenOnce(asyncio.Protocol):
    __slots__ = ("done", "got")

    def __init__(self, done: asyncio.Future[None] | None = None) -> None:
        self.got = 0
        self.done = done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(b"O" + b"q" * (SMALL - 1))  # type: ignore[attr-defined]
        transport.write_eof()  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.got += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None or self.got != SMALL:
            raise RuntimeError(f"open test stream failed: {exc} got={self.got}")


async def measure_opens(connection: TunnelConnection, seconds: float, in_flight: int) -> float:
    loop = asyncio.get_running_loop()
    finished = 0
    stop_at = loop.time() + seconds
    all_done = loop.create_future()
    active = 0

    class Counted(OpenOnce):
        def connection_lost(self, exc: Exception | None) -> None:
            nonlocal finished, active
            super().connection_lost(exc)
            finished += 1
            active -= 1
            if loop.time() < stop_at:
                start_one()
            elif active == 0 and not all_done.done():
                all_done.set_result(None)

    def start_one() -> None:
        nonlocal active
        active += 1
        connection.open_stream(META, Counted)

    started = time.perf_counter()
    for _ in range(in_flight):
        start_one()
    await all_done
    return finished / (time.perf_counter() - started)


class BulkSink(asyncio.Protocol):
    def __init__(self) -> None:
        self.received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(b"B")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.received += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        pass


class Echo(asyncio.Protocol):
    def __init__(self) -> None:
        self.waiter: asyncio.Future[None] | None = None
        self.buffered = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(b"E")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.buffered += len(data)
        if self.buffered >= SMALL and self.waiter is not None and not self.waiter.done():
            self.buffered -= SMALL
            self.waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        pass

    async def round_trip(self) -> float:
        self.waiter = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()
        self.transport.write(b"s" * SMALL)  # type: ignore[attr-defined]
        await self.waiter
        return (time.perf_counter() - t0) * 1000


async def small_latencies(connection: TunnelConnection, count: int) -> list[float]:
    holder: list[Echo] = []
    connection.open_stream(META, lambda: holder.append(Echo()) or holder[-1])  # type: ignore[func-returns-value]
    echo = holder[0]
    samples = []
    for _ in range(count):
        samples.append(await echo.round_trip())
        await asyncio.sleep(0.002)
    echo.transport.close()
    return samples


async def measure_bulk(connection: TunnelConnection, seconds: float) -> tuple[float, BulkSink]:
    holder: list[BulkSink] = []
    connection.open_stream(META, lambda: holder.append(BulkSink()) or holder[-1])  # type: ignore[func-returns-value]
    sink = holder[0]
    await asyncio.sleep(0.5)  # warm up: windows grow, TCP ramps
    start_bytes, t0 = sink.received, time.perf_counter()
    await asyncio.sleep(seconds)
    rate = (sink.received - start_bytes) / (time.perf_counter() - t0) / 1e6
    return rate, sink


def p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def client(port: int, pki_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    config = TunnelDialConfig(
        address=f"127.0.0.1:{port}",
        server_name="localhost",
        cert=pki_dir / "edge.pem",
        key=pki_dir / "edge-key.pem",
        ca=pki_dir / "ca" / "ca.pem",
        connections=1,
    )
    connection = await dial_tunnel(config, SessionConfig())
    await measure_opens(connection, 0.5, args.in_flight)  # warm-up
    opens = await measure_opens(connection, args.seconds, args.in_flight)
    idle = await small_latencies(connection, args.samples)
    bulk_alone, sink = await measure_bulk(connection, args.seconds)
    under_bulk = await small_latencies(connection, args.samples)
    sink.transport.abort()  # type: ignore[attr-defined]
    connection.abort()
    return {
        "opens_per_s": round(opens),
        "bulk_mb_s": round(bulk_alone, 1),
        "small_p50_idle_ms": round(statistics.median(idle), 3),
        "small_p99_idle_ms": round(p(idle, 0.99), 3),
        "small_p50_under_bulk_ms": round(statistics.median(under_bulk), 3),
        "small_p99_under_bulk_ms": round(p(under_bulk, 0.99), 3),
    }


def make_pki(directory: Path) -> None:
    pki.create_ca(directory / "ca")
    ca = pki.load_ca(directory / "ca")
    pki.issue_peer_cert(
        ca, directory, "origin", "bench-origin", role="origin", dns_names=["localhost"]
    )
    pki.issue_peer_cert(ca, directory, "edge", "bench-edge", role="edge")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--pki", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        pin(0)
        uvloop.run(serve(Path(args.serve), Path(args.pki)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        make_pki(directory)
        port_file = directory / "port"
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loadtests.bench_tunnel",
                "--serve",
                str(port_file),
                "--pki",
                str(directory),
            ]
        )
        try:
            deadline = time.monotonic() + 20
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("benchmark server did not start")
                time.sleep(0.05)
            pin(1)
            results = uvloop.run(client(int(port_file.read_text()), directory, args))
        finally:
            server.terminate()
            server.wait(10)
    results["small_p99_under_bulk_minus_idle_p50_ms"] = round(
        results["small_p99_under_bulk_ms"] - results["small_p50_idle_ms"], 3
    )
    targets = {"opens_per_s": 20000, "bulk_mb_s": 400}
    print(f"{'figure':40} {'value':>12} {'target':>10}")
    for key, value in results.items():
        target = targets.get(key, "≤ 2 ms" if key.endswith("minus_idle_p50_ms") else "")
        print(f"{key:40} {value:>12} {target!s:>10}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
