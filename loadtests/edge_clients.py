"""Load generators of ``make bench-edge`` other than the handshake client.

- :func:`run_wrk`: keep-alive requests per second with Debian's ``wrk``.
- :func:`measure_latency`: sequential requests, one at a time, on one keep-alive
  connection per target, the targets taken in turn so that noise on the shared
  machine falls on all of them alike. A blocking Python client is enough here:
  it measures latency, not throughput, and its own cost is the same for every
  target apart from the TLS record work.
- :func:`hold_websockets`: thousands of idle WSS connections (``websockets``
  on uvloop), each having echoed one message, held while the caller measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import resource
import socket
import ssl
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from websockets.asyncio.client import ClientConnection, connect

T = TypeVar("T")
CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]+)", re.IGNORECASE)
MAX_HEAD = 64 * 1024


def client_tls_context() -> ssl.SSLContext:
    """No verification (it is the benchmark's own certificate on loopback)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    return context


# ------------------------------------------------------------------ keep-alive


@dataclass(frozen=True, slots=True)
class WrkRun:
    requests_per_s: float
    requests: int
    errors: int
    """Socket errors plus non-2xx/3xx responses."""
    client_cpu_share: float


def run_wrk(argv_prefix: list[str], url: str, seconds: float, connections: int) -> WrkRun:
    """``wrk -t1 -c<connections> -d<seconds>s url``, pinned by ``argv_prefix``."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", url]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        [*argv_prefix, *argv], capture_output=True, text=True, timeout=seconds + 60, check=False
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = done.stdout
    rate = re.search(r"Requests/sec:\s*([0-9.]+)", out)
    total = re.search(r"([0-9]+) requests in", out)
    if done.returncode != 0 or rate is None or total is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {out}{done.stderr}")
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) ([0-9]+)", out))
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s*([0-9]+)", out)
    errors += int(non_2xx.group(1)) if non_2xx else 0
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return WrkRun(float(rate.group(1)), int(total.group(1)), errors, cpu / wall)


@dataclass(frozen=True, slots=True)
class H2loadRun:
    requests_per_s: float
    requests: int
    errors: int
    client_cpu_share: float


def run_h2load(
    argv_prefix: list[str], url: str, seconds: float, connections: int, streams: int
) -> H2loadRun:
    """``h2load`` (nghttp2) over HTTP/2: ``connections`` connections with
    ``streams`` requests in flight on each, for ``seconds`` (after a 1 s warm-up)."""
    argv = [
        "h2load", "-t1", f"-c{connections}", f"-m{streams}",
        f"-D{max(1, round(seconds))}", "--warm-up-time=1", url,
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        [*argv_prefix, *argv], capture_output=True, text=True, timeout=seconds + 60, check=False
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = done.stdout
    rate = re.search(r"finished in [0-9.]+\w+, ([0-9.]+) req/s", out)
    counts = re.search(
        r"requests: [0-9]+ total, [0-9]+ started, ([0-9]+) done, ([0-9]+) succeeded, "
        r"([0-9]+) failed, ([0-9]+) errored",
        out,
    )
    protocol = re.search(r"Application protocol: (\S+)", out)
    if done.returncode != 0 or rate is None or counts is None:
        raise RuntimeError(f"h2load failed ({done.returncode}): {out}{done.stderr}")
    if protocol is None or protocol.group(1) != "h2":
        raise RuntimeError(f"h2load did not speak h2 to {url}: {out}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    errors = int(counts.group(3)) + int(counts.group(4))
    return H2loadRun(float(rate.group(1)), int(counts.group(2)), errors, cpu / wall)


# ------------------------------------------------------------------ latency


class KeepAliveConnection:
    """``GET /`` again and again on one blocking connection; the body is read whole."""

    def __init__(self, port: int, tls: bool, timeout_s: float = 5.0) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls:
            sock = client_tls_context().wrap_socket(sock, server_hostname="localhost")
        self.sock = sock
        self.buffer = b""

    def get(self) -> None:
        self.sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self._fill()
            if len(self.buffer) > MAX_HEAD:
                raise RuntimeError("response head too long")
        head = self.buffer[: end + 2]
        if not head.startswith(b"HTTP/1.1 200 "):
            raise RuntimeError(f"unexpected response: {head[:80]!r}")
        length = CONTENT_LENGTH.search(head)
        if length is None:
            raise RuntimeError("response without Content-Length")
        total = end + 4 + int(length.group(1))
        while len(self.buffer) < total:
            self._fill()
        self.buffer = self.buffer[total:]

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise RuntimeError("connection closed by the server")
        self.buffer += data

    def close(self) -> None:
        self.sock.close()


@dataclass(frozen=True, slots=True)
class LatencySample:
    p50_ms: float
    p99_ms: float
    requests: int


def measure_latency(
    targets: dict[str, tuple[int, bool]], requests: int, warmup: int = 100
) -> dict[str, LatencySample]:
    """Per target name, (port, tls): p50/p99 of ``requests`` sequential GETs."""
    connections = {name: KeepAliveConnection(port, tls) for name, (port, tls) in targets.items()}
    times: dict[str, list[int]] = {name: [] for name in targets}
    try:
        for i in range(warmup + requests):
            for name, connection in connections.items():
                start = time.perf_counter_ns()
                connection.get()
                elapsed = time.perf_counter_ns() - start
                if i >= warmup:
                    times[name].append(elapsed)
    finally:
        for connection in connections.values():
            connection.close()
    return {name: _summary(values) for name, values in times.items()}


def _summary(values_ns: list[int]) -> LatencySample:
    ordered = sorted(values_ns)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    p50 = statistics.median(ordered)
    return LatencySample(round(p50 / 1e6, 4), round(p99 / 1e6, 4), len(ordered))


# ------------------------------------------------------------------ websockets


@dataclass(frozen=True, slots=True)
class HeldWebSockets:
    held: int
    failed: int
    first_error: str
    connect_s: float


async def hold_websockets(
    port: int,
    count: int,
    concurrency: int,
    measure: Callable[[], T],
    settle_s: float = 2.0,
    timeout_s: float = 300.0,
) -> tuple[HeldWebSockets, T]:
    """Open ``count`` idle WSS connections to ``/ws`` (each echoes one message),
    wait ``settle_s``, call ``measure()`` with all of them open, then drop them."""
    context = client_tls_context()
    limit = asyncio.Semaphore(concurrency)
    opened: list[ClientConnection] = []
    echoed_ok = 0
    errors: list[str] = []

    async def open_one(i: int) -> None:
        nonlocal echoed_ok
        async with limit:
            try:  # any failure is counted and reported, never fatal to the run
                ws = await connect(
                    f"wss://127.0.0.1:{port}/ws",
                    ssl=context,
                    compression=None,
                    ping_interval=None,  # idle means idle: no keepalive pings
                    open_timeout=30,
                    close_timeout=1,
                )
                opened.append(ws)
                message = f"hello {i}"
                await ws.send(message)
                echoed = await asyncio.wait_for(ws.recv(), 30)
                if echoed != message:
                    raise RuntimeError(f"echo mismatch: {echoed!r}")
                echoed_ok += 1
            except Exception as exc:
                errors.append(repr(exc))

    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(open_one(i) for i in range(count)))
        connect_s = time.monotonic() - started
        await asyncio.sleep(settle_s)
        value = measure()
    finally:
        for ws in opened:
            with contextlib.suppress(Exception):
                ws.transport.abort()
        await asyncio.sleep(0)
    stats = HeldWebSockets(echoed_ok, len(errors), errors[0] if errors else "", connect_s)
    return stats, value
