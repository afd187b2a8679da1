"""The private CA: certificates issued by geoedge.pki in real TLS handshakes.

Every handshake runs Python's ssl on both ends of a ``socket.socketpair()``
(server in a thread, bounded by socket timeouts and a join timeout).
"""

from __future__ import annotations

import os
import socket
import ssl
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from geoedge import cli, pki

IO_TIMEOUT_S = 5.0


@dataclass
class Handshake:
    server_version: str | None = None
    client_version: str | None = None
    server_saw_peer_der: bytes | None = None
    server_saw_peer_dict: dict | None = None
    client_saw_server_der: bytes | None = None
    server_error: BaseException | None = None
    client_error: BaseException | None = None


def handshake(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, server_hostname: str | None
) -> Handshake:
    """Run one TLS handshake plus a one-byte exchange; record what each side saw."""
    a, b = socket.socketpair()
    a.settimeout(IO_TIMEOUT_S)
    b.settimeout(IO_TIMEOUT_S)
    out = Handshake()

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                out.server_version = s.version()
                out.server_saw_peer_der = s.getpeercert(binary_form=True)
                out.server_saw_peer_dict = s.getpeercert()
                s.sendall(b"!")
                s.recv(1)
        except (ssl.SSLError, OSError) as exc:
            out.server_error = exc

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname=server_hostname) as c:
            out.client_version = c.version()
            out.client_saw_server_der = c.getpeercert(binary_form=True)
            if c.recv(1) != b"!":
                raise ssl.SSLError("server closed the connection")
            c.sendall(b"!")
    except (ssl.SSLError, OSError) as exc:
        out.client_error = exc
    finally:
        thread.join(2 * IO_TIMEOUT_S)
        a.close()
        b.close()
    assert not thread.is_alive(), "server thread did not finish"
    return out


def server_context(*chains: pki.CertPaths, client_ca: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for chain in chains:
        ctx.load_cert_chain(chain.cert, chain.key)
    if client_ca is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(client_ca)
    return ctx


def client_context(ca: Path, cert: pki.CertPaths | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname + CERT_REQUIRED
    ctx.load_verify_locations(ca)
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    return ctx


@pytest.fixture(scope="module")
def ca_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("ca")
    pki.create_ca(directory)
    return directory


@pytest.fixture(scope="module")
def ca(ca_dir: Path) -> pki.CertificateAuthority:
    return pki.load_ca(ca_dir)


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> pki.CertificateAuthority:
    directory = tmp_path_factory.mktemp("other-ca")
    pki.create_ca(directory, name="someone else's CA")
    return pki.load_ca(directory)


@pytest.fixture(scope="module")
def localhost_cert(ca: pki.CertificateAuthority, tmp_path_factory) -> pki.CertPaths:
    out = tmp_path_factory.mktemp("server")
    return pki.issue_server_cert(ca, out, "localhost", ["localhost", "127.0.0.1", "::1"])


# --- server certificates --------------------------------------------------------------


@pytest.mark.parametrize("hostname", ["localhost", "127.0.0.1", "::1"])
def test_server_cert_verifies_against_the_ca(
    ca: pki.CertificateAuthority, localhost_cert: pki.CertPaths, hostname: str
) -> None:
    result = handshake(
        server_context(localhost_cert), client_context(ca.paths.cert), server_hostname=hostname
    )
    assert result.client_error is None and result.server_error is None
    assert result.client_version == "TLSv1.3"
    assert result.server_version == "TLSv1.3"


def test_server_cert_is_refused_for_a_name_it_does_not_carry(
    ca: pki.CertificateAuthority, localhost_cert: pki.CertPaths
) -> None:
    result = handshake(
        server_context(localhost_cert), client_context(ca.paths.cert), "other.example.test"
    )
    assert isinstance(result.client_error, ssl.SSLCertVerificationError)
    assert "Hostname mismatch" in str(result.client_error)


def test_server_cert_from_another_ca_is_refused(
    ca: pki.CertificateAuthority, other_ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    foreign = pki.issue_server_cert(other_ca, tmp_path, "foreign", ["localhost"])
    result = handshake(server_context(foreign), client_context(ca.paths.cert), "localhost")
    assert isinstance(result.client_error, ssl.SSLCertVerificationError)
    assert "unable to get local issuer certificate" in str(result.client_error)


def test_wildcard_san_matches_one_label_only(ca: pki.CertificateAuthority, tmp_path: Path) -> None:
    wildcard = pki.issue_server_cert(ca, tmp_path, "wild", ["*.example.test"])
    ok = handshake(server_context(wildcard), client_context(ca.paths.cert), "a.example.test")
    assert ok.client_error is None and ok.server_error is None
    deep = handshake(server_context(wildcard), client_context(ca.paths.cert), "a.b.example.test")
    assert isinstance(deep.client_error, ssl.SSLCertVerificationError)
    cert = pki.load_certificate(wildcard.cert)
    cn = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value
    assert cn == "*.example.test"


def test_rsa_server_cert_works(ca: pki.CertificateAuthority, tmp_path: Path) -> None:
    paths = pki.issue_server_cert(ca, tmp_path, "rsa", ["localhost"], key_type="rsa")
    key = pki.load_certificate(paths.cert).public_key()
    assert isinstance(key, rsa.RSAPublicKey) and key.key_size == 2048
    result = handshake(server_context(paths), client_context(ca.paths.cert), "localhost")
    assert result.client_error is None and result.server_error is None
    assert result.client_version == "TLSv1.3"


def test_edge_serves_ecdsa_and_rsa_from_one_context(
    ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    """OpenSSL picks the certificate the client can use: ECDSA unless it only does RSA."""
    ec_paths = pki.issue_server_cert(ca, tmp_path, "ec", ["localhost"])
    rsa_paths = pki.issue_server_cert(ca, tmp_path, "rsa", ["localhost"], key_type="rsa")
    server = server_context(rsa_paths, ec_paths)
    seen = {}
    for suite in ("ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256"):
        client = client_context(ca.paths.cert)
        client.maximum_version = ssl.TLSVersion.TLSv1_2
        client.set_ciphers(suite)
        result = handshake(server, client, "localhost")
        assert result.client_error is None, result.client_error
        assert result.client_saw_server_der is not None
        seen[suite] = x509.load_der_x509_certificate(result.client_saw_server_der).public_key()
    assert isinstance(seen["ECDHE-ECDSA-AES128-GCM-SHA256"], ec.EllipticCurvePublicKey)
    assert isinstance(seen["ECDHE-RSA-AES128-GCM-SHA256"], rsa.RSAPublicKey)


def test_server_cert_extensions(ca: pki.CertificateAuthority, tmp_path: Path) -> None:
    paths = pki.issue_server_cert(ca, tmp_path, "s", ["www.example.test", "10.0.0.1"])
    cert = pki.load_certificate(paths.cert)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["www.example.test"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"
    assert cert.not_valid_after_utc <= ca.cert.not_valid_after_utc


# --- tunnel peers (mutual TLS) -----------------------------------------------------------


def test_mutual_tls_server_sees_the_peer_identity(
    ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    origin = pki.issue_peer_cert(
        ca, tmp_path, "origin", "dublin", role="origin", dns_names=["origin.example.test"]
    )
    edge = pki.issue_peer_cert(ca, tmp_path, "edge-tokyo-1", "tokyo-1", role="edge")
    server = server_context(origin, client_ca=ca.paths.cert)
    client = client_context(ca.paths.cert, edge)
    result = handshake(server, client, "origin.example.test")
    assert result.server_error is None and result.client_error is None
    assert result.server_version == "TLSv1.3"
    assert pki.peer_identity(result.server_saw_peer_der) == "tokyo-1"
    assert pki.parse_peer_name(result.server_saw_peer_der) == pki.PeerName("tokyo-1", "edge")
    # The dict form (only filled for verified peers) gives the same answer.
    assert pki.peer_identity(result.server_saw_peer_dict) == "tokyo-1"
    assert result.client_saw_server_der is not None
    assert pki.parse_peer_name(result.client_saw_server_der) == pki.PeerName("dublin", "origin")


def test_peer_cert_from_a_different_ca_is_refused(
    ca: pki.CertificateAuthority, other_ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    origin = pki.issue_peer_cert(ca, tmp_path, "origin", "dublin", role="origin", dns_names=["o"])
    intruder = pki.issue_peer_cert(other_ca, tmp_path, "intruder", "tokyo-1", role="edge")
    server = server_context(origin, client_ca=ca.paths.cert)
    result = handshake(server, client_context(ca.paths.cert, intruder), "o")
    assert isinstance(result.server_error, ssl.SSLError)
    assert "certificate verify failed" in str(result.server_error)
    assert result.server_saw_peer_der is None
    # With TLS 1.3 the client learns of the refusal on its first read, at the latest.
    assert isinstance(result.client_error, ssl.SSLError | OSError)


def test_mutual_tls_without_a_client_cert_is_refused(
    ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    origin = pki.issue_peer_cert(ca, tmp_path, "origin", "dublin", role="origin", dns_names=["o"])
    result = handshake(
        server_context(origin, client_ca=ca.paths.cert), client_context(ca.paths.cert), "o"
    )
    assert isinstance(result.server_error, ssl.SSLError)
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in str(result.server_error)


def test_peer_cert_profile(ca: pki.CertificateAuthority, tmp_path: Path) -> None:
    paths = pki.issue_peer_cert(ca, tmp_path, "e", "tokyo-1", role="edge", dns_names=["e.test"])
    cert = pki.load_certificate(paths.cert)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["geoedge://edge/tokyo-1"]
    assert san.get_values_for_type(x509.DNSName) == ["e.test"]
    eku = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert eku == {
        x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH,
        x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
    }
    cn = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value
    assert cn == "tokyo-1"


# --- peer_identity on odd inputs ------------------------------------------------------------


def test_peer_identity_falls_back_to_the_common_name(
    ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    paths = pki.issue_server_cert(ca, tmp_path, "plain", ["legacy-edge.example.test"])
    der = pki.load_certificate(paths.cert).public_bytes(serialization.Encoding.DER)
    assert pki.parse_peer_name(der) == pki.PeerName("legacy-edge.example.test", None)
    as_dict = {"subject": ((("commonName", "legacy"),),), "subjectAltName": (("DNS", "x"),)}
    assert pki.peer_identity(as_dict) == "legacy"


@pytest.mark.parametrize(
    "value",
    [None, b"", b"not a certificate", {}, {"subjectAltName": (("URI", "https://x/y"),)}],
)
def test_peer_identity_is_none_without_a_name(value: object) -> None:
    assert pki.peer_identity(value) is None  # type: ignore[arg-type]


def test_peer_identity_ignores_malformed_geoedge_uris() -> None:
    cert = {
        "subject": ((("commonName", "cn-name"),),),
        "subjectAltName": (
            ("URI", "geoedge://admin/root"),  # unknown role
            ("URI", "geoedge://edge/"),  # empty identity
            ("URI", "geoedge://edge/a/b"),  # not one segment
            ("URI", "geoedge://origin/dublin"),
        ),
    }
    assert pki.parse_peer_name(cert) == pki.PeerName("dublin", "origin")


# --- files and errors -------------------------------------------------------------------


def test_key_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        ca_paths = pki.create_ca(tmp_path)
        leaf = pki.issue_server_cert(tmp_path, tmp_path, "s", ["localhost"])
        peer = pki.issue_peer_cert(tmp_path, tmp_path, "p", "x", role="edge")
    finally:
        os.umask(old)
    for key in (ca_paths.key, leaf.key, peer.key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    for cert in (ca_paths.cert, leaf.cert, peer.cert):
        assert stat.S_IMODE(cert.stat().st_mode) == 0o644, cert
    assert not list(tmp_path.glob(".*.tmp"))


def test_create_ca_refuses_to_replace_an_existing_ca(tmp_path: Path) -> None:
    first = pki.create_ca(tmp_path)
    before = first.cert.read_bytes()
    with pytest.raises(pki.PkiError) as info:
        pki.create_ca(tmp_path)
    assert info.value.code == "ca-exists"
    assert str(tmp_path) in str(info.value)
    assert first.cert.read_bytes() == before
    pki.create_ca(tmp_path, overwrite=True)
    assert first.cert.read_bytes() != before


def test_load_ca_detects_a_key_that_does_not_match(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    pki.create_ca(a)
    pki.create_ca(b)
    (a / pki.CA_KEY_FILE).write_bytes((b / pki.CA_KEY_FILE).read_bytes())
    with pytest.raises(pki.PkiError) as info:
        pki.load_ca(a)
    assert info.value.code == "key-mismatch"


def test_load_ca_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(pki.PkiError) as info:
        pki.load_ca(tmp_path)
    assert info.value.code == "missing-file"
    assert str(tmp_path / "ca.pem") in str(info.value)


def test_load_certificate_names_a_file_that_is_not_one(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    with pytest.raises(pki.PkiError, match=r"bogus\.pem: not a PEM or DER certificate"):
        pki.load_certificate(bogus)


@pytest.mark.parametrize(
    "name", ["", "bad_name.example", "*.test", "a.*.example.test", "-x.example", "a" * 64 + ".t"]
)
def test_bad_server_names_are_refused(ca: pki.CertificateAuthority, tmp_path, name: str) -> None:
    with pytest.raises(pki.PkiError) as info:
        pki.issue_server_cert(ca, tmp_path, "s", [name])
    assert info.value.code == "bad-name"
    assert not (tmp_path / "s-key.pem").exists()


@pytest.mark.parametrize("identity", ["", "a/b", "-x", "tokyo 1", "x" * 64])
def test_bad_peer_identities_are_refused(
    ca: pki.CertificateAuthority, tmp_path, identity: str
) -> None:
    with pytest.raises(pki.PkiError) as info:
        pki.issue_peer_cert(ca, tmp_path, "p", identity, role="edge")
    assert info.value.code == "bad-identity"


def test_bad_role_and_key_type_are_refused(ca: pki.CertificateAuthority, tmp_path) -> None:
    with pytest.raises(pki.PkiError, match="peer role"):
        pki.issue_peer_cert(ca, tmp_path, "p", "x", role="admin")  # type: ignore[arg-type]
    with pytest.raises(pki.PkiError, match="key type"):
        pki.issue_server_cert(ca, tmp_path, "s", ["x.test"], key_type="dsa")  # type: ignore[arg-type]


def test_describe_certificate_shows_identity_sans_and_expiry(
    ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    paths = pki.issue_peer_cert(ca, tmp_path, "e", "tokyo-1", role="edge", dns_names=["e.test"])
    text = pki.describe_certificate(paths.cert)
    assert "subject:     CN=tokyo-1" in text
    assert "URI:geoedge://edge/tokyo-1" in text and "DNS:e.test" in text
    assert "identity:    tokyo-1 (role edge)" in text
    assert "days left" in text
    assert "is CA:       no" in text
    assert "is CA:       yes" in pki.describe_certificate(ca.paths.cert)


# --- the geoedge pki command -------------------------------------------------------------


def test_cli_pki_issues_certificates_that_complete_a_handshake(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(tmp_path)
    assert cli.main(["pki", "init", "--dir", d]) == 0
    assert cli.main(["pki", "server", "--dir", d, "--name", "localhost", "--out", "edge"]) == 0
    assert (
        cli.main(["pki", "server", "--dir", d, "--name", "localhost", "--rsa", "--out", "r"]) == 0
    )
    assert cli.main(["pki", "peer", "--dir", d, "--role", "edge", "--id", "tokyo-1"]) == 0
    assert (
        cli.main(["pki", "peer", "--dir", d, "--role", "origin", "--id", "o", "--dns", "o.test"])
        == 0
    )
    written = capsys.readouterr().out
    assert f"wrote {tmp_path / 'edge-tokyo-1.pem'}" in written
    assert isinstance(pki.load_certificate(tmp_path / "r.pem").public_key(), rsa.RSAPublicKey)

    edge = pki.CertPaths(tmp_path / "edge-tokyo-1.pem", tmp_path / "edge-tokyo-1-key.pem")
    origin = pki.CertPaths(tmp_path / "origin-o.pem", tmp_path / "origin-o-key.pem")
    server = server_context(origin, client_ca=tmp_path / "ca.pem")
    result = handshake(server, client_context(tmp_path / "ca.pem", edge), "o.test")
    assert result.server_error is None and result.client_error is None
    assert pki.peer_identity(result.server_saw_peer_der) == "tokyo-1"

    assert cli.main(["pki", "show", str(edge.cert)]) == 0
    assert "identity:    tokyo-1 (role edge)" in capsys.readouterr().out


def test_cli_pki_reports_errors_with_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["pki", "init", "--dir", str(tmp_path)]) == 0
    assert cli.main(["pki", "init", "--dir", str(tmp_path)]) == 1
    assert "a CA already exists" in capsys.readouterr().err
    assert cli.main(["pki", "server", "--dir", str(tmp_path), "--name", "a_b"]) == 1
    assert "'a_b' is neither an IP address nor a DNS name" in capsys.readouterr().err
    assert cli.main(["pki", "peer", "--dir", str(tmp_path), "--role", "admin", "--id", "x"]) == 2
    assert "invalid choice: 'admin'" in capsys.readouterr().err


def test_renew_issues_the_same_identity_and_names_with_a_new_key_and_lifetime(
    ca: pki.CertificateAuthority, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = pki.issue_peer_cert(
        ca, tmp_path, "origin", "dublin-1", role="origin", dns_names=["origin.example.com"],
        days=10,
    )  # fmt: skip
    old_cert = pki.load_certificate(old.cert)
    old_key = old.key.read_bytes()
    status = cli.main(["pki", "renew", "--dir", str(ca.paths.cert.parent), str(old.cert)])
    assert status == 0, capsys.readouterr().err
    new_cert = pki.load_certificate(old.cert)
    assert new_cert.serial_number != old_cert.serial_number
    assert old.key.read_bytes() != old_key  # a new key, in the same file
    assert stat.S_IMODE(old.key.stat().st_mode) == 0o600
    name = pki.parse_peer_name(new_cert)
    assert name is not None and (name.role, name.identity) == ("origin", "dublin-1")
    san = new_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["origin.example.com"]
    lifetime = new_cert.not_valid_after_utc - new_cert.not_valid_before_utc
    assert lifetime.days >= 825
    # The new key and certificate belong together.
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(old.cert, old.key)


def test_renew_refuses_a_certificate_that_is_not_a_tunnel_one(
    ca: pki.CertificateAuthority, tmp_path: Path
) -> None:
    server = pki.issue_server_cert(ca, tmp_path, "server", ["app.example.com"])
    with pytest.raises(pki.PkiError, match="not a tunnel certificate"):
        pki.renew_peer_cert(ca, server.cert)
