"""One origin running ACME against Pebble and up to two real edges, as
processes, for the fleet-wide ACME tests.

Edge ``a`` listens on 127.0.0.2, edge ``b`` on 127.0.0.3, each with a TLS and
a plain-HTTP listener on the same two ports, which are Pebble's TLS-ALPN-01
and HTTP-01 ports; :meth:`tests.acme_env.Pebble.point` says where the CA
finds each name. The origin's one pool is a real Node.js backend when the
test asks for one (traffic through the edges), else a closed port.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cryptography import x509

from tests.acme_env import Pebble, free_port_on, pebble
from tests.conftest import PkiFiles, scaled
from tests.edge_env import ROOT, Processes, start_edge, wait_port
from tests.tunnel_env import free_port

T = TypeVar("T")

#: Each edge's address and the test PKI's files it uses for its tunnel.
EDGES = {"a": ("127.0.0.2", "edge"), "b": ("127.0.0.3", "edge2")}
#: The identities (tunnel certificates) of edges a and b.
EDGE_IDS = {"a": "edge-1", "b": "edge-2"}

#: The name of the one certificate most tests keep issued, proven by HTTP-01.
WEB = "web.geoedge.test"
WEB_CERTIFICATE = """
[[acme.certificates]]
id = "web"
domains = ["web.geoedge.test"]
challenge_types = ["http-01"]
"""

#: An edge's log line for a tunnel connection that came up (tunnel.aio.pool).
TUNNEL_UP = re.compile(r"^(\S+) INFO +geoedge\.tunnel: tunnel \S+ slot \d+: up to ")


def edge_toml(
    test_pki: PkiFiles, name: str, https: int, http: int, admin: int, origin: int, store: Path
) -> str:
    address, keys = EDGES[name]
    paths = getattr(test_pki, keys)
    return f"""
[edge]
id = "edge-{name}"
workers = 2
drain_timeout_s = 2.0
[[listeners]]
address = "{address}:{https}"
[redirect]
address = "{address}:{http}"
[tls]
[acme]
enabled = true
store_dir = "{store}"
[admin]
address = "127.0.0.1:{admin}"
[tunnel]
ping_interval_s = 0.5
ping_timeout_s = 2.0
[[origins]]
name = "origin"
[origins.tunnel]
address = "127.0.0.1:{origin}"
server_name = "localhost"
cert = "{paths.cert}"
key = "{paths.key}"
ca = "{test_pki.ca}"
connections = 2
backoff_base_s = 0.05
backoff_cap_s = 0.5
"""


def origin_toml(
    test_pki: PkiFiles, port: int, admin: int, backend: int, ca: Pebble, state: Path, certs: str
) -> str:
    return f"""
[origin]
id = "origin-1"
workers = 2
log_json = false
[tunnel_listener]
address = "127.0.0.1:{port}"
cert = "{test_pki.origin.cert}"
key = "{test_pki.origin.key}"
ca = "{test_pki.ca}"
allowed_identities = ["edge-1", "edge-2"]
[admin]
address = "127.0.0.1:{admin}"
[[pools]]
name = "app"
default = true
[[pools.backends]]
address = "127.0.0.1:{backend}"
[acme]
directory_url = "{ca.directory_url}"
ca_bundle = "{ca.ca}"
agree_to_terms = true
state_dir = "{state}"
challenge_types = ["http-01", "tls-alpn-01"]
retry_base_s = 0.5
retry_cap_s = 1.0
edge_ack_timeout_s = 5.0
{certs}
[acme.dns]
provider = "challtestsrv"
challtestsrv_url = "http://127.0.0.1:{ca.challtestsrv_port}"
"""


def wait_until(check: Callable[[], T], timeout_s: float, what: str) -> T:
    """``check()``'s first truthy result, polled until ``timeout_s`` (scaled)."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not in time"
        time.sleep(0.1)


@dataclass
class AcmeFleet:
    test_pki: PkiFiles
    tmp: Path
    ca: Pebble
    procs: Processes
    https: int
    http: int
    origin_port: int = field(default_factory=free_port)
    origin_admin: int = field(default_factory=free_port)
    backend: int = field(default_factory=free_port)
    stores: dict[str, Path] = field(default_factory=dict)
    edge_admins: dict[str, int] = field(default_factory=dict)

    @property
    def state(self) -> Path:
        """The origin's ACME state directory."""
        return self.tmp / "origin-acme"

    def edge_log(self, name: str) -> Path:
        return self.tmp / f"edge-{name}.log"

    def start_origin(self, certificates: str) -> None:
        """The origin with these ``[[acme.certificates]]`` (TOML)."""
        config = self.tmp / "origin.toml"
        config.write_text(
            origin_toml(
                self.test_pki,
                self.origin_port,
                self.origin_admin,
                self.backend,
                self.ca,
                self.state,
                certificates,
            )
        )
        log = open(self.tmp / "origin.log", "wb")  # noqa: SIM115 - the process' until it exits
        self.procs.start(
            [sys.executable, "-m", "origin", "--config", str(config)],
            cwd=ROOT, stdout=log, stderr=log,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        log.close()
        wait_port(self.origin_admin, scaled(15))

    def start_edge(self, name: str) -> None:
        self.stores[name] = self.tmp / f"edge-{name}-acme"
        self.edge_admins[name] = free_port()
        config = self.tmp / f"edge-{name}.toml"
        config.write_text(
            edge_toml(
                self.test_pki,
                name,
                self.https,
                self.http,
                self.edge_admins[name],
                self.origin_port,
                self.stores[name],
            )
        )
        start_edge(self.procs, config, self.edge_log(name))

    def address(self, name: str) -> str:
        return EDGES[name][0]

    def admin(self, method: str, path: str) -> tuple[int, Any]:
        """A request to the origin's admin API: its status and JSON body."""
        conn = http.client.HTTPConnection("127.0.0.1", self.origin_admin, timeout=scaled(60))
        try:
            conn.request(method, path)
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            conn.close()

    def geoedge_acme(self, *args: str, timeout_s: float = 120) -> tuple[int, str]:
        """``geoedge acme ARGS --admin <the origin's>``: its exit status and output."""
        done = subprocess.run(
            [sys.executable, "-m", "geoedge.cli", "acme", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=scaled(timeout_s),
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        return done.returncode, done.stdout + done.stderr

    @property
    def admin_address(self) -> str:
        return f"127.0.0.1:{self.origin_admin}"

    def certificate(self, certificate_id: str) -> dict[str, Any]:
        """The origin's ``GET /acme`` entry of one certificate."""
        _, status = self.admin("GET", "/acme")
        return next(c for c in status["certificates"] if c["id"] == certificate_id)

    def wait_applied(self, certificate_id: str, edges: tuple[str, ...], timeout_s: float) -> int:
        """Until the certificate is issued and every one of ``edges`` applied it; its serial."""
        wanted = {EDGE_IDS[name]: "applied" for name in edges}

        def applied() -> int | None:
            entry = self.certificate(certificate_id)
            if entry["serial"] and entry["edges"] == wanted:
                return int(entry["serial"], 16)
            return None

        return wait_until(applied, timeout_s, f"{certificate_id} applied by {edges}")

    def tunnel_up_times(self, name: str) -> list[float]:
        """When each of the edge's tunnel connections came up, from its log (Unix time)."""
        times = []
        for line in self.edge_log(name).read_text(errors="replace").splitlines():
            match = TUNNEL_UP.match(line)
            if match:
                stamp = match.group(1).replace("Z", "+00:00")
                times.append(_parse_rfc3339(stamp))
        return times


def _parse_rfc3339(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


@contextlib.contextmanager
def acme_fleet(
    test_pki: PkiFiles, tmp: Path, *, node: bool = False, ocsp_url: str = ""
) -> Iterator[AcmeFleet]:
    """Pebble, and the fleet's ports; the test starts the origin and the edges.
    Every process is stopped (by PID) at the end."""
    https = free_port_on("127.0.0.2", "127.0.0.3")
    http_port = free_port_on("127.0.0.2", "127.0.0.3")
    procs = Processes()
    with pebble(test_pki, tmp, http_port=http_port, tls_port=https, ocsp_url=ocsp_url) as ca:
        fleet = AcmeFleet(test_pki, tmp, ca, procs, https, http_port)
        try:
            if node:
                procs.node(fleet.backend)
            yield fleet
        finally:
            procs.stop_all()


def handshake_serial(address: str, port: int, name: str, root: str, timeout_s: float = 5.0) -> int:
    """The serial of the certificate the edge presents for ``name``, once its
    chain verifies up to ``root`` (Pebble's): raises otherwise."""
    context = ssl.create_default_context(cadata=root)
    with (
        socket.create_connection((address, port), timeout=timeout_s) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number
