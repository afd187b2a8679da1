"""Two edges and one origin against Pebble: the origin runs ACME, the edges
answer the challenges it sends them over the tunnels and serve what it issues.

Edge A listens on 127.0.0.2, edge B on 127.0.0.3, each with a TLS and a
plain-HTTP listener on the same two ports, which are Pebble's TLS-ALPN-01 and
HTTP-01 ports; pebble-challtestsrv tells Pebble where each name is. The
HTTP-01 name is pointed at edge B and the TLS-ALPN-01 name at edge A: the
origin sends every challenge to every edge, so whichever edge the CA reaches
answers. The wildcard goes through DNS-01 (challtestsrv as the provider)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import stat
import sys
import time
from pathlib import Path
from typing import Any

from cryptography import x509

from tests.acme_env import free_port_on, pebble
from tests.conftest import PkiFiles, scaled
from tests.edge_env import ROOT, Processes, start_edge, wait_port
from tests.tunnel_env import free_port

EDGES = {"a": ("127.0.0.2", "edge"), "b": ("127.0.0.3", "edge2")}


def edge_toml(test_pki: PkiFiles, name: str, https: int, http: int, admin: int, origin: int,
              store: Path) -> str:  # fmt: skip
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


def origin_toml(test_pki: PkiFiles, port: int, admin: int, backend: int, ca: Any,
                state: Path) -> str:  # fmt: skip
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
[[acme.certificates]]
id = "web"
domains = ["web.geoedge.test"]
challenge_types = ["http-01"]
[[acme.certificates]]
id = "alpn"
domains = ["alpn.geoedge.test"]
challenge_types = ["tls-alpn-01"]
[[acme.certificates]]
id = "wild"
domains = ["*.wild.geoedge.test"]
[acme.dns]
provider = "challtestsrv"
challtestsrv_url = "http://127.0.0.1:{ca.challtestsrv_port}"
"""


def admin(port: int, method: str, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(60))
    conn.request(method, path)
    response = conn.getresponse()
    return response.status, json.loads(response.read() or b"null")


def served_serial(address: str, port: int, name: str, root: str) -> int:
    context = ssl.create_default_context(cadata=root)
    with (
        socket.create_connection((address, port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def wait_until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not in time"
        time.sleep(0.2)


def test_two_edges_answer_every_challenge_and_serve_the_issued_chains(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    https = free_port_on("127.0.0.2", "127.0.0.3")
    http_port = free_port_on("127.0.0.2", "127.0.0.3")
    procs = Processes()
    with pebble(test_pki, tmp_path, http_port=http_port, tls_port=https) as ca:
        ca.point("web.geoedge.test", "127.0.0.3")  # HTTP-01 lands on edge B
        ca.point("alpn.geoedge.test", "127.0.0.2")  # TLS-ALPN-01 on edge A
        origin_port, origin_admin, backend = free_port(), free_port(), free_port()
        config = tmp_path / "origin.toml"
        state = tmp_path / "origin-acme"
        config.write_text(origin_toml(test_pki, origin_port, origin_admin, backend, ca, state))
        try:
            stores = {}
            for name in EDGES:
                stores[name] = tmp_path / f"edge-{name}-acme"
                edge_config = tmp_path / f"edge-{name}.toml"
                edge_config.write_text(
                    edge_toml(
                        test_pki, name, https, http_port, free_port(), origin_port, stores[name]
                    )
                )
                start_edge(procs, edge_config, tmp_path / f"edge-{name}.log")
            log = open(tmp_path / "origin.log", "wb")  # noqa: SIM115
            procs.start(
                [sys.executable, "-m", "origin", "--config", str(config)],
                cwd=ROOT, stdout=log, stderr=log,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
            wait_port(origin_admin, scaled(15))

            def all_on_both_edges() -> bool:
                _, status = admin(origin_admin, "GET", "/acme")
                certificates = status["certificates"]
                return all(
                    c["not_after"] and c["edges"] == {"edge-1": "applied", "edge-2": "applied"}
                    for c in certificates
                )

            wait_until(all_on_both_edges, 120, "every certificate on both edges")
            root = ca.root_pem()
            for address, _ in EDGES.values():
                for name in ("web.geoedge.test", "alpn.geoedge.test", "x.wild.geoedge.test"):
                    served_serial(address, https, name, root)  # verifies up to Pebble's root

            # No private key readable by others, on the origin or on the edges.
            for directory in (state, *stores.values()):
                assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
                for path in directory.rglob("*"):
                    if path.is_file():
                        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        finally:
            procs.stop_all()
