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
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from geoedge import assets, devstack


def write_pki(directory: Path) -> devstack.DevPki:
    return devstack.make_dev_pki(
        directory,
        edge_id="demo-edge",
        origin_id="demo-origin",
        ca_name="geoedge demo CA (throwaway)",
        server_basename="edge-server",
    )


def origin_toml(
    keys: devstack.DevPki, tunnel_port: int, admin_port: int, backends: list[int]
) -> str:
    return devstack.origin_toml(
        keys,
        comment=f"Written by `geoedge demo`: origin balancer, {len(backends)} Node.js backends.",
        origin_id=keys.origin_id,
        tunnel_port=tunnel_port,
        admin_port=admin_port,
        allowed_identities=[keys.edge_id],
        listener_keys='transport = "tls"\n',
        backends=backends,
        pool_keys='algorithm = "least_connections"\n',
        health=devstack.HealthCheck("/health", interval_s=1.0, timeout_s=0.5),
    )


def edge_toml(keys: devstack.DevPki, d: Path, port: int, admin_port: int, tunnel_port: int) -> str:
    return devstack.edge_toml(
        keys,
        comment=f"Written by `geoedge demo`: one edge terminating TLS on 127.0.0.1:{port}.",
        edge_id=keys.edge_id,
        https_port=port,
        admin_port=admin_port,
        access_log=d / "access.log",
        origins=[(keys.origin_id, tunnel_port)],
        origin_tunnel={"connections": 2},
    )


class Demo:
    """The demo's processes (Node.js backends, origin, edge) and its directory's files."""

    def __init__(self, directory: Path, port: int, backends: int, node_app: Path) -> None:
        self.dir = directory
        self.port = port
        self.backend_count = backends
        self.node_app = node_app
        self.processes = devstack.ProcessGroup(kill_group=True)

    def _start(self, name: str, argv: list[str], cwd: Path | None = None) -> None:
        self.processes.spawn(
            name, argv, log=self.dir / f"{name}.log", cwd=cwd or self.dir, append=True
        )

    def run(self) -> str:
        keys = write_pki(self.dir)
        backends = [devstack.free_port() for _ in range(self.backend_count)]
        tunnel_port = devstack.free_port()
        origin_admin, edge_admin = devstack.free_port(), devstack.free_port()
        (self.dir / "origin.toml").write_text(
            origin_toml(keys, tunnel_port, origin_admin, backends)
        )
        (self.dir / "edge.toml").write_text(
            edge_toml(keys, self.dir, self.port, edge_admin, tunnel_port)
        )
        for port in backends:
            self._start(f"node-{port}", ["node", "server.js", str(port)], cwd=self.node_app)
        python = sys.executable
        self._start("origin", [python, "-m", "origin", "--config", str(self.dir / "origin.toml")])
        self._start("edge", [python, "-m", "edge", "--config", str(self.dir / "edge.toml")])
        devstack.wait_healthy(
            edge_admin,
            time.monotonic() + 30,
            "the edge",
            self.dir / "edge.log",
            self.processes.procs.values(),
        )
        print(f"logs and configs: {self.dir}", file=sys.stderr)
        print(
            f"edge admin: http://127.0.0.1:{edge_admin}/metrics  origin admin: "
            f"http://127.0.0.1:{origin_admin}/metrics",
            file=sys.stderr,
        )
        return f"geoedge demo ready: edge=https://127.0.0.1:{self.port} ca={keys.ca}"

    def stop(self) -> None:
        self.processes.stop(grace_s=10.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="geoedge demo", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8443, help="edge HTTPS port (8443)")
    parser.add_argument("--backends", type=int, default=4, help="Node.js backends (4)")
    parser.add_argument("--keep", action="store_true", help="keep the demo directory at exit")
    args = parser.parse_args(argv)
    if not devstack.port_free(args.port):
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
        while not demo.processes.exited():
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
