"""The servers of ``make soak``: Node.js backends, the origin and the edge (one
worker each, JSON logs), started as child processes and stopped by PID.

Not pinned to a CPU (the soak measures memory, not speed). What is sampled of
them: each daemon's worker process (RSS and open descriptors from ``/proc``,
asyncio tasks and open connections from its admin ``/metrics``), and on request
the memory report its worker logs on ``SIGUSR2`` (:mod:`geoedge.memory`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geoedge import devstack
from geoedge.devstack import DevPki, StackError, free_port, tail, wait_healthy, wait_port
from loadtests import edge_stack
from loadtests.edge_stack import children

ROOT = edge_stack.ROOT
NODE_APP = edge_stack.NODE_APP


@dataclass(frozen=True, slots=True)
class Ports:
    nodes: tuple[int, ...]
    edge: int
    edge_admin: int
    tunnel: int
    origin_admin: int

    @classmethod
    def allocate(cls, backends: int) -> Ports:
        return cls(
            tuple(free_port() for _ in range(backends)),
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        )


def make_pki(directory: Path) -> DevPki:
    return devstack.make_dev_pki(directory, edge_id="soak-edge", origin_id="soak-origin")


def edge_toml(keys: DevPki, ports: Ports) -> str:
    """No access log (thousands of lines a second otherwise); the soak's
    thousands of WebSockets all come from 127.0.0.1."""
    return edge_stack.quiet_edge_toml(
        keys,
        https_port=ports.edge,
        admin_port=ports.edge_admin,
        tunnel_port=ports.tunnel,
        drain_timeout_s=2.0,
        max_connections=20000,
    )


def origin_toml(keys: DevPki, ports: Ports) -> str:
    return edge_stack.quiet_origin_toml(
        keys,
        tunnel_port=ports.tunnel,
        admin_port=ports.origin_admin,
        backends=ports.nodes,
        drain_timeout_s=2.0,
        health=devstack.HealthCheck("/health", interval_s=2.0),
    )


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    rss_kib: int
    open_fds: int


def process_facts(pid: int) -> ProcessFacts:
    return ProcessFacts(edge_stack.rss_kib(pid), edge_stack.open_fds(pid))


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of one series family in the Prometheus text format."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rpartition(" ")[2])
    return total


class SoakStack:
    """Node backends, origin and edge. :meth:`stop` is idempotent."""

    def __init__(self, workdir: Path, backends: int = 2) -> None:
        self.workdir = workdir
        self.ports = Ports.allocate(backends)
        self.keys = make_pki(workdir / "pki")
        self.processes = devstack.ProcessGroup()
        self.workers: dict[str, int] = {}

    def start(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        self.start_backends_and_origin(timeout_s)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        (self.workdir / "edge.toml").write_text(edge_toml(self.keys, self.ports))
        edge_argv = [sys.executable, "-m", "edge", "--config", str(self.workdir / "edge.toml")]
        edge = self._spawn("edge", [*edge_argv, "--log-level", "warning"], env=env)
        wait_port(self.ports.edge, deadline, edge, self.log("edge"))
        wait_healthy(self.ports.edge_admin, deadline, "the edge", self.log("edge"))
        for name in ("edge", "origin"):
            self.workers[name] = self._worker(name, deadline)

    def start_backends_and_origin(self, timeout_s: float = 60.0) -> None:
        """The Node backends and the origin (the edge is the caller's to start)."""
        deadline = time.monotonic() + timeout_s
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for index, port in enumerate(self.ports.nodes):
            node = self._spawn(f"node{index}", ["node", str(NODE_APP), str(port)])
            wait_port(port, deadline, node, self.log(f"node{index}"))
        (self.workdir / "origin.toml").write_text(origin_toml(self.keys, self.ports))
        origin = self._spawn(
            "origin",
            [sys.executable, "-m", "origin", "--config", str(self.workdir / "origin.toml")],
            env=env,
        )
        wait_port(self.ports.tunnel, deadline, origin, self.log("origin"))

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        return self.processes.spawn(name, argv, log=self.log(name), cwd=ROOT, env=env)

    def _worker(self, name: str, deadline: float) -> int:
        while time.monotonic() < deadline:
            found = children(self.processes.procs[name].pid)
            if len(found) == 1:
                return found[0]
            time.sleep(0.05)
        raise StackError(f"{name}: expected one worker process:\n{tail(self.log(name))}")

    def check_alive(self) -> None:
        for name in self.processes.exited():
            code = self.processes.procs[name].returncode
            raise StackError(f"{name} exited with {code}:\n{tail(self.log(name))}")
        for name, pid in self.workers.items():
            if not Path(f"/proc/{pid}").exists():
                raise StackError(f"{name}'s worker {pid} is gone:\n{tail(self.log(name))}")

    def facts(self, name: str) -> ProcessFacts:
        return process_facts(self.workers[name])

    def metrics(self, name: str) -> str:
        port = self.ports.edge_admin if name == "edge" else self.ports.origin_admin
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def memory_report(self, name: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """``SIGUSR2`` to the daemon; the report its worker logs (JSON)."""
        log = self.log(name)
        offset = log.stat().st_size
        os.kill(self.processes.procs[name].pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with log.open("rb") as f:
                f.seek(offset)
                for line in f.read().splitlines():
                    with contextlib.suppress(ValueError):
                        record = json.loads(line)
                        if record.get("msg") == "memory report":
                            return record  # type: ignore[no-any-return]
            time.sleep(0.1)
        raise StackError(f"{name}: no memory report in {log}:\n{tail(log)}")

    def stop(self, grace_s: float = 5.0) -> None:
        self.processes.stop(grace_s)
        edge_stack.kill_orphaned_workers(list(self.workers.values()))
        self.workers.clear()
