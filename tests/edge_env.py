"""Real processes for end-to-end tests: Node.js backends, an origin, an edge.

The stand-in origin here (:class:`PipeOrigin`) is a tunnel listener that pipes
each stream to one Node.js backend; the real origin balancer has its own suite.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from geoedge import devstack
from geoedge.pki import CertPaths
from tests.conftest import PkiFiles, scaled
from tests.tunnel_env import free_port

ROOT = Path(__file__).resolve().parent.parent
NODE_APP = ROOT / "deploy" / "node-app" / "server.js"


def node_available() -> bool:
    return (ROOT / "deploy" / "node-app" / "node_modules").is_dir()


def load_test_marks(*, wrk: bool) -> list[pytest.MarkDecorator]:
    """A load test's short run beside HAProxy: skipped without Node.js's app,
    HAProxy (and ``wrk``, when it drives the load) or a second CPU for the client."""
    marks = [
        pytest.mark.harness,
        pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed"),
        pytest.mark.skipif(
            not os.access("/usr/sbin/haproxy", os.X_OK), reason="haproxy is not installed"
        ),
        pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs (servers, client)"),
        pytest.mark.timeout(scaled(240)),
    ]
    if wrk:
        marks.append(pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed"))
    return marks


def run_load_test(module: str, *args: str, timeout: float) -> str:
    """``python -m module args`` from the checkout (a load test in a short run):
    its output, once it exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def wait_port(port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    """Until ``port`` accepts; the timeout (scaled) only bounds a failure, so it
    is generous: a process starting on a busy machine may take seconds."""
    try:
        devstack.wait_port(port, time.monotonic() + scaled(timeout), host=host)
    except devstack.StackError as exc:
        raise TimeoutError(str(exc)) from None


class Processes:
    """Started processes, stopped by PID at the end (SIGTERM, then SIGKILL)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, **kw)  # type: ignore[call-overload]
        self.procs.append(proc)
        return proc

    def node(self, port: int, *extra: str) -> subprocess.Popen[bytes]:
        proc = self.start(["node", str(NODE_APP), str(port), *extra], stdout=subprocess.DEVNULL)
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
    tls_extra: str = "",
    extra_top: str = "",
    tls_table: str = "",
    certificate: CertPaths | None = None,
    edge_keys: str = "",
) -> Path:
    """``tls_table``: keys of [tls] itself; ``tls_extra``: keys of the first
    [[tls.certificates]] entry and more entries; ``certificate``: the first
    entry's files (default: ``pki.server``)."""
    path.write_text(
        devstack.edge_toml(
            pki,
            edge_id="test-edge",
            https_port=https_port,
            admin_port=admin_port,
            certificate=certificate,
            origins=origins,
            workers=workers,
            tunnel={"ping_interval_s": 0.5, "ping_timeout_s": 2.0},
            origin_tunnel={
                "connections": 2,
                "connect_timeout_s": 2.0,
                "backoff_base_s": 0.05,
                "backoff_cap_s": 0.5,
            },
            top=extra_top,
            edge_keys=edge_keys,
            listener_keys=listener_extra,
            tls_keys=tls_table,
            certificate_keys=tls_extra,
            extra=extra,
        )
    )
    return path


def start_edge(
    procs: Processes, config: Path, log_file: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    out = open(log_file, "wb")  # noqa: SIM115 - closed by the process' exit
    return procs.start(
        [sys.executable, "-m", "edge", "--config", str(config), "--log-format", "plain"],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


@dataclass
class Stack:
    pki: PkiFiles
    https_port: int
    admin_port: int
    node_port: int
    origin_port: int
    edge: subprocess.Popen[bytes]
    log: Path
    origin_cmd: list[str]
    procs: Processes
    origin: subprocess.Popen[bytes] | None = None
    origin_admin_port: int = 0

    def tls_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki.ca))

    @contextlib.contextmanager
    def tls_socket(self, timeout: float = 10) -> Iterator[ssl.SSLSocket]:
        """A TLS connection to the edge's HTTPS listener, for raw bytes."""
        with (
            socket.create_connection(
                ("127.0.0.1", self.https_port), timeout=scaled(timeout)
            ) as raw,
            self.tls_context().wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            yield tls

    def https(self, timeout: float = 10) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.https_port, context=self.tls_context(), timeout=scaled(timeout)
        )

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        conn = self.https()
        try:
            conn.request("GET", path, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    @property
    def origin_log(self) -> Path:
        return self.log.parent / "origin.log"

    def start_origin(self) -> None:
        out = open(self.origin_log, "ab")  # noqa: SIM115 - closed by the process' exit
        self.origin = self.procs.start(
            self.origin_cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
        out.close()
        wait_port(self.origin_port)

    def stop_origin(self) -> None:
        assert self.origin is not None
        self.origin.kill()
        self.origin.wait()

    def metrics(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=scaled(5))
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()

    def origin_metrics(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.origin_admin_port, timeout=scaled(5))
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()

    def answer_gate(self, path: str) -> None:
        """Send the last request of a ``/gate`` group straight to Node (the
        sample app holds each request of a group until all are there): every
        request of the group held there is answered."""
        direct = http.client.HTTPConnection("127.0.0.1", self.node_port, timeout=scaled(20))
        try:
            direct.request("GET", path)
            assert direct.getresponse().status == 200
        finally:
            direct.close()

    def edge_count(self, name: str, having: str = "") -> float:
        """The edge's series ``name`` summed over its labels (those whose labels
        contain ``having``); workers publish their counts once a second."""
        return metric_sum(self.metrics(), name, having)

    def origin_count(self, name: str, having: str = "") -> float:
        """:meth:`edge_count` of the origin's /metrics."""
        return metric_sum(self.origin_metrics(), name, having)


def tcp_established(local_port: int, remote_port: int) -> bool:
    """A loopback TCP connection from ``local_port`` to ``remote_port`` is
    ESTABLISHED (/proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        if (
            int(local.rpartition(":")[2], 16) == local_port
            and int(remote.rpartition(":")[2], 16) == remote_port
            and state == "01"
        ):
            return True
    return False


def tcp_connections_to(remote_port: int) -> int:
    """Loopback TCP connections to ``remote_port`` that are ESTABLISHED
    (/proc/net/tcp): a backend's open connections, parked ones included."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].rpartition(":")[2], 16) == remote_port and fields[3] == "01":
            count += 1
    return count


def metric_sum(text: str, name: str, having: str = "") -> float:
    """The sum of one series family's samples in the Prometheus text format,
    over the samples whose labels contain ``having`` (``'status="200"'``)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            labels, _, value = line.rpartition(" ")
            if having in labels[len(name) :]:
                total += float(value)
    return total


def write_origin_config(
    path: Path,
    pki: PkiFiles,
    *,
    port: int,
    backends: list[int],
    health: bool = True,
    admin_port: int | None = None,
    pool_extra: str = "",
    workers: int = 1,
) -> Path:
    """A real origin balancer's config: one default pool over ``backends``;
    ``pool_extra``: more keys of that pool (TOML lines)."""
    path.write_text(
        devstack.origin_toml(
            pki,
            origin_id="origin-1",
            tunnel_port=port,
            admin_port=admin_port or free_port(),
            allowed_identities=["edge-1"],
            backends=backends,
            workers=workers,
            health=devstack.HealthCheck("/health", interval_s=0.5, timeout_s=0.4)
            if health
            else None,
            log_json=False,
            tunnel={"ping_interval_s": 0.5, "ping_timeout_s": 2.0},
            pool_keys=pool_extra,
        )
    )
    return path


@contextlib.contextmanager
def edge_stack(
    test_pki: PkiFiles,
    tmp: Path,
    *,
    workers: int = 1,
    listener_extra: str = "",
    extra: str = "",
    tls_extra: str = "",
    extra_top: str = "",
    tls_table: str = "",
    certificate: CertPaths | None = None,
    backend_port: int | None = None,
    origin_pool_extra: str = "",
    nodes: int = 1,
    edge_env: dict[str, str] | None = None,
    edge_keys: str = "",
) -> Iterator[Stack]:
    """``nodes`` Node backends (or ``backend_port``), the real origin balancer and an edge."""
    procs = Processes()
    node_ports = [free_port() for _ in range(nodes)]
    node_port, origin_port = node_ports[0], free_port()
    https_port, admin_port, origin_admin_port = free_port(), free_port(), free_port()
    if backend_port is None:
        for port in node_ports:
            procs.node(port)
    else:
        node_port = backend_port
        node_ports = [backend_port]
    origin_config = write_origin_config(
        tmp / "origin.toml",
        test_pki,
        port=origin_port,
        backends=node_ports,
        health=backend_port is None,
        admin_port=origin_admin_port,
        pool_extra=origin_pool_extra,
    )
    origin_cmd = [sys.executable, "-m", "origin", "--config", str(origin_config)]
    config = write_edge_config(
        tmp / "edge.toml",
        test_pki,
        https_port=https_port,
        admin_port=admin_port,
        origins=[("origin-a", origin_port)],
        workers=workers,
        listener_extra=listener_extra,
        extra=extra,
        tls_extra=tls_extra,
        extra_top=extra_top,
        tls_table=tls_table,
        certificate=certificate,
        edge_keys=edge_keys,
    )
    log = tmp / "edge.log"
    edge = start_edge(procs, config, log, edge_env)
    s = Stack(
        test_pki, https_port, admin_port, node_port, origin_port, edge, log, origin_cmd, procs
    )
    s.origin_admin_port = origin_admin_port
    try:
        s.start_origin()
        try:
            wait_port(https_port)
        except TimeoutError as exc:  # say why: did the edge exit, and what did it log
            status = "running" if edge.poll() is None else f"exited with {edge.returncode}"
            raise TimeoutError(f"{exc} (the edge is {status}):\n{devstack.tail(log)}") from None
        wait_healthy(s)
        yield s
    finally:
        procs.stop_all()


def wait_healthy(s: Stack, timeout: float = 30) -> None:
    try:
        devstack.wait_healthy(s.admin_port, time.monotonic() + scaled(timeout), "edge", s.log)
    except devstack.StackError as exc:
        raise TimeoutError(str(exc)) from None
