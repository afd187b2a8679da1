"""Pebble (Let's Encrypt's test CA) and pebble-challtestsrv (the DNS server it
resolves with) as real processes for the ACME tests, on free ports, with a
config file per test. ``make tools`` builds both into ``.tools/``; where they
are missing the tests fail under CI (``CI=true``) and skip elsewhere.

Pebble serves its ACME directory over HTTPS with a certificate of the tests'
own CA (so the origin's ``[acme] ca_bundle`` is that CA), validates HTTP-01
on ``http_port`` and TLS-ALPN-01 on ``tls_port`` of whatever address
challtestsrv gives a name (:meth:`Pebble.point`), and hands out its root on
its management port (:meth:`Pebble.root_pem`), which is what a client that
checks an issued chain trusts.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509 import ocsp

from tests.conftest import PkiFiles, scaled
from tests.edge_env import Processes, wait_port
from tests.tunnel_env import free_port

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools"


def tool(name: str) -> str:
    """The path of a Pebble tool; fails under CI, skips elsewhere, when missing."""
    found = shutil.which(name) or str(TOOLS / name)
    if not Path(found).exists():
        message = f"{name} is not installed (make tools builds it with go install)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def free_port_on(*hosts: str) -> int:
    """A port free on every one of ``hosts`` (loopback addresses)."""
    for _ in range(50):
        port = free_port()
        try:
            for host in hosts:
                with socket.socket() as probe:
                    probe.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {hosts}")


@dataclass
class Pebble:
    directory_url: str
    management_port: int
    challtestsrv_port: int
    dns_port: int
    http_port: int
    tls_port: int
    ca: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def _tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def root_pem(self) -> str:
        """Pebble's root: what a client checking an issued chain trusts."""
        url = f"https://127.0.0.1:{self.management_port}/roots/0"
        with urllib.request.urlopen(url, context=self._tls(), timeout=10) as response:
            return str(response.read().decode())

    def _challtestsrv(self, path: str, body: dict[str, object]) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.challtestsrv_port}{path}",
            data=json.dumps(body).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def point(self, name: str, address: str) -> None:
        """Make Pebble resolve ``name`` to ``address`` (A record; nothing else answers)."""
        self._challtestsrv("/clear-a", {"host": name + "."})
        self._challtestsrv("/add-a", {"host": name + ".", "addresses": [address]})

    def set_ari(self, chain_pem: str, window_start: float, window_end: float) -> None:
        """Make the CA's renewal information (ARI) for a certificate say this window."""

        def iso(t: float) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

        window = {"suggestedWindow": {"start": iso(window_start), "end": iso(window_end)}}
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.management_port}/set-renewal-info/",
            data=json.dumps({"Certificate": chain_pem, "ARIResponse": json.dumps(window)}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, context=self._tls(), timeout=10) as response:
            assert response.status == 200


@contextlib.contextmanager
def pebble(
    test_pki: PkiFiles, tmp: Path, *, http_port: int = 0, tls_port: int = 0, ocsp_url: str = ""
) -> Iterator[Pebble]:
    """Pebble and challtestsrv, each on free ports, stopped by PID at the end.
    ``ocsp_url``: the OCSP responder Pebble names in the certificates it issues
    (it runs none itself: :class:`OcspResponder`)."""
    pebble_bin, challtestsrv_bin = tool("pebble"), tool("pebble-challtestsrv")
    procs = Processes()
    acme_port, management_port = free_port(), free_port()
    challtestsrv_port, dns_port = free_port(), free_port()
    config = {
        "pebble": {
            "listenAddress": f"127.0.0.1:{acme_port}",
            "managementListenAddress": f"127.0.0.1:{management_port}",
            "certificate": str(test_pki.server.cert),
            "privateKey": str(test_pki.server.key),
            "httpPort": http_port or free_port(),
            "tlsPort": tls_port or free_port(),
            "ocspResponderURL": ocsp_url,
            "externalAccountBindingRequired": False,
            "retryAfter": {"authz": 1, "order": 1},
            # Pebble hands out its intermediate's key (for OcspResponder) for RSA only.
            "keyAlgorithm": "rsa" if ocsp_url else "ecdsa",
            "profiles": {"default": {"description": "90 days", "validityPeriod": 7776000}},
        }
    }
    config_path = tmp / "pebble.json"
    config_path.write_text(json.dumps(config))
    log = tmp / "pebble.log"
    out = open(log, "wb")  # noqa: SIM115 - closed below, after the processes
    env = {
        **os.environ,
        "PEBBLE_VA_NOSLEEP": "1",  # validate at once
        "PEBBLE_WFE_NONCEREJECT": "0",  # no random badNonce
        "PEBBLE_AUTHZREUSE": "0",  # every order proves its names again
    }
    challtestsrv_argv = [challtestsrv_bin, "-management", f"127.0.0.1:{challtestsrv_port}"]
    challtestsrv_argv += ["-dnsserver", f"127.0.0.1:{dns_port}", "-doh", ""]
    # Only its DNS server and management API: the edges answer the challenges,
    # and names it was not told about resolve to nothing.
    for flag in ("-http01", "-https01", "-tlsalpn01", "-defaultIPv4", "-defaultIPv6"):
        challtestsrv_argv += [flag, ""]
    procs.start(challtestsrv_argv, stdout=out, stderr=subprocess.STDOUT)
    proc = procs.start(
        [pebble_bin, "-config", str(config_path), "-dnsserver", f"127.0.0.1:{dns_port}"],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_port(challtestsrv_port, scaled(10))
        wait_port(acme_port, scaled(10))
        wait_port(management_port, scaled(10))
        yield Pebble(
            f"https://127.0.0.1:{acme_port}/dir",
            management_port,
            challtestsrv_port,
            dns_port,
            config["pebble"]["httpPort"],  # type: ignore[index]
            config["pebble"]["tlsPort"],  # type: ignore[index]
            test_pki.ca,
            proc,
            log,
        )
    finally:
        procs.stop_all()
        out.close()


class Outage:
    """A TCP relay in front of Pebble's ACME port that can refuse connections:
    the CA "down" while Pebble keeps its accounts and orders."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._down = False
        self.refused = 0
        self._open: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        """Down: new connections are reset, and so are those open (kept-alive ones too)."""
        self._down = value
        if value:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.down:
                self.refused += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                client.close()  # a reset: what a dead host's closed port gives
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target), 5)
            except OSError:
                client.close()
                continue
            self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        self._open.discard(source)

    def close(self) -> None:
        self._closed = True
        self._listener.close()


class OcspResponder:
    """An OCSP responder for the certificates Pebble issues (Pebble names one
    in them when told to, but runs none): answers each POSTed request
    (RFC 6960) about the serial it names with ``status``, signed with Pebble's
    intermediate key (from its management API), valid for a day. Counts the
    requests it answered."""

    def __init__(self, ca: Pebble, port: int) -> None:
        tls = ca._tls()
        base = f"https://127.0.0.1:{ca.management_port}"
        with urllib.request.urlopen(f"{base}/intermediates/0", context=tls, timeout=10) as r:
            self._issuer = x509.load_pem_x509_certificate(r.read())
        with urllib.request.urlopen(f"{base}/intermediate-keys/0", context=tls, timeout=10) as r:
            key = serialization.load_pem_private_key(r.read(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
        self._key = key
        self.status = ocsp.OCSPCertStatus.GOOD
        self.answered = 0
        responder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                der = responder.answer(ocsp.load_der_ocsp_request(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/ocsp-response")
                self.send_header("Content-Length", str(len(der)))
                self.end_headers()
                self.wfile.write(der)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{port}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def answer(self, request: ocsp.OCSPRequest) -> bytes:
        now = datetime.datetime.now(datetime.UTC)
        revoked = self.status == ocsp.OCSPCertStatus.REVOKED
        builder = (
            ocsp.OCSPResponseBuilder()
            .add_response_by_hash(
                request.issuer_name_hash,
                request.issuer_key_hash,
                request.serial_number,
                request.hash_algorithm,
                self.status,
                now - datetime.timedelta(minutes=1),
                now + datetime.timedelta(days=1),
                now - datetime.timedelta(minutes=5) if revoked else None,
                x509.ReasonFlags.key_compromise if revoked else None,
            )
            .responder_id(ocsp.OCSPResponderEncoding.HASH, self._issuer)
        )
        self.answered += 1
        response = builder.sign(self._key, hashes.SHA256())
        return response.public_bytes(serialization.Encoding.DER)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
