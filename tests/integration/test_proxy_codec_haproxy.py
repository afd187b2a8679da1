"""Interop: real HAProxy (Debian's 2.6) sends PROXY v1/v2 to a loopback listener that reads it
with our parser. Skipped when haproxy is not installed (``apt-get install haproxy``).

One HAProxy process, started once for the module and stopped by its PID, serves four cases:
plain TCP with ``send-proxy`` (v1); with ``send-proxy-v2`` plus CRC32C and UNIQUE_ID TLVs;
TLS terminated by HAProxy with the SSL, AUTHORITY (SNI) and ALPN TLVs; and its health checks,
which carry a v2 LOCAL header.
"""

from __future__ import annotations

import datetime
import os
import queue
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from geoedge.proxy import (
    ProxyCommand,
    ProxyFamily,
    ProxyHeader,
    ProxyHeaderParser,
    ProxyProtocolError,
    TlvType,
)

HAPROXY = shutil.which("haproxy") or (
    "/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None
)
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed")
SCALE = float(os.environ.get("GEOEDGE_TEST_TIMEOUT_SCALE", "1"))
WAIT_S = 20.0 * SCALE  # bounds a failure only: a passing test does not wait for it
SNI = "edge.example"


@dataclass(frozen=True)
class Received:
    header: ProxyHeader | None
    error: ProxyProtocolError | None
    payload: bytes


class Backend:
    """A loopback TCP listener that parses the PROXY header of each connection, reads a line
    after it, answers "ok" and queues what it got. A thread per connection, each with a timeout."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: queue.Queue[Received] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        parser = ProxyHeaderParser()
        header, error, payload = None, None, b""
        conn.settimeout(WAIT_S)
        with conn:
            try:
                while header is None and (chunk := conn.recv(4096)):
                    header = parser.feed(chunk)
                payload = parser.remainder
                while header is not None and not payload.endswith(b"\n") and len(payload) < 1024:
                    if not (chunk := conn.recv(4096)):
                        break
                    payload += chunk
                if payload:
                    conn.sendall(b"ok")
            except ProxyProtocolError as exc:
                error = exc
            except OSError:
                pass  # health checks close at once; a timeout shows up as a missing result
        self.received.put(Received(header, error, payload))

    def wait_for(self, wanted: bytes | None) -> Received:
        """The next result with this payload (None: a LOCAL health check), skipping others."""
        deadline = time.monotonic() + WAIT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                got = self.received.get(timeout=left)
            except queue.Empty:
                break
            assert got.error is None, f"parser refused HAProxy's header: {got.error}"
            if wanted is None and got.header and got.header.command is ProxyCommand.LOCAL:
                return got
            if wanted is not None and got.payload == wanted:
                return got
        pytest.fail(f"no connection with payload {wanted!r} within {WAIT_S} s")

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=2)


@dataclass(frozen=True)
class Frontends:
    v1: int
    v2: int
    tls: int
    backend: Backend


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_pem(path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SNI)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SNI)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key_pem)


CONFIG = """\
global
    maxconn 100
defaults
    mode tcp
    timeout connect 2s
    timeout client 5s
    timeout server 5s
frontend fe_v1
    bind 127.0.0.1:{v1}
    default_backend be_v1
frontend fe_v2
    bind 127.0.0.1:{v2}
    unique-id-format req-%{{+X}}o%ci:%cp
    default_backend be_v2
frontend fe_tls
    bind 127.0.0.1:{tls} ssl crt {pem} alpn h2,http/1.1
    default_backend be_tls
backend be_v1
    server s1 127.0.0.1:{backend} send-proxy
backend be_v2
    server s1 127.0.0.1:{backend} send-proxy-v2 proxy-v2-options crc32c,unique-id
backend be_tls
    server s1 127.0.0.1:{backend} send-proxy-v2 proxy-v2-options ssl,ssl-cipher,authority,crc32c
backend be_checks
    server s1 127.0.0.1:{backend} send-proxy-v2 check check-send-proxy inter 100ms
"""


@pytest.fixture(scope="module")
def haproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Frontends]:
    workdir = tmp_path_factory.mktemp("haproxy")
    backend = Backend()
    ports = {"v1": free_port(), "v2": free_port(), "tls": free_port()}
    write_pem(workdir / "edge.pem")
    config = workdir / "haproxy.cfg"
    config.write_text(CONFIG.format(pem=workdir / "edge.pem", backend=backend.port, **ports))
    log = (workdir / "haproxy.log").open("wb")
    proc = subprocess.Popen(
        [HAPROXY, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT, cwd=workdir
    )
    try:
        wait_until_listening(proc, list(ports.values()), workdir / "haproxy.log")
        yield Frontends(backend=backend, **ports)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=3)
        log.close()
        backend.close()


def wait_until_listening(proc: subprocess.Popen, ports: list[int], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    for port in ports:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"haproxy exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"haproxy did not listen on {port}: {log.read_text()[-2000:]}")
                time.sleep(0.02)


def send_plain(port: int, payload: bytes) -> tuple[str, int]:
    """Send payload through HAProxy; return the client's own address (what PROXY must carry)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as conn:
        client = conn.getsockname()
        conn.sendall(payload)
        assert conn.recv(16) == b"ok"
    return client


def test_v1_from_send_proxy(haproxy: Frontends) -> None:
    client = send_plain(haproxy.v1, b"hello-v1\n")
    got = haproxy.backend.wait_for(b"hello-v1\n")
    assert got.header is not None and got.header.version == 1
    assert got.header.family is ProxyFamily.INET
    assert got.header.source == client
    assert got.header.destination == ("127.0.0.1", haproxy.v1)


def test_v2_with_crc32c_and_unique_id(haproxy: Frontends) -> None:
    client = send_plain(haproxy.v2, b"hello-v2\n")
    got = haproxy.backend.wait_for(b"hello-v2\n")
    header = got.header
    assert header is not None and header.version == 2
    assert header.command is ProxyCommand.PROXY
    assert header.source == client and header.destination == ("127.0.0.1", haproxy.v2)
    assert header.tlv(TlvType.CRC32C) is not None  # and the parser verified it
    assert header.unique_id is not None and header.unique_id.startswith(b"req-")


def test_v2_from_tls_frontend_carries_sni_alpn_and_ssl(haproxy: Frontends) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", haproxy.tls), timeout=WAIT_S) as raw,
        context.wrap_socket(raw, server_hostname=SNI) as conn,
    ):
        version, cipher = conn.version(), conn.cipher()[0]  # type: ignore[index]
        conn.sendall(b"hello-tls\n")
        assert conn.recv(16) == b"ok"
    header = haproxy.backend.wait_for(b"hello-tls\n").header
    assert header is not None
    assert header.authority == SNI and header.alpn == b"h2"
    info = header.ssl
    assert info is not None and info.version == version and info.cipher == cipher
    assert header.tlv(TlvType.CRC32C) is not None


def test_health_checks_send_local(haproxy: Frontends) -> None:
    got = haproxy.backend.wait_for(None)
    assert got.header is not None and got.header.version == 2
    assert got.header.source is None
