"""``geoedge demo`` (``make demo``): the whole system on localhost.

A throwaway CA and certificates, four Node.js backends, one origin balancer and
one edge, each a real process started exactly as systemd would start it (the
daemons read TOML files written here). When the edge reports a usable tunnel
on its /healthz, one line goes to stdout::

    geoedge demo ready: edge=https://127.0.0.1:8443 ca=/tmp/geoedge-demo-.../ca/ca.pem

Logs go to files in the demo directory (their paths are printed on stderr).
Ctrl-C or SIGTERM stops every process the demo started (by PID: SIGTERM, then
SIGKILL after a grace period) and removes the directory.

It runs the same from a checkout and from an installed wheel: the sample app
comes from the shipped files, its ``ws`` dependency from ``npm ci`` into a
cache directory on first use (:func:`geoedge.assets.prepare_node_app`),
and the daemons are started with this interpreter (``python -m edge``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from geoedge import assets, pki


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_http(url: str, deadline: float, procs: list[subprocess.Popen[bytes]]) -> None:
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with status {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as response:
            if response.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {url}")


def write_pki(directory: Path) -> Path:
    pki.create_ca(directory / "ca", name="geoedge demo CA (throwaway)")
    ca = pki.load_ca(directory / "ca")
    pki.issue_server_cert(ca, directory, "edge-server", ["localhost", "127.0.0.1"])
    pki.issue_peer_cert(
        ca, directory, "origin", "demo-origin", role="origin", dns_names=["localhost"]
    )
    pki.issue_peer_cert(ca, directory, "edge", "demo-edge", role="edge")
    return ca.paths.cert


def origin_toml(d: Path, tunnel_port: int, admin_port: int, backends: list[int]) -> str:
    backend_tables = "".join(
        f'\n[[pools.backends]]\naddress = "127.0.0.1:{port}"\n' for port in backends
    )
    return f"""# Written by `geoedge demo`: origin balancer, {len(backends)} Node.js backends.
[origin]
id = "demo-origin"
workers = 1
drain_timeout_s = 5.0

[tunnel_listener]
address = "127.0.0.1:{tunnel_port}"
transport = "tls"
cert = "{d / "origin.pem"}"
key = "{d / "origin-key.pem"}"
ca = "{d / "ca" / "ca.pem"}"
allowed_identities = ["demo-edge"]

[admin]
address = "127.0.0.1:{admin_port}"

[[pools]]
name = "app"
default = true
algorithm = "least_connections"

[pools.health]
path = "/health"
interval_s = 1.0
timeout_s = 0.5
{backend_tables}"""


def edge_toml(d: Path, port: int, admin_port: int, tunnel_port: int) -> str:
    return f"""# Written by `geoedge demo`: one edge terminating TLS on 127.0.0.1:{port}.
[edge]
id = "demo-edge"
workers = 1
drain_timeout_s = 5.0

[[listeners]]
address = "127.0.0.1:{port}"

[tls]
[[tls.certificates]]
cert = "{d / "edge-server.pem"}"
key = "{d / "edge-server-key.pem"}"

[http]
access_log = "{d / "access.log"}"

[admin]
address = "127.0.0.1:{admin_port}"

[[origins]]
name = "demo-origin"
[origins.tunnel]
address = "127.0.0.1:{tunnel_port}"
server_name = "localhost"
cert = "{d / "edge.pem"}"
key = "{d / "edge-key.pem"}"
ca = "{d / "ca" / "ca.pem"}"
connections = 2
"""


class Demo:
    def __init__(self, directory: Path, port: int, backends: int, node_app: Path) -> None:
        self.dir = directory
        self.port = port
        self.backend_count = backends
        self.node_app = node_app
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(
        self, name: str, argv: list[str], cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd or self.dir,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def run(self) -> str:
        ca = write_pki(self.dir)
        backends = [_free_port() for _ in range(self.backend_count)]
        tunnel_port, origin_admin, edge_admin = _free_port(), _free_port(), _free_port()
        (self.dir / "origin.toml").write_text(
            origin_toml(self.dir, tunnel_port, origin_admin, backends)
        )
        (self.dir / "edge.toml").write_text(edge_toml(self.dir, self.port, edge_admin, tunnel_port))
        for port in backends:
            self._start(f"node-{port}", ["node", "server.js", str(port)], cwd=self.node_app)
        python = sys.executable
        self._start("origin", [python, "-m", "origin", "--config", str(self.dir / "origin.toml")])
        self._start("edge", [python, "-m", "edge", "--config", str(self.dir / "edge.toml")])
        deadline = time.monotonic() + 30
        _wait_http(f"http://127.0.0.1:{edge_admin}/healthz", deadline, self.procs)
        print(f"logs and configs: {self.dir}", file=sys.stderr)
        print(
            f"edge admin: http://127.0.0.1:{edge_admin}/metrics  origin admin: "
            f"http://127.0.0.1:{origin_admin}/metrics",
            file=sys.stderr,
        )
        return f"geoedge demo ready: edge=https://127.0.0.1:{self.port} ca={ca}"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="geoedge demo", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8443, help="edge HTTPS port (8443)")
    parser.add_argument("--backends", type=int, default=4, help="Node.js backends (4)")
    parser.add_argument("--keep", action="store_true", help="keep the demo directory at exit")
    args = parser.parse_args(argv)
    if not _port_free(args.port):
        print(f"geoedge demo: port {args.port} is in use (try --port)", file=sys.stderr)
        return 1
    try:
        node_app = assets.prepare_node_app(log=lambda line: print(line, file=sys.stderr))
    except assets.AssetsError as exc:
        print(f"geoedge demo: {exc}", file=sys.stderr)
        return 1
    directory = Path(tempfile.mkdtemp(prefix="geoedge-demo-"))
    demo = Demo(directory, args.port, args.backends, node_app)

    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        # The first SIGTERM or SIGINT stops the demo; later ones (Ctrl-C twice,
        # pkill reaching a `timeout` wrapper too) must not interrupt the stop,
        # which would leave the backends behind.
        nonlocal stopping
        if not stopping:
            stopping = True
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print(demo.run(), flush=True)
        while all(proc.poll() is None for proc in demo.procs):
            time.sleep(0.5)
        print("geoedge demo: a process exited; stopping (see the logs)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, OSError) as exc:
        print(f"geoedge demo: {exc}; logs in {directory}", file=sys.stderr)
        args.keep = True
        return 1
    finally:
        stopping = True
        demo.stop()
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
