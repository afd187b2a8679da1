"""Full TLS 1.3 handshakes per second, from a client that never resumes.

wrk and h2load resume TLS sessions, so they measure resumption, not the full
handshake (ECDHE + an ECDSA signature on the server) that a new visitor costs.
The client here opens a new connection for every request, never offers a
session, sends one small ``GET`` with ``Connection: close`` and reads the whole
response.

Two implementations, the first one available wins:

- ``go``: ``loadtests/hsclient/main.go``, built at run time (a Go toolchain:
  ``go`` on the PATH or in /usr/local/go) into ``~/.cache/geoedge-bench``, keyed
  by a hash of its source; nothing binary is committed. About 0.3 ms of client
  CPU per connection here, so one core saturates HAProxy (about 0.45 ms on its
  side, plus Node's).
- ``python``: this module's own asyncio client on uvloop, about 0.45 ms per
  connection; it can be the bottleneck against HAProxy, which the benchmark
  reports (the client's CPU share).

Run as a module it is the Python client: ``python -m loadtests.handshake_client
--port N --seconds S --concurrency C`` prints one JSON object, like the Go one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import resource
import shutil
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GO_SOURCE = Path(__file__).resolve().parent / "hsclient"
REQUEST = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"


@dataclass(frozen=True, slots=True)
class HandshakeRun:
    connections: int
    errors: int
    seconds: float
    first_error: str
    client: str
    """Which client ran: ``go`` or ``python``."""
    client_cpu_s: float
    """CPU time (user + system) the client process used."""

    @property
    def per_s(self) -> float:
        return self.connections / self.seconds if self.seconds > 0 else 0.0

    @property
    def client_cpu_share(self) -> float:
        """Share of one core the client used (near 1.0: the client may be the bottleneck)."""
        return self.client_cpu_s / self.seconds if self.seconds > 0 else 0.0


def find_go() -> str | None:
    found = shutil.which("go")
    if found is None and os.access("/usr/local/go/bin/go", os.X_OK):
        found = "/usr/local/go/bin/go"
    return found


def go_client(log: list[str]) -> Path | None:
    """The built Go client (built now if its source changed), or None without Go."""
    go = find_go()
    if go is None:
        log.append("no Go toolchain: using the Python handshake client")
        return None
    digest = hashlib.sha256()
    for name in ("go.mod", "main.go"):
        digest.update((GO_SOURCE / name).read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "geoedge-bench"
    binary = cache / f"hsclient-{digest.hexdigest()[:16]}"
    if binary.exists():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(f".{os.getpid()}.tmp")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOPROXY": "off", "CGO_ENABLED": "0"}
    try:
        subprocess.run(
            [go, "build", "-trimpath", "-o", str(partial), "."],
            cwd=GO_SOURCE,
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.append(
            f"building the Go client failed ({detail.decode(errors='replace')[-500:]}):"
            " using the Python handshake client"
        )
        return None
    partial.replace(binary)
    for stale in cache.glob("hsclient-*"):  # builds of older sources
        if stale != binary and stale.suffix != ".tmp":
            stale.unlink(missing_ok=True)
    return binary


def run_handshakes(
    argv_prefix: list[str], port: int, seconds: float, concurrency: int, client: Path | None
) -> HandshakeRun:
    """One timed run against 127.0.0.1:``port``; ``argv_prefix`` pins it (taskset)."""
    if client is not None:
        argv = [str(client), "-addr", f"127.0.0.1:{port}", "-c", str(concurrency)]
        argv += ["-d", f"{seconds}s"]
        env = {**os.environ, "GOMAXPROCS": "1"}
        name = "go"
    else:
        argv = [sys.executable, "-m", "loadtests.handshake_client", "--port", str(port)]
        argv += ["--seconds", str(seconds), "--concurrency", str(concurrency)]
        env = dict(os.environ)
        name = "python"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [*argv_prefix, *argv], capture_output=True, env=env, timeout=seconds + 60, check=False
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"handshake client failed: {done.stderr.decode(errors='replace')}")
    result = json.loads(done.stdout)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return HandshakeRun(
        connections=int(result["connections"]),
        errors=int(result["errors"]),
        seconds=float(result["seconds"]),
        first_error=str(result.get("first_error") or ""),
        client=name,
        client_cpu_s=cpu,
    )


# ------------------------------------------------------------------ Python client


class _OneRequest(asyncio.Protocol):
    """Send the request when the handshake is done; done at the server's close."""

    __slots__ = ("done", "head")

    def __init__(self, done: asyncio.Future[bytes]) -> None:
        self.done = done
        self.head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(REQUEST)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if len(self.head) < 16:
            self.head += data[: 16 - len(self.head)]

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(self.head)


async def python_client(port: int, seconds: float, concurrency: int) -> dict[str, object]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the CertificateVerify signature is still checked
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_ecdh_curve("X25519")
    loop = asyncio.get_running_loop()
    counts = {"connections": 0, "errors": 0}
    first_error: list[str] = []
    start = time.monotonic()
    deadline = start + seconds

    async def one() -> None:
        done: asyncio.Future[bytes] = loop.create_future()
        await loop.create_connection(
            lambda: _OneRequest(done), "127.0.0.1", port, ssl=context, server_hostname="localhost"
        )
        head = await asyncio.wait_for(done, 10)
        if not head.startswith(b"HTTP/1.1 200 "):
            raise RuntimeError(f"bad response {head!r}")

    async def worker() -> None:
        while time.monotonic() < deadline:
            try:
                await one()
                counts["connections"] += 1
            except (OSError, RuntimeError, TimeoutError, ssl.SSLError) as exc:
                counts["errors"] += 1
                first_error[:] = first_error or [repr(exc)]
                await asyncio.sleep(0.001)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - start
    return {**counts, "seconds": elapsed, "first_error": first_error[0] if first_error else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    if not 0 < args.seconds <= 600 or not 0 < args.concurrency <= 4096:
        parser.error("need 0 < --seconds <= 600 and 0 < --concurrency <= 4096")
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        result = uvloop.run(python_client(args.port, args.seconds, args.concurrency))
        print(json.dumps(result))
        return 0
    return 130


if __name__ == "__main__":
    raise SystemExit(main())
