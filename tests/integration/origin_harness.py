"""Helpers for the origin's integration tests: real Node.js backends, a real
origin (subprocess or in process), and an edge-like tunnel client that sends
raw HTTP/1.1 on streams. Every process is started and stopped by PID."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from geoedge.config_render import config_to_toml
from origin.config import (
    AdminConfig,
    BackendConfig,
    HealthCheckConfig,
    OriginConfig,
    OriginSection,
    PoolConfig,
)
from origin.daemon import OriginDaemon
from tests.conftest import PkiFiles, scaled
from tests.polling import wait_until_async
from tests.tunnel_env import free_port, listener_config, open_io
from tunnel.aio.connection import TunnelConnection
from tunnel.mux import SessionConfig

ROOT = Path(__file__).resolve().parents[2]
APP_DIR = ROOT / "deploy" / "node-app"
NODE = shutil.which("node")
CLIENT = ("203.0.113.7", 40001)
SERVER = ("198.51.100.10", 443)

needs_node = [
    pytest.mark.skipif(NODE is None, reason="node is not installed"),
    pytest.mark.skipif(
        not (APP_DIR / "node_modules" / "ws").is_dir(),
        reason="deploy/node-app/node_modules is missing (run `make node`)",
    ),
]

T = TypeVar("T")


# --------------------------------------------------------------------------- node backends


@dataclass
class NodeBackend:
    port: int
    args: tuple[str, ...]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        assert NODE is not None and self.process is None
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [NODE, str(APP_DIR / "server.js"), str(self.port), *self.args],
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], scaled(30.0))
        line = self.process.stdout.readline().decode() if ready else ""
        if line.strip() != f"listening on {self.port}":
            self.kill()
            pytest.fail(f"node backend did not start: {line!r}: {self.log_path.read_text()}")

    def kill(self) -> None:
        """SIGKILL: the backend vanishes as in a crash."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(scaled(5.0))
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None


@contextlib.contextmanager
def node_backends(
    tmp: Path, count: int, *, proxy_protocol: bool = False
) -> Iterator[list[NodeBackend]]:
    args = ("--proxy-protocol",) if proxy_protocol else ()
    backends = [NodeBackend(free_port(), args, tmp / f"node-{i}.log") for i in range(count)]
    try:
        for backend in backends:
            backend.start()
        yield backends
    finally:
        for backend in backends:
            backend.kill()


# --------------------------------------------------------------------------- configs


def origin_config(
    test_pki: PkiFiles,
    pools: list[PoolConfig],
    *,
    port: int | None = None,
    workers: int = 1,
    drain_timeout_s: float = 10.0,
    **listener: Any,
) -> OriginConfig:
    listener.setdefault("allowed_identities", ("edge-1", "edge-2"))
    return OriginConfig(
        tunnel_listener=listener_config(test_pki, port or free_port(), **listener),
        pools=tuple(pools),
        origin=OriginSection(
            id="origin-test", workers=workers, drain_timeout_s=drain_timeout_s, log_json=True
        ),
        tunnel=SessionConfig(),
        admin=AdminConfig(address=f"127.0.0.1:{free_port()}"),
    )


def pool(
    backends: list[str], *, name: str = "web", health: bool = True, **settings: Any
) -> PoolConfig:
    check = HealthCheckConfig(interval_s=0.2, timeout_s=0.2, rise=2, fall=2) if health else None
    return PoolConfig(
        name=name,
        default=settings.pop("default", True),
        backends=tuple(BackendConfig(address) for address in backends),
        health=check,
        **settings,
    )


def with_pools(config: OriginConfig, pools: list[PoolConfig]) -> OriginConfig:
    return replace(config, pools=tuple(pools))


# --------------------------------------------------------------------------- origin


@dataclass
class OriginProcess:
    """``python -m origin --config ...`` as a child process."""

    config: OriginConfig
    config_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return int(self.config.tunnel_listener.address.rpartition(":")[2])

    @property
    def admin_url(self) -> str:
        return f"http://{self.config.admin.address}"

    def start(self) -> None:
        self.config_path.write_text(config_to_toml(self.config))
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "origin", "--config", str(self.config_path)],
                cwd=ROOT,
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(scaled(timeout))

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(scaled(timeout))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(scaled(5.0))
        return self.process.returncode

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until /healthz answers 200 (workers up, a backend usable)."""
        deadline = time.monotonic() + scaled(timeout)
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"origin exited: {self.log_path.read_text()[-3000:]}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                status, _ = await admin_request("GET", f"{self.admin_url}/healthz")
                if status == 200:
                    return
            await asyncio.sleep(0.1)
        raise AssertionError(f"origin not ready: {self.log_path.read_text()[-3000:]}")


@contextlib.contextmanager
def origin_process(
    tmp: Path, config: OriginConfig, name: str = "origin"
) -> Iterator[OriginProcess]:
    origin = OriginProcess(config, tmp / f"{name}.toml", tmp / f"{name}.log")
    origin.start()
    try:
        yield origin
    finally:
        origin.stop()


@contextlib.asynccontextmanager
async def origin_in_process(config: OriginConfig) -> Any:
    """An :class:`OriginDaemon` with ``in_process=True`` in this event loop."""
    daemon = OriginDaemon(config, in_process=True)
    task = asyncio.get_running_loop().create_task(daemon.run())
    while daemon.ready is None or not daemon.ready.is_set():
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield daemon
    finally:
        daemon.stop()
        await task


# --------------------------------------------------------------------------- clients


async def admin_request(method: str, url: str) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=scaled(10.0))
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.request(method, url) as response,
    ):
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text


@dataclass
class HttpResult:
    status: int
    headers: bytes
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def http_get(
    connection: TunnelConnection,
    path: str,
    *,
    host: str = "app.test",
    client: tuple[str, int] = CLIENT,
    **metadata: Any,
) -> HttpResult:
    """One ``Connection: close`` request on a new stream, as an edge would send it."""
    io = open_io(connection, client_address=client, server_address=SERVER, host=host, **metadata)
    io.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    # Like a browser, no half-close after the request (Node.js's http server drops a
    # request whose client half-closes before the answer); the side is closed once
    # the answer has ended, as an edge does when its client goes.
    data = await io.read_all()
    io.write_eof()
    head, _, body = data.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        # The backend went away before answering (a request in flight when a
        # test kills it): the stream ends cleanly with no response at all.
        raise ConnectionError(f"no HTTP response on the stream ({len(data)} octets)")
    return HttpResult(int(parts[1]), head, body)


def metric_values(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one series family in the Prometheus text format."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


def eventually(measure: Callable[[], T], done: Callable[[T], bool], timeout_s: float = 15.0) -> T:
    """Measure until ``done`` (a worker publishes its per-stream counts once a
    second, origin.publisher.PUBLISH_INTERVAL_S): the last measurement either way,
    for the caller's assertion to show."""
    deadline = time.monotonic() + scaled(timeout_s)
    value = measure()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = measure()
    return value


async def metrics_when(
    config: OriginConfig, name: str, done: Callable[[float], bool], timeout_s: float = 15.0
) -> str:
    """The origin's /metrics once the sum of the family ``name`` satisfies
    ``done`` (per-stream counts are published once a second), or at the deadline."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        _, text = await admin_request("GET", f"http://{config.admin.address}/metrics")
        if done(sum(metric_values(text, name).values())) or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------- held requests


def gate(group: str) -> str:
    """A path Node holds (``/gate``) until :func:`release_gate` opens its group:
    a request in flight for as long as the test needs, whatever the machine's speed."""
    return f"/gate?n=2&group={group}&ms={int(scaled(120) * 1000)}"


async def release_gate(backends: list[NodeBackend], group: str) -> None:
    """Answer the request held in ``group`` by sending the second of its group
    to every backend (the one not holding it answers its own 504 at once)."""

    async def one(backend: NodeBackend) -> None:
        url = f"http://{backend.address}/gate?n=2&group={group}&ms=200"
        timeout = aiohttp.ClientTimeout(total=scaled(10.0))
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as answer:
            await answer.read()

    await asyncio.gather(*(one(b) for b in backends))


async def streams_started(config: OriginConfig) -> float:
    """How many streams the origin has put on a backend connection (published
    once a second)."""
    _, text = await admin_request("GET", f"http://{config.admin.address}/metrics")
    return sum(metric_values(str(text), "geoedge_origin_streams_total").values())


async def wait_streams_started(config: OriginConfig, above: float) -> None:
    """Until the origin counts more than ``above`` streams started: a request
    sent since reached its backend."""

    async def started() -> bool:
        return await streams_started(config) > above

    await wait_until_async(started, "the request never reached a backend")
