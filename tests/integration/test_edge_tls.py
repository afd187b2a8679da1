"""The edge's TLS side through real processes: SNI, SIGHUP certificate swap with
a WebSocket open, PROXY-protocol listeners, the plain-HTTP redirect listener."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
from pathlib import Path

import pytest
import uvloop
import websockets
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

from geoedge import pki
from geoedge.proxy import encode_v1, encode_v2
from tests.conftest import PkiFiles
from tests.edge_env import Stack, edge_stack, node_available
from tests.polling import wait_until, wait_until_async

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")


def served_certificate(port: int, ca: Path, server_name: str) -> x509.Certificate:
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def sans(cert: x509.Certificate) -> list[str]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return ext.get_values_for_type(x509.DNSName)


def test_sni_picks_exact_wildcard_and_default(test_pki: PkiFiles, tmp_path: Path) -> None:
    ca = pki.load_ca(test_pki.dir / "ca")
    other = pki.issue_server_cert(ca, tmp_path, "other", ["*.example.test", "api.other.test"])
    rsa = pki.issue_server_cert(ca, tmp_path, "rsa", ["rsa.test"], key_type="rsa")
    tls_extra = f"""
[[tls.certificates]]
cert = "{other.cert}"
key = "{other.key}"
[[tls.certificates]]
cert = "{rsa.cert}"
key = "{rsa.key}"
"""
    with edge_stack(test_pki, tmp_path, tls_extra=tls_extra) as stack:
        assert "*.example.test" in sans(
            served_certificate(stack.https_port, test_pki.ca, "a.example.test")
        )
        assert "api.other.test" in sans(
            served_certificate(stack.https_port, test_pki.ca, "api.other.test")
        )
        rsa_cert = served_certificate(stack.https_port, test_pki.ca, "rsa.test")
        assert isinstance(rsa_cert.public_key(), RSAPublicKey)
        assert "localhost" in sans(served_certificate(stack.https_port, test_pki.ca, "localhost"))
        status, body = stack.get("/ip")
        assert status == 200 and json.loads(body)["backend"] == stack.node_port


def test_sighup_swaps_certificate_while_websocket_stays_open(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    ca = pki.load_ca(test_pki.dir / "ca")
    live = pki.issue_server_cert(ca, tmp_path, "live", ["swap.test"])
    tls_extra = f"""
[[tls.certificates]]
cert = "{live.cert}"
key = "{live.key}"
"""
    with edge_stack(test_pki, tmp_path, tls_extra=tls_extra) as stack:
        before = served_certificate(stack.https_port, test_pki.ca, "swap.test").serial_number

        async def main() -> None:
            context = stack.tls_context()
            url = f"wss://localhost:{stack.https_port}/ws"
            async with websockets.connect(url, ssl=context) as ws:
                await ws.send("before")
                assert await ws.recv() == "before"
                fresh = pki.issue_server_cert(ca, tmp_path / "new", "live", ["swap.test"])
                os.replace(fresh.cert, live.cert)
                os.replace(fresh.key, live.key)
                stack.edge.send_signal(signal.SIGHUP)
                await wait_until_async(
                    lambda: (
                        served_certificate(stack.https_port, test_pki.ca, "swap.test").serial_number
                        != before
                    ),
                    "SIGHUP did not swap the certificate",
                )
                await ws.send("after")
                assert await ws.recv() == "after"  # the old connection is untouched

        (tmp_path / "new").mkdir()
        uvloop.run(main())


PROXY_LISTENER = """
proxy_protocol = "v2"
trusted_proxies = ["127.0.0.1/32"]
"""


def _tls_get_ip(stack: Stack, sock: socket.socket) -> dict[str, object]:
    tls = stack.tls_context().wrap_socket(sock, server_hostname="localhost")
    tls.sendall(b"GET /ip HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := tls.recv(65536):
        data += chunk
    tls.close()
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


def test_proxy_protocol_listener_trusts_only_configured_peers(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with edge_stack(test_pki, tmp_path, listener_extra=PROXY_LISTENER) as stack:
        # A trusted load balancer: the client address comes from the header.
        sock = socket.create_connection(("127.0.0.1", stack.https_port), timeout=5)
        sock.sendall(encode_v2(("203.0.113.7", 5555), ("127.0.0.1", stack.https_port)))
        info = _tls_get_ip(stack, sock)
        assert info["x_forwarded_for"] == "203.0.113.7"

        # The trusted peer without a header: refused.
        sock = socket.create_connection(("127.0.0.1", stack.https_port), timeout=5)
        with pytest.raises((ssl.SSLError, OSError)):
            _tls_get_ip(stack, sock)

        # A header of the other version: refused, the reason names both.
        sock = socket.create_connection(("127.0.0.1", stack.https_port), timeout=5)
        sock.sendall(encode_v1(("203.0.113.8", 5555), ("127.0.0.1", stack.https_port)))
        with pytest.raises((ssl.SSLError, OSError)):
            _tls_get_ip(stack, sock)
        refusal = 'a PROXY v1 header on a listener with proxy_protocol = "v2"'
        wait_until(lambda: refusal in stack.log.read_text(), "the refusal was not logged")

        # An untrusted peer (127.0.0.2) with a header: refused (spoofing attempt).
        sock = socket.create_connection(
            ("127.0.0.1", stack.https_port), timeout=5, source_address=("127.0.0.2", 0)
        )
        sock.sendall(encode_v2(("198.51.100.1", 1), ("127.0.0.1", stack.https_port)))
        try:
            assert sock.recv(100) == b""  # closed (FIN) ...
        except ConnectionResetError:
            pass  # ... or reset, as the edge closed with our header unread
        sock.close()

        # An untrusted peer without a header is an ordinary client.
        sock = socket.create_connection(
            ("127.0.0.1", stack.https_port), timeout=5, source_address=("127.0.0.2", 0)
        )
        assert _tls_get_ip(stack, sock)["x_forwarded_for"] == "127.0.0.2"
        assert "refused connection from 127.0.0.2" in stack.log.read_text()


def test_redirect_listener_redirects_but_passes_acme_through(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    from tests.tunnel_env import free_port

    port = free_port()
    extra_top = f'[redirect]\naddress = "127.0.0.1:{port}"\nhttps_port = 8443\n'
    with edge_stack(test_pki, tmp_path, extra_top=extra_top) as stack:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /a?b=1 HTTP/1.1\r\nHost: shop.example\r\n\r\n")
            reply = sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 301")
        assert b"Location: https://shop.example:8443/a?b=1\r\n" in reply
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(
                b"GET /.well-known/acme-challenge/tok HTTP/1.1\r\nHost: s\r\n"
                b"Connection: close\r\n\r\n"
            )
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 404")  # answered by the Node backend
        assert stack is not None


def test_ecdsa_and_rsa_for_the_same_names_serve_both_kinds_of_client(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    ca = pki.load_ca(test_pki.dir / "ca")
    ecdsa = pki.issue_server_cert(ca, tmp_path, "dual-ec", ["dual.test"])
    rsa = pki.issue_server_cert(ca, tmp_path, "dual-rsa", ["dual.test"], key_type="rsa")
    tls_extra = f"""
[[tls.certificates]]
cert = "{ecdsa.cert}"
key = "{ecdsa.key}"
[[tls.certificates]]
cert = "{rsa.cert}"
key = "{rsa.key}"
"""
    with edge_stack(test_pki, tmp_path, tls_extra=tls_extra) as stack:
        for cipher, key_kind in (
            ("ECDHE-ECDSA-AES128-GCM-SHA256", EllipticCurvePublicKey),
            ("ECDHE-RSA-AES128-GCM-SHA256", RSAPublicKey),
        ):
            context = ssl.create_default_context(cafile=str(test_pki.ca))
            context.maximum_version = ssl.TLSVersion.TLSv1_2
            context.set_ciphers(cipher)
            with (
                socket.create_connection(("127.0.0.1", stack.https_port), timeout=5) as raw,
                context.wrap_socket(raw, server_hostname="dual.test") as tls,
            ):
                cert = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))
            assert isinstance(cert.public_key(), key_kind)
