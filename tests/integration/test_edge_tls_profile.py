"""The edge's TLS profile through a real edge process: TLS 1.2 session-ID
resumption however the client closes, key-exchange groups, HSTS, OCSP
stapling and an ``sslyze --mozilla_config=intermediate`` scan."""

from __future__ import annotations

import datetime as dt
import http.client
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509 import ocsp

from geoedge import pki
from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack, edge_stack, node_available
from tests.polling import wait_until

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")


def _tls12_session_id_client(stack: Stack) -> ssl.SSLContext:
    """TLS 1.2 without tickets: resumption can only come from the server's
    session-ID cache."""
    context = stack.tls_context()
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_TICKET
    return context


def _one_request(tls: ssl.SSLSocket) -> None:
    tls.sendall(b"GET /ip HTTP/1.1\r\nHost: localhost\r\n\r\n")
    response = http.client.HTTPResponse(tls)  # type: ignore[arg-type]
    response.begin()
    assert response.status == 200
    response.read()


def _close(tls: ssl.SSLSocket, how: str) -> None:
    if how == "close_notify":
        tls.unwrap().close()  # close_notify both ways, then FIN
    elif how == "fin":
        tls.shutdown(socket.SHUT_RDWR)  # a FIN, no close_notify (what most browsers do)
        tls.close()
    else:  # "rst": SO_LINGER 0 turns the close into a reset
        tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        tls.close()


#: One connection per client address: the edge admits the next handshake only
#: once it has closed the previous connection, whose end (a reset, a FIN) could
#: have evicted the session. A refused attempt is closed before any TLS.
ONE_AT_A_TIME = """
[admission]
max_connections_per_client_ip = 1
"""


def _handshake_once_admitted(
    stack: Stack, context: ssl.SSLContext, session: ssl.SSLSession | None
) -> ssl.SSLSocket:
    def attempt() -> ssl.SSLSocket | None:
        raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=scaled(10))
        try:
            return context.wrap_socket(raw, server_hostname="localhost", session=session)
        except (ssl.SSLError, OSError):
            raw.close()
            return None  # refused: the previous connection is still open at the edge

    return wait_until(attempt, "the edge did not close the previous connection", interval_s=0.01)


@pytest.mark.parametrize("how", ["close_notify", "fin", "rst"])
def test_tls12_session_id_resumes_however_the_client_closes(
    test_pki: PkiFiles, tmp_path: Path, how: str
) -> None:
    with edge_stack(test_pki, tmp_path, extra_top=ONE_AT_A_TIME) as stack:
        context = _tls12_session_id_client(stack)
        session = None
        resumed = 0
        for _ in range(11):
            tls = _handshake_once_admitted(stack, context, session)
            assert tls.version() == "TLSv1.2"
            _one_request(tls)
            if session is None:
                session = tls.session
            else:
                resumed += tls.session_reused
            _close(tls, how)
        assert resumed == 10, f"{resumed}/10 resumed after a {how} close"


# -- key-exchange groups ------------------------------------------------------------


def _handshake(port: int, ca: Path, curve: str | None = None, tls13: bool = True) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    if tls13:
        context.minimum_version = ssl.TLSVersion.TLSv1_3
    if curve is not None:
        context.set_ecdh_curve(curve)  # this client offers that one group only
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="localhost"),
        ):
            return True
    except ssl.SSLError:
        return False


def _s_client_groups(port: int, groups: str) -> bool:
    """Whether ``openssl s_client`` offering only ``groups`` completes a TLS 1.3
    handshake (Python cannot offer X448 alone)."""
    command = ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername"]
    command += ["localhost", "-tls1_3", "-groups", groups, "-brief"]
    result = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=10,
    )
    return "Protocol version: TLSv1.3" in result.stderr + result.stdout


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")


@needs_openssl
class _TicketCounter:
    """A TLS 1.3 client context that counts the NewSessionTicket messages it reads."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.tickets = 0
        self.context = stack.tls_context()
        self.context.minimum_version = ssl.TLSVersion.TLSv1_3
        self.context._msg_callback = self._on_message  # type: ignore[attr-defined]

    def _on_message(
        self,
        conn: object,
        direction: str,
        version: object,
        content: object,
        kind: object,
        data: bytes,
    ) -> None:
        if direction == "read" and kind == ssl._TLSMessageType.NEWSESSION_TICKET:  # type: ignore[attr-defined]
            self.tickets += 1

    def connect(self, session: ssl.SSLSession | None = None) -> tuple[ssl.SSLSession | None, bool]:
        """One connection carrying one request: (its session, whether it resumed ``session``)."""
        with (
            socket.create_connection(("127.0.0.1", self.stack.https_port), timeout=5) as raw,
            self.context.wrap_socket(raw, server_hostname="localhost", session=session) as tls,
        ):
            _one_request(tls)  # the tickets come after the handshake, before the response
            return tls.session, tls.session_reused


@pytest.mark.parametrize("configured", [None, 3])
def test_tls13_sends_the_configured_tickets_and_each_resumes(
    test_pki: PkiFiles, tmp_path: Path, configured: int | None
) -> None:
    table = "" if configured is None else f"tickets_per_handshake = {configured}"
    with edge_stack(test_pki, tmp_path, tls_table=table) as stack:
        client = _TicketCounter(stack)
        session, _ = client.connect()
        assert client.tickets == (configured or 1)  # one by default, not OpenSSL's two
        _, resumed = client.connect(session)
        assert resumed


def test_default_groups_are_mozilla_intermediate(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        port, ca = stack.https_port, test_pki.ca
        assert _handshake(port, ca)  # X25519
        assert _handshake(port, ca, "prime256v1")
        assert _handshake(port, ca, "secp384r1")
        assert not _handshake(port, ca, "secp521r1")
        assert _s_client_groups(port, "X25519")
        assert not _s_client_groups(port, "X448")


def test_groups_are_configurable(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path, tls_table='groups = ["P-384"]') as stack:
        port, ca = stack.https_port, test_pki.ca
        assert _handshake(port, ca, "secp384r1")
        assert not _handshake(port, ca, "prime256v1")
        assert _handshake(port, ca)  # the client's list includes P-384 (after a retry)
        if shutil.which("openssl"):
            assert not _s_client_groups(port, "X25519")


# -- sslyze ---------------------------------------------------------------------------


needs_sslyze = pytest.mark.skipif(
    shutil.which("sslyze", path=str(Path(sys.executable).parent)) is None,
    reason="sslyze not installed (pip install -e '.[test]')",
)


@needs_sslyze
def test_sslyze_mozilla_intermediate_is_compliant(test_pki: PkiFiles, tmp_path: Path) -> None:
    """The edge's default TLS settings with a certificate that itself meets the
    profile (90 days; Mozilla's checker wants less than 366) and our private CA
    given to sslyze as trusted: nothing left to complain about."""
    ca = pki.load_ca(test_pki.dir / "ca")
    short = pki.issue_server_cert(ca, tmp_path, "short", ["localhost", "127.0.0.1"], days=90)
    with edge_stack(test_pki, tmp_path, certificate=short) as stack:
        sslyze = str(Path(sys.executable).parent / "sslyze")
        target = f"localhost:{stack.https_port}{{127.0.0.1}}"
        result = subprocess.run(
            [
                sslyze,
                "--mozilla_config=intermediate",
                "--certinfo_ca_file",
                str(test_pki.ca),
                target,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    out = result.stdout
    compliance = out[out.index("COMPLIANCE AGAINST TLS CONFIGURATION") :]
    assert "Supported curves:                  X25519, secp256r1, secp384r1" in out, out
    assert "OK - Compliant" in compliance, compliance
    assert result.returncode == 0, compliance


# -- HSTS ------------------------------------------------------------------------------

HSTS = "max-age=300; includeSubDomains"


def _raw_response(stack: Stack, request: bytes) -> bytes:
    raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=5)
    tls = stack.tls_context().wrap_socket(raw, server_hostname="localhost")
    tls.sendall(request)
    data = b""
    while chunk := tls.recv(65536):
        data += chunk
    tls.close()
    return data


def test_hsts_on_backend_responses_and_on_the_edges_own(test_pki: PkiFiles, tmp_path: Path) -> None:
    table = "hsts_max_age_s = 300\nhsts_include_subdomains = true"
    with edge_stack(test_pki, tmp_path, tls_table=table) as stack:
        conn = stack.https()
        conn.request("GET", "/ip")
        response = conn.getresponse()
        response.read()
        assert response.getheader("Strict-Transport-Security") == HSTS
        conn.close()
        answer = _raw_response(
            stack, b"GET /ip HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        lines = answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
        # The edge's own fields come first (request id, then HSTS), ahead of the backend's.
        assert lines[1].startswith(b"X-Request-Id: ")
        assert lines[2] == f"Strict-Transport-Security: {HSTS}".encode()
        assert lines.count(f"Strict-Transport-Security: {HSTS}".encode()) == 1
        bad = _raw_response(stack, b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
        assert bad.startswith(b"HTTP/1.1 400 ")
        assert f"\r\nStrict-Transport-Security: {HSTS}\r\n".encode() in bad.split(b"\r\n\r\n")[0]


def test_no_hsts_unless_configured(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        answer = _raw_response(
            stack, b"GET /ip HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        assert b"strict-transport-security" not in answer.lower()


# -- OCSP stapling ------------------------------------------------------------------------


def write_ocsp_response(
    test_pki: PkiFiles,
    cert_path: Path,
    out: Path,
    status: ocsp.OCSPCertStatus = ocsp.OCSPCertStatus.GOOD,
    *,
    valid_for: dt.timedelta = dt.timedelta(days=1),
) -> Path:
    """An OCSP response for ``cert_path`` signed by the test CA (as its own responder)."""
    ca = pki.load_ca(test_pki.dir / "ca")
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    revoked = status == ocsp.OCSPCertStatus.REVOKED
    response = (
        ocsp.OCSPResponseBuilder()
        .add_response(
            cert=cert,
            issuer=ca.cert,
            algorithm=hashes.SHA1(),
            cert_status=status,
            this_update=now - dt.timedelta(minutes=5),
            next_update=now - dt.timedelta(minutes=5) + valid_for,
            revocation_time=now - dt.timedelta(hours=1) if revoked else None,
            revocation_reason=x509.ReasonFlags.key_compromise if revoked else None,
        )
        .responder_id(ocsp.OCSPResponderEncoding.HASH, ca.cert)
        .sign(ca.key, hashes.SHA256())
    )
    out.write_bytes(response.public_bytes(serialization.Encoding.DER))
    return out


def _s_client(port: int, ca: Path, *extra: str) -> str:
    command = ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername"]
    command += ["localhost", "-status", "-CAfile", str(ca), *extra]
    result = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10
    )
    return result.stdout


def stapled(port: int, ca: Path, *extra: str) -> str:
    """What ``openssl s_client -status`` says about the stapled response."""
    out = _s_client(port, ca, *extra)
    if "OCSP response: no response sent" in out:
        return "none"
    assert "OCSP Response Status: successful" in out, out
    status = out.split("Cert Status: ", 1)[1].split()[0]
    serial = out.split("Serial Number: ", 1)[1].split()[0]
    return f"{status} {int(serial, 16):x}"  # openssl pads with a leading 0 at times


def serial(path: Path) -> str:
    return f"{x509.load_pem_x509_certificate(path.read_bytes()).serial_number:x}"


@needs_openssl
def test_ocsp_responses_are_stapled_per_certificate_and_refreshed_on_sighup(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    ca = pki.load_ca(test_pki.dir / "ca")
    ecdsa = pki.issue_server_cert(ca, tmp_path, "ecdsa", ["localhost", "127.0.0.1"])
    rsa = pki.issue_server_cert(ca, tmp_path, "rsa", ["localhost", "127.0.0.1"], key_type="rsa")
    ecdsa_ocsp = write_ocsp_response(test_pki, ecdsa.cert, tmp_path / "ecdsa.ocsp")
    rsa_ocsp = write_ocsp_response(test_pki, rsa.cert, tmp_path / "rsa.ocsp")
    other = pki.issue_server_cert(ca, tmp_path, "other", ["other.test"])
    tls_extra = f"""ocsp_response = "{ecdsa_ocsp}"
[[tls.certificates]]
cert = "{rsa.cert}"
key = "{rsa.key}"
ocsp_response = "{rsa_ocsp}"
[[tls.certificates]]
cert = "{other.cert}"
key = "{other.key}"
"""
    with edge_stack(test_pki, tmp_path, certificate=ecdsa, tls_extra=tls_extra) as stack:
        port = stack.https_port
        assert stapled(port, test_pki.ca) == f"good {serial(ecdsa.cert)}"
        rsa_only = ("-sigalgs", "RSA-PSS+SHA256:RSA+SHA256")
        assert stapled(port, test_pki.ca, *rsa_only) == f"good {serial(rsa.cert)}"
        assert stapled(port, test_pki.ca, "-tls1_2") == f"good {serial(ecdsa.cert)}"
        other_name = ("-servername", "other.test")  # the last -servername counts
        assert "CN = other.test" in _s_client(port, test_pki.ca, *other_name)
        assert stapled(port, test_pki.ca, *other_name) == "none"

        # A refreshed response (revoked, say) is stapled after SIGHUP.
        fresh = write_ocsp_response(
            test_pki, ecdsa.cert, tmp_path / "new.ocsp", ocsp.OCSPCertStatus.REVOKED
        )
        fresh.replace(ecdsa_ocsp)
        stack.edge.send_signal(signal.SIGHUP)
        wait_until(
            lambda: stapled(port, test_pki.ca) == f"revoked {serial(ecdsa.cert)}",
            "SIGHUP did not refresh the OCSP response",
        )

        # A file that is not an OCSP response: one line naming it, the old staple stays.
        ecdsa_ocsp.write_bytes(b"not an OCSP response")
        stack.edge.send_signal(signal.SIGHUP)
        wait_until(
            lambda: str(ecdsa_ocsp) in stack.log.read_text(), "the bad OCSP file was not reported"
        )
        assert stapled(port, test_pki.ca) == f"revoked {serial(ecdsa.cert)}"
        assert "Traceback" not in stack.log.read_text()
