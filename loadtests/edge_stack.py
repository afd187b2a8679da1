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
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from geoedge import pki

ROOT = Path(__file__).resolve().parent.parent
NODE_APP = ROOT / "deploy" / "node-app" / "server.js"
HAPROXY = "/usr/sbin/haproxy"
SERVER_CPU = 0
CLIENT_CPU = 1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class StackError(RuntimeError):
    """A server did not start (the message carries the end of its log)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


@dataclass(frozen=True, slots=True)
class Pki:
    ca: Path
    server: pki.CertPaths
    """The client-facing certificate (ECDSA P-256), served by both chains."""
    combined: Path
    """Certificate + key in one PEM, as HAProxy's ``crt`` wants it."""
    edge: pki.CertPaths
    origin: pki.CertPaths


def make_pki(directory: Path) -> Pki:
    pki.create_ca(directory / "ca")
    ca = pki.load_ca(directory / "ca")
    server = pki.issue_server_cert(ca, directory, "server", ["localhost", "127.0.0.1"])
    edge = pki.issue_peer_cert(ca, directory, "edge", "bench-edge", role="edge")
    origin = pki.issue_peer_cert(
        ca, directory, "origin", "bench-origin", role="origin", dns_names=["localhost"]
    )
    combined = directory / "server-combined.pem"
    combined.write_bytes(server.cert.read_bytes() + server.key.read_bytes())
    combined.chmod(0o600)
    return Pki(ca.paths.cert, server, combined, edge, origin)


@dataclass(frozen=True, slots=True)
class Ports:
    node: int = field(default_factory=free_port)
    edge: int = field(default_factory=free_port)
    edge_admin: int = field(default_factory=free_port)
    tunnel: int = field(default_factory=free_port)
    origin_admin: int = field(default_factory=free_port)
    haproxy: int = field(default_factory=free_port)


def edge_toml(keys: Pki, ports: Ports) -> str:
    """One worker, no access log (HAProxy logs nothing either), defaults otherwise,
    but for the per-address connection cap: every benchmark client is 127.0.0.1."""
    return f"""
[edge]
id = "bench-edge"
workers = 1
drain_timeout_s = 1.0

[[listeners]]
address = "127.0.0.1:{ports.edge}"

[tls]
[[tls.certificates]]
cert = "{keys.server.cert}"
key = "{keys.server.key}"

[http]
access_log = ""

[limits]
max_connections = 100000
max_connections_per_client_ip = 100000

[admin]
address = "127.0.0.1:{ports.edge_admin}"

[[origins]]
name = "bench-origin"
[origins.tunnel]
address = "127.0.0.1:{ports.tunnel}"
server_name = "localhost"
cert = "{keys.edge.cert}"
key = "{keys.edge.key}"
ca = "{keys.ca}"
"""


def origin_toml(keys: Pki, ports: Ports) -> str:
    return f"""
[origin]
id = "bench-origin"
workers = 1
drain_timeout_s = 1.0
log_level = "warning"
access_log = ""

[tunnel_listener]
address = "127.0.0.1:{ports.tunnel}"
cert = "{keys.origin.cert}"
key = "{keys.origin.key}"
ca = "{keys.ca}"
allowed_identities = ["bench-edge"]

[[pools]]
name = "node"
default = true
[[pools.backends]]
address = "127.0.0.1:{ports.node}"

[admin]
address = "127.0.0.1:{ports.origin_admin}"
"""


def haproxy_cfg(keys: Pki, ports: Ports) -> str:
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
    bind 127.0.0.1:{ports.haproxy} ssl crt {keys.combined} alpn h2,http/1.1 ssl-min-ver TLSv1.2
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


def wait_port(port: int, deadline: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"{proc.args!r} exited with {proc.returncode}:\n{tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise StackError(f"nothing listening on 127.0.0.1:{port} ({proc.args!r}):\n{tail(log)}")


def wait_healthy(port: int, deadline: float, what: str, log: Path) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        time.sleep(0.1)
    raise StackError(f"{what} never became healthy:\n{tail(log)}")


def tail(log: Path, limit: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-limit:]
    return "(no log)"


class Stack:
    """Node, origin, edge and HAProxy, each a process tree started pinned to CPU 0.

    :meth:`stop` signals every process it started (and the workers it saw them
    fork) by PID: SIGTERM, then SIGKILL after a grace period. It is idempotent.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = Ports()
        self.keys = make_pki(workdir / "pki")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.forked: list[int] = []

    def start(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        node = self._spawn("node", ["node", str(NODE_APP), str(self.ports.node)])
        wait_port(self.ports.node, deadline, node, self.log("node"))
        (self.workdir / "origin.toml").write_text(origin_toml(self.keys, self.ports))
        (self.workdir / "edge.toml").write_text(edge_toml(self.keys, self.ports))
        (self.workdir / "haproxy.cfg").write_text(haproxy_cfg(self.keys, self.ports))
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

    def _spawn(self, name: str, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        log = open(self.log(name), "wb")  # noqa: SIM115 - the child holds it
        try:
            proc = subprocess.Popen(  # type: ignore[call-overload]
                pinned(SERVER_CPU, argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,  # a Ctrl-C at the terminal reaches us only
                **kw,
            )
        finally:
            log.close()
        self.procs[name] = proc
        return proc  # type: ignore[no-any-return]  # Popen(**kw) is untyped

    def pid(self, name: str) -> int:
        return self.procs[name].pid

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
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise StackError(f"{name} exited with {proc.returncode}:\n{tail(self.log(name))}")

    def stop(self, grace_s: float = 5.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.05, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for pid in self.forked:  # workers orphaned by a parent that had to be killed
            with contextlib.suppress(OSError):
                if b"python" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        self.procs.clear()
        self.forked.clear()
