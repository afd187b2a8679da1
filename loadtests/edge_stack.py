"""The servers of ``make bench-edge``, started side by side and stopped by PID.

One Node.js backend is shared by both chains:

- geoedge: ``python -m edge`` (one worker) → mutual-TLS tunnel → ``python -m
  origin`` (one worker) → Node.js;
- HAProxy 2.6 (Debian's ``/usr/sbin/haproxy``, one thread, foreground): TLS
  termination → Node.js.

Both terminate TLS with the same ECDSA P-256 certificate and key. Every server
process is started under ``taskset -c 0`` so that the workers the daemons fork
inherit the pinning; the load generators run on CPU 1.

Process facts come from ``/proc`` (no psutil): CPU time of a process tree
(``/proc/<pid>/stat``), children (``/proc/<pid>/task/*/children``), resident
memory (``VmRSS``) and open descriptors.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from geoedge import devstack
from geoedge.devstack import DevPki, StackError, free_port, tail, wait_healthy, wait_port

__all__ = ["StackError", "free_port", "tail", "wait_healthy", "wait_port"]

ROOT = Path(__file__).resolve().parent.parent
NODE_APP = ROOT / "deploy" / "node-app" / "server.js"
HAPROXY = "/usr/sbin/haproxy"
SERVER_CPU = 0
CLIENT_CPU = 1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def pinned(cpu: int, argv: list[str]) -> list[str]:
    """``argv`` under ``taskset -c cpu`` (as is, on a machine with one CPU)."""
    if (os.cpu_count() or 1) <= cpu or shutil.which("taskset") is None:
        return argv
    return ["taskset", "-c", str(cpu), *argv]


# ------------------------------------------------------------------ /proc facts


def children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                listed = Path(f"/proc/{pid}/task/{task}/children").read_text()
                found += [int(x) for x in listed.split()]
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(pids: list[int]) -> float:
    """CPU time of ``pids`` and their live descendants."""
    total, todo, seen = 0.0, list(pids), set[int]()
    while todo and len(seen) < 1000:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += cpu_seconds(pid)
        todo += children(pid)
    return total


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise StackError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


CpuTimes = dict[str, tuple[int, int]]


def cpu_busy() -> CpuTimes:
    """Per-CPU (busy, total) jiffies from /proc/stat, for utilisation over an interval."""
    out: CpuTimes = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            v = [int(x) for x in values]
            out[name] = (sum(v) - v[3] - v[4], sum(v))
    return out


def busy_share(before: CpuTimes, after: CpuTimes, cpu: int) -> float:
    name = f"cpu{cpu}"
    if name not in before or name not in after:
        return 0.0
    busy = after[name][0] - before[name][0]
    total = after[name][1] - before[name][1]
    return busy / total if total > 0 else 0.0


# ------------------------------------------------------------------ configs


def make_pki(directory: Path) -> DevPki:
    return devstack.make_dev_pki(directory, edge_id="bench-edge", origin_id="bench-origin")


def combined_pem(keys: DevPki, path: Path) -> Path:
    """The client-facing certificate and its key in one PEM, as HAProxy's ``crt`` wants it."""
    path.write_bytes(keys.server.cert.read_bytes() + keys.server.key.read_bytes())
    path.chmod(0o600)
    return path


@dataclass(frozen=True, slots=True)
class Ports:
    node: int = field(default_factory=free_port)
    edge: int = field(default_factory=free_port)
    edge_admin: int = field(default_factory=free_port)
    tunnel: int = field(default_factory=free_port)
    origin_admin: int = field(default_factory=free_port)
    haproxy: int = field(default_factory=free_port)


def quiet_edge_toml(
    keys: DevPki,
    *,
    https_port: int,
    admin_port: int,
    tunnel_port: int,
    drain_timeout_s: float,
    max_connections: int,
    h2_engine: str = "auto",
) -> str:
    """The load tests' edge: one worker, no access log, defaults otherwise, but
    for the connection caps, the one per address included (every load test
    client is 127.0.0.1), and the HTTP/2 engine (``[http] h2_engine``)."""
    return devstack.edge_toml(
        keys,
        edge_id=keys.edge_id,
        https_port=https_port,
        admin_port=admin_port,
        origins=[(keys.origin_id, tunnel_port)],
        drain_timeout_s=drain_timeout_s,
        access_log="",
        admission={
            "max_connections": max_connections,
            "max_connections_per_client_ip": max_connections,
        },
        extra="" if h2_engine == "auto" else f'[http]\nh2_engine = "{h2_engine}"\n',
    )


def quiet_origin_toml(
    keys: DevPki,
    *,
    tunnel_port: int,
    admin_port: int,
    backends: Sequence[int],
    drain_timeout_s: float,
    health: devstack.HealthCheck | None = None,
    workers: int = 1,
) -> str:
    """The load tests' origin: ``workers`` worker(s) logging warnings only, no
    access log, one pool ("node") over ``backends``."""
    return devstack.origin_toml(
        keys,
        origin_id=keys.origin_id,
        tunnel_port=tunnel_port,
        admin_port=admin_port,
        allowed_identities=[keys.edge_id],
        backends=backends,
        pool="node",
        health=health,
        workers=workers,
        drain_timeout_s=drain_timeout_s,
        log_level="warning",
        access_log="",
    )


def edge_toml(keys: DevPki, ports: Ports, h2_engine: str = "auto") -> str:
    """HAProxy logs nothing either."""
    return quiet_edge_toml(
        keys,
        https_port=ports.edge,
        admin_port=ports.edge_admin,
        tunnel_port=ports.tunnel,
        drain_timeout_s=1.0,
        max_connections=100000,
        h2_engine=h2_engine,
    )


def origin_toml(keys: DevPki, ports: Ports) -> str:
    return quiet_origin_toml(
        keys,
        tunnel_port=ports.tunnel,
        admin_port=ports.origin_admin,
        backends=[ports.node],
        drain_timeout_s=1.0,
    )


def haproxy_cfg(pem: Path, ports: Ports) -> str:
    """One thread (the process is pinned with taskset, so no cpu-map), no logging.

    Node.js gets the same forwarding headers from HAProxy as from the edge
    (X-Forwarded-For, X-Real-IP, X-Forwarded-Proto, Forwarded, X-Request-Id), so
    that both backends parse the same request heads.
    """
    return f"""
global
    nbthread 1
    maxconn 8000

defaults
    mode http
    option http-keep-alive
    timeout connect 5s
    timeout client 75s
    timeout server 75s
    timeout http-keep-alive 75s
    timeout http-request 10s
    timeout tunnel 1h

frontend tls
    bind 127.0.0.1:{ports.haproxy} ssl crt {pem} alpn h2,http/1.1 ssl-min-ver TLSv1.2
    option forwardfor
    unique-id-format %{{+X}}o%pid%rt
    unique-id-header X-Request-Id
    http-request set-header X-Real-IP %[src]
    http-request set-header X-Forwarded-Proto https
    http-request set-header Forwarded "for=%[src];proto=https;host=\\"%[req.hdr(host)]\\""
    default_backend node

backend node
    server node 127.0.0.1:{ports.node}
"""


# ------------------------------------------------------------------ processes


class Stack:
    """Node, origin, edge and HAProxy, each a process tree started pinned to CPU 0.

    :meth:`stop` signals every process it started (and the workers it saw them
    fork) by PID: SIGTERM, then SIGKILL after a grace period. It is idempotent.
    """

    def __init__(self, workdir: Path, h2_engine: str = "auto") -> None:
        self.workdir = workdir
        self.h2_engine = h2_engine
        self.ports = Ports()
        self.keys = make_pki(workdir / "pki")
        self.haproxy_pem = combined_pem(self.keys, workdir / "pki" / "server-combined.pem")
        self.processes = devstack.ProcessGroup()
        self.forked: list[int] = []

    def start(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        node = self._spawn("node", ["node", str(NODE_APP), str(self.ports.node)])
        wait_port(self.ports.node, deadline, node, self.log("node"))
        (self.workdir / "origin.toml").write_text(origin_toml(self.keys, self.ports))
        (self.workdir / "edge.toml").write_text(edge_toml(self.keys, self.ports, self.h2_engine))
        (self.workdir / "haproxy.cfg").write_text(haproxy_cfg(self.haproxy_pem, self.ports))
        python = [sys.executable, "-m"]
        origin_argv = [*python, "origin", "--config", str(self.workdir / "origin.toml")]
        origin = self._spawn("origin", origin_argv, env=env)
        edge_argv = [*python, "edge", "--config", str(self.workdir / "edge.toml")]
        edge = self._spawn("edge", [*edge_argv, "--log-level", "warning"], env=env)
        haproxy_argv = [HAPROXY, "-db", "-f", str(self.workdir / "haproxy.cfg")]
        haproxy = self._spawn("haproxy", haproxy_argv)
        wait_port(self.ports.tunnel, deadline, origin, self.log("origin"))
        wait_port(self.ports.edge, deadline, edge, self.log("edge"))
        wait_port(self.ports.haproxy, deadline, haproxy, self.log("haproxy"))
        wait_healthy(self.ports.edge_admin, deadline, "the edge (tunnel up)", self.log("edge"))
        self.forked = [*self.worker("edge", deadline), *self.worker("origin", deadline)]

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        return self.processes.spawn(
            name, pinned(SERVER_CPU, argv), log=self.log(name), cwd=ROOT, env=env
        )

    def start_python(self, name: str, argv: list[str], port: int) -> int:
        """``python -m argv`` from the checkout as ``name``, pinned with the other
        servers, once it listens on ``port``; :meth:`check_alive` watches it and
        :meth:`stop` stops it like the rest. Its PID."""
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = self._spawn(name, [sys.executable, "-m", *argv], env=env)
        wait_port(port, time.monotonic() + 20, proc, self.log(name))
        return proc.pid

    def pid(self, name: str) -> int:
        return self.processes.procs[name].pid

    def worker(self, name: str, deadline: float) -> list[int]:
        """The one worker the daemon ``name`` forked (its RSS is the edge's memory)."""
        while time.monotonic() < deadline:
            found = children(self.pid(name))
            if len(found) == 1:
                return found
            time.sleep(0.05)
        raise StackError(f"{name}: expected one worker process:\n{tail(self.log(name))}")

    def server_pids(self, chain: str) -> dict[str, int]:
        """The processes (with their workers) on CPU 0 that serve ``chain``
        ("geoedge" or "haproxy"), by name."""
        names = ("edge", "origin", "node") if chain == "geoedge" else ("haproxy", "node")
        return {name: self.pid(name) for name in names}

    def check_alive(self) -> None:
        for name in self.processes.exited():
            code = self.processes.procs[name].returncode
            raise StackError(f"{name} exited with {code}:\n{tail(self.log(name))}")

    def stop(self, grace_s: float = 5.0) -> None:
        self.processes.stop(grace_s)
        kill_orphaned_workers(self.forked)
        self.forked.clear()


def kill_orphaned_workers(pids: list[int]) -> None:
    """SIGKILL to the daemons' workers still alive after their parent was killed
    (a PID since reused by a process that is not Python is left alone)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"python" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
