"""The edge's side of ACME without a CA: the messages, the certificate store
(its files, their modes, newer wins), the SNI choice between files and ACME
certificates, TLS-ALPN-01 over real in-memory handshakes, HTTP-01 answers."""

from __future__ import annotations

import datetime
import os
import ssl
import stat
import time
from pathlib import Path

import pytest
from cryptography import x509

from edge.acme_responder import AcmeResponder
from edge.acme_store import AcmeStore, StoreError
from edge.config import CertificateConfig, TlsConfig
from edge.tls import CertificateStore
from geoedge import pki
from geoedge.acme_wire import (
    ACME_CERTIFICATE_SET,
    ACME_CHALLENGE_CLEAR,
    ACME_CHALLENGE_SET,
    CertificateSet,
    ChallengeClear,
    Http01Challenge,
    MessageError,
    TlsAlpn01Challenge,
    decode,
    encode,
)
from origin.acme.material import ACME_IDENTIFIER_OID, tls_alpn_certificate
from tests.conftest import PkiFiles

TOKEN = "tok_" + "A" * 40


def issued(ca_dir: Path, out: Path, name: str, names: list[str], days: int = 30) -> CertificateSet:
    paths = pki.issue_server_cert(ca_dir, out, name, names, days=days)
    return CertificateSet(name, paths.cert.read_text(), paths.key.read_text())


def handshake(
    context: ssl.SSLContext, server_name: str, alpn: list[str]
) -> tuple[x509.Certificate, str | None]:
    """An in-memory handshake with ``context``: the server's leaf and the ALPN chosen."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    client.set_alpn_protocols(alpn)
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    tls_client = client.wrap_bio(c_in, c_out, server_hostname=server_name)
    tls_server = context.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side, out, peer in ((tls_client, c_out, s_in), (tls_server, s_out, c_in)):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            peer.write(out.read())
    der = tls_client.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der), tls_client.selected_alpn_protocol()


@pytest.fixture
def ca_dir(test_pki: PkiFiles) -> Path:
    return test_pki.dir / "ca"


# ------------------------------------------------------------------ messages


def test_every_message_survives_encoding_and_bad_bodies_are_refused() -> None:
    messages = [
        Http01Challenge("a.example.com", TOKEN, TOKEN + ".thumb"),
        TlsAlpn01Challenge("a.example.com", "-----BEGIN CERTIFICATE-----x", "-----BEGIN KEY-----"),
        ChallengeClear("http-01", "a.example.com", TOKEN),
        ChallengeClear("tls-alpn-01", "*.example.com"),
        CertificateSet("app", "-----BEGIN CERTIFICATE-----", "-----BEGIN PRIVATE KEY-----", b"\1"),
    ]
    for message in messages:
        assert decode(*encode(message)) == message
    bad = [
        (ACME_CHALLENGE_SET, b"not json"),
        (ACME_CHALLENGE_SET, b"[]"),
        (ACME_CHALLENGE_SET, b'{"type":"http-01","domain":"A..b","token":"x"}'),
        (ACME_CHALLENGE_SET, b'{"type":"dns-01","domain":"a.example.com"}'),
        (ACME_CHALLENGE_SET, b'{"type":"http-01","domain":"a.example.com","token":"../x"}'),
        (ACME_CHALLENGE_CLEAR, b'{"type":"http-01","domain":"a.example.com"}'),
        (ACME_CERTIFICATE_SET, b'{"id":"../etc","chain":"x","key":"y"}'),
        (0x01FF, b"{}"),
    ]
    for kind, body in bad:
        with pytest.raises(MessageError):
            decode(kind, body)


# ------------------------------------------------------------------ the store


def test_the_store_keeps_keys_private_and_a_late_older_certificate_never_wins(
    ca_dir: Path, tmp_path: Path
) -> None:
    store = AcmeStore(tmp_path / "state" / "acme")
    store.prepare()
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    old = issued(ca_dir, tmp_path / "old", "app", ["app.example.com"])
    time.sleep(1.1)  # certificates carry whole seconds: the next one is later
    new = issued(ca_dir, tmp_path / "new", "app", ["app.example.com", "www.example.com"])
    now = time.time()
    saved = store.save("app", new.chain, new.key, None, now)
    assert saved.names == ("app.example.com", "www.example.com")
    kept = store.save("app", old.chain, old.key, None, now)  # arrives late, through another worker
    assert kept.serial == saved.serial
    for path in store.directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    [loaded] = AcmeStore(store.directory).load_all(now)
    assert loaded.serial == saved.serial and loaded.path == store.directory / "app.pem"


def test_the_store_refuses_a_key_of_another_certificate_and_an_open_directory(
    ca_dir: Path, tmp_path: Path
) -> None:
    store = AcmeStore(tmp_path / "acme")
    store.prepare()
    one = issued(ca_dir, tmp_path / "one", "one", ["one.example.com"])
    two = issued(ca_dir, tmp_path / "two", "two", ["two.example.com"])
    with pytest.raises(StoreError, match="not the leaf certificate's"):
        store.save("one", one.chain, two.key, None, time.time())
    assert list(store.directory.glob("*.pem")) == []
    os.chmod(store.directory, 0o755)
    with pytest.raises(StoreError, match="lets others in"):
        store.prepare()


# ------------------------------------------------------------------ SNI and TLS-ALPN-01


def make_store(test_pki: PkiFiles, tmp_path: Path, files: bool = True) -> CertificateStore:
    certificates = (
        (CertificateConfig(test_pki.server.cert, test_pki.server.key, ("files.example.com",)),)
        if files
        else ()
    )
    return CertificateStore(
        TlsConfig(certificates=certificates),
        (("h2", "http/1.1"),),
        AcmeStore(tmp_path / "acme"),
    )


def serial_served(store: CertificateStore, name: str, alpn: list[str] | None = None) -> int:
    leaf, _ = handshake(store.context, name, alpn or ["h2"])
    return leaf.serial_number


def test_files_keep_their_names_and_acme_certificates_serve_the_rest(
    test_pki: PkiFiles, ca_dir: Path, tmp_path: Path
) -> None:
    store = make_store(test_pki, tmp_path)
    assert store.acme is not None
    message = issued(ca_dir, tmp_path / "i", "app", ["app.example.com", "files.example.com"])
    stored = store.acme.store.save("app", message.chain, message.key, None, time.time())
    store.acme.install(stored)
    file_serial = pki.load_certificate(test_pki.server.cert).serial_number
    assert serial_served(store, "files.example.com") == file_serial
    assert serial_served(store, "app.example.com") == stored.serial
    assert serial_served(store, "unknown.example.com") == file_serial  # the files' default

    renewed = issued(ca_dir, tmp_path / "r", "app", ["app.example.com"])
    time.sleep(1.1)
    renewed = issued(ca_dir, tmp_path / "r2", "app", ["app.example.com"])
    store.acme.install(store.acme.store.save("app", renewed.chain, renewed.key, None, time.time()))
    assert serial_served(store, "app.example.com") != stored.serial

    # A new process (a restarted edge) serves the stored certificate at once.
    again = make_store(test_pki, tmp_path, files=False)
    assert serial_served(again, "app.example.com") == serial_served(store, "app.example.com")
    assert serial_served(again, "unknown.example.com") == serial_served(store, "app.example.com")


def test_tls_alpn_01_answers_only_clients_offering_acme_tls_1(
    test_pki: PkiFiles, ca_dir: Path, tmp_path: Path
) -> None:
    store = make_store(test_pki, tmp_path)
    assert store.acme is not None
    message = issued(ca_dir, tmp_path / "i", "app", ["app.example.com"])
    store.acme.install(store.acme.store.save("app", message.chain, message.key, None, time.time()))
    real = serial_served(store, "app.example.com")
    certificate, key = tls_alpn_certificate(
        "app.example.com", TOKEN + ".thumb", datetime.datetime.now(datetime.UTC)
    )
    responder = AcmeResponder(store.acme, plain_http=False)
    assert responder.apply(*encode(TlsAlpn01Challenge("app.example.com", certificate, key)))

    leaf, alpn = handshake(store.context, "app.example.com", ["acme-tls/1"])
    assert alpn == "acme-tls/1"
    assert leaf.extensions.get_extension_for_oid(ACME_IDENTIFIER_OID).critical
    assert serial_served(store, "app.example.com", ["h2", "http/1.1"]) == real  # users: unchanged
    _, alpn = handshake(store.context, "other.example.com", ["acme-tls/1"])
    assert alpn is None  # no challenge for that name: acme-tls/1 is not negotiated

    assert responder.apply(*encode(ChallengeClear("tls-alpn-01", "app.example.com")))
    leaf, alpn = handshake(store.context, "app.example.com", ["acme-tls/1"])
    assert alpn is None and leaf.serial_number == real


def test_http_01_is_answered_for_its_name_only_and_refused_without_plain_http(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    store = make_store(test_pki, tmp_path)
    assert store.acme is not None
    challenge = Http01Challenge("app.example.com", TOKEN, TOKEN + ".thumb")
    no_port_80 = AcmeResponder(store.acme, plain_http=False)
    refused = no_port_80.apply(*encode(challenge))
    assert not refused.applied and "[redirect]" in refused.reason

    events: list[str] = []
    responder = AcmeResponder(store.acme, plain_http=True, on_event=events.append)
    assert responder.apply(*encode(challenge)).applied
    path = "/.well-known/acme-challenge/" + TOKEN
    assert responder.http01_answer("App.Example.com:80", path) == TOKEN + ".thumb"
    assert responder.http01_answer("other.example.com", path) is None
    assert responder.http01_answer("app.example.com", path + "x") is None
    assert responder.apply(*encode(ChallengeClear("http-01", "app.example.com", TOKEN))).applied
    assert responder.http01_answer("app.example.com", path) is None
    assert events == ["challenge_set", "http01_answered", "challenge_cleared"]
    assert not responder.apply(ACME_CHALLENGE_SET, b"{}").applied
