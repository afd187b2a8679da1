"""Real processes for end-to-end tests: Node.js backends, an origin, an edge.

The stand-in origin here (:class:`PipeOrigin`) is a tunnel listener that pipes
each stream to one Node.js backend; the real origin balancer has its own suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import PkiFiles
from tests.tunnel_env import free_port

ROOT = Path(__file__).resolve().parent.parent
NODE_APP = ROOT / "deploy" / "node-app" / "server.js"


def node_available() -> bool:
    return (ROOT / "deploy" / "node-app" / "node_modules").is_dir()


def wait_port(port: int, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port}")


class Processes:
    """Started processes, stopped by PID at the end (SIGTERM, then SIGKILL)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, **kw)  # type: ignore[call-overload]
        self.procs.append(proc)
        return proc

    def node(self, port: int, *extra: str) -> subprocess.Popen[bytes]:
        proc = self.start(["node", str(NODE_APP), str(port), *extra],
                          stdout=subprocess.DEVNULL)
        wait_port(port)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def write_edge_config(
    path: Path,
    pki: PkiFiles,
    *,
    https_port: int,
    admin_port: int,
    origins: list[tuple[str, int]],
    extra: str = "",
    workers: int = 1,
    listener_extra: str = "",
) -> Path:
    origin_tables = "\n".join(
        f"""
[[origins]]
name = "{name}"
[origins.tunnel]
address = "127.0.0.1:{port}"
server_name = "localhost"
cert = "{pki.edge.cert}"
key = "{pki.edge.key}"
ca = "{pki.ca}"
connections = 2
connect_timeout_s = 2.0
backoff_base_s = 0.05
backoff_cap_s = 0.5
"""
        for name, port in origins
    )
    path.write_text(
        f"""
[edge]
id = "test-edge"
workers = {workers}
drain_timeout_s = 5.0

[[listeners]]
address = "127.0.0.1:{https_port}"
{listener_extra}

[tls]
[[tls.certificates]]
cert = "{pki.server.cert}"
key = "{pki.server.key}"

[admin]
address = "127.0.0.1:{admin_port}"

[tunnel]
ping_interval_s = 0.5
ping_timeout_s = 2.0
{extra}
{origin_tables}
"""
    )
    return path


def start_edge(procs: Processes, config: Path, log_file: Path) -> subprocess.Popen[bytes]:
    out = open(log_file, "wb")  # noqa: SIM115 - closed by the process' exit
    return procs.start(
        [sys.executable, "-m", "edge", "--config", str(config), "--log-format", "plain"],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def pipe_origin_handler(io: object, backend_port: int) -> None:
    """Stand-in origin: pipe one stream to a backend, both ways, with half-close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", backend_port)

    async def up() -> None:
        while chunk := await io.read(65536):  # type: ignore[attr-defined]
            writer.write(chunk)
            await writer.drain()
        writer.write_eof()

    async def down() -> None:
        while chunk := await reader.read(65536):
            io.write(chunk)  # type: ignore[attr-defined]
            await io.drain()  # type: ignore[attr-defined]
        io.write_eof()  # type: ignore[attr-defined]

    try:
        await asyncio.gather(up(), down())
    except Exception:
        io.abort()  # type: ignore[attr-defined]
    finally:
        writer.close()
