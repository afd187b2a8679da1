"""The edge's TLS settings without a running edge: groups, HSTS, OCSP response
files, the ctypes bindings, and errors that name the file or the key."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509 import ocsp

from edge import openssl
from edge.config import CertificateConfig, EdgeConfig, TlsConfig
from edge.http1 import error_response, with_field
from edge.ocsp import OcspError, StapleTable, leaf_der, load_staple
from edge.tls import CertificateStore, TlsConfigError, _handshake_in_memory
from geoedge import pki
from geoedge.config import ConfigError, load_config
from tests.conftest import PkiFiles


def tls(test_pki: PkiFiles, **settings: object) -> TlsConfig:
    cert = CertificateConfig(test_pki.server.cert, test_pki.server.key)
    return TlsConfig(certificates=(cert,), **settings)  # type: ignore[arg-type]


def probe_client(curve: str | None = None) -> ssl.SSLContext:
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    client.minimum_version = ssl.TLSVersion.TLSv1_3
    if curve:
        client.set_ecdh_curve(curve)
    return client


# -- groups -----------------------------------------------------------------------------


def test_the_groups_list_is_what_the_context_offers(test_pki: PkiFiles) -> None:
    default = CertificateStore(tls(test_pki)).context
    assert _handshake_in_memory(probe_client("secp384r1"), default)
    assert not _handshake_in_memory(probe_client("secp521r1"), default)
    openssl_default = CertificateStore(tls(test_pki, groups=())).context
    assert _handshake_in_memory(probe_client("secp521r1"), openssl_default)
    p384_only = CertificateStore(tls(test_pki, groups=("P-384",))).context
    assert not _handshake_in_memory(probe_client("prime256v1"), p384_only)
    assert _handshake_in_memory(probe_client("secp384r1"), p384_only)


def test_an_unknown_group_names_the_setting_and_the_group(test_pki: PkiFiles) -> None:
    with pytest.raises(TlsConfigError, match=r"\[tls\] groups: .*'P-999'"):
        CertificateStore(tls(test_pki, groups=("X25519", "P-999")))


def test_a_group_name_that_cannot_be_one_is_a_config_error(tmp_path: Path) -> None:
    path = write_edge_toml(tmp_path, tls_keys='groups = ["X25519:P-256"]')
    with pytest.raises(ConfigError, match=r"edge.toml: \[tls\] groups: 'X25519:P-256'"):
        load_config(path, EdgeConfig)


def test_without_the_bindings_groups_are_a_clear_error(
    test_pki: PkiFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an interpreter whose ssl layout is not the known one, setting groups
    fails at start with the reason and the way out; OpenSSL's list still works."""

    def unavailable() -> None:
        raise openssl.OpenSslUnavailable("pypy 3.10: the layout is known for CPython only")

    monkeypatch.setattr(openssl, "bindings", unavailable)
    with pytest.raises(TlsConfigError, match=r"\[tls\] groups: .*CPython only.*groups = \[\]"):
        CertificateStore(tls(test_pki))
    CertificateStore(tls(test_pki, groups=()))


def test_the_bindings_check_their_layout_and_find_libssl() -> None:
    lib = openssl.bindings().lib
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    assert lib.SSL_CTX_get_options(openssl.context_pointer(context)) == int(context.options)
    connection = context._wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), True, None)  # type: ignore[attr-defined]
    openssl.mark_shut_down(connection)  # on a fresh SSL: harmless


# -- HSTS ---------------------------------------------------------------------------------


def test_hsts_value(test_pki: PkiFiles) -> None:
    assert tls(test_pki).hsts_value() is None
    assert tls(test_pki, hsts_max_age_s=300).hsts_value() == "max-age=300"
    year = tls(test_pki, hsts_max_age_s=63072000, hsts_include_subdomains=True, hsts_preload=True)
    assert year.hsts_value() == "max-age=63072000; includeSubDomains; preload"


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("hsts_max_age_s = -1", "hsts_max_age_s must be >= 0"),
        ("hsts_include_subdomains = true", "need hsts_max_age_s > 0"),
        ("hsts_max_age_s = 300\nhsts_include_subdomains = true\nhsts_preload = true", "a year"),
        ("hsts_max_age_s = 31536000\nhsts_preload = true", "hsts_include_subdomains"),
        ("tickets_per_handshake = 0", "tickets_per_handshake must be 1..16"),
        ("tickets_per_handshake = 17", "tickets_per_handshake must be 1..16"),
    ],
)
def test_tls_settings_that_cannot_work_are_refused(tmp_path: Path, keys: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"edge.toml: \[tls\] .*{message}"):
        load_config(write_edge_toml(tmp_path, tls_keys=keys), EdgeConfig)


def test_with_field_goes_right_after_the_status_line() -> None:
    field = b"Strict-Transport-Security: max-age=300"
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nStrict-Transport-Security: max-age=1\r\n\r\n"
    assert with_field(head, field) == (
        b"HTTP/1.1 200 OK\r\n" + field + b"\r\nContent-Length: 2\r\n"
        b"Strict-Transport-Security: max-age=1\r\n\r\n"
    )
    response = error_response(400)
    out = with_field(response, field)
    assert out.endswith(b"\r\n\r\n400 Bad Request\n") and len(out) == len(response) + len(field) + 2
    with pytest.raises(ValueError):
        with_field(b"no status line", field)
    with pytest.raises(ValueError):
        with_field(head, b"X: a\r\nInjected: b")


# -- OCSP -----------------------------------------------------------------------------------


def ocsp_der(
    ca: pki.CertificateAuthority,
    cert_path: Path,
    *,
    issuer: x509.Certificate | None = None,
    this_update: dt.datetime | None = None,
    valid_for: dt.timedelta = dt.timedelta(days=1),
) -> bytes:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    start = this_update or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    response = (
        ocsp.OCSPResponseBuilder()
        .add_response(
            cert=cert,
            issuer=issuer or ca.cert,
            algorithm=hashes.SHA256(),
            cert_status=ocsp.OCSPCertStatus.GOOD,
            this_update=start,
            next_update=start + valid_for,
            revocation_time=None,
            revocation_reason=None,
        )
        .responder_id(ocsp.OCSPResponderEncoding.HASH, ca.cert)
        .sign(ca.key, hashes.SHA256())
    )
    return response.public_bytes(serialization.Encoding.DER)


def test_an_ocsp_response_is_checked_against_its_certificate(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    ca = pki.load_ca(test_pki.dir / "ca")
    good = tmp_path / "good.ocsp"
    good.write_bytes(ocsp_der(ca, test_pki.server.cert))
    staple = load_staple(good, test_pki.server.cert)
    assert staple.status == "good" and staple.valid_at(dt.datetime.now(dt.UTC).timestamp())

    other = tmp_path / "other.ocsp"
    other.write_bytes(ocsp_der(ca, test_pki.edge.cert))
    with pytest.raises(
        OcspError, match=rf"{other}: the response is not for {test_pki.server.cert}"
    ):
        load_staple(other, test_pki.server.cert)

    garbage = tmp_path / "garbage.ocsp"
    garbage.write_bytes(b"<html>503</html>")
    with pytest.raises(OcspError, match=rf"{garbage}: not a DER OCSP response"):
        load_staple(garbage, test_pki.server.cert)

    unsuccessful = tmp_path / "later.ocsp"
    unsuccessful.write_bytes(
        ocsp.OCSPResponseBuilder.build_unsuccessful(ocsp.OCSPResponseStatus.TRY_LATER).public_bytes(
            serialization.Encoding.DER
        )
    )
    with pytest.raises(OcspError, match="TRY_LATER"):
        load_staple(unsuccessful, test_pki.server.cert)

    with pytest.raises(OcspError, match=r"missing\.ocsp"):
        load_staple(tmp_path / "missing.ocsp", test_pki.server.cert)


def test_an_ocsp_response_from_another_issuer_is_refused(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    """With the issuer in the chain file, the response's CertID must name it."""
    ca = pki.load_ca(test_pki.dir / "ca")
    rogue = pki.load_ca(test_pki.dir / "rogue")
    chain = tmp_path / "chain.pem"
    chain.write_bytes(test_pki.server.cert.read_bytes() + test_pki.ca.read_bytes())
    right = tmp_path / "right.ocsp"
    right.write_bytes(ocsp_der(ca, test_pki.server.cert))
    assert load_staple(right, chain).status == "good"
    wrong = tmp_path / "wrong.ocsp"
    wrong.write_bytes(ocsp_der(rogue, test_pki.server.cert, issuer=rogue.cert))
    with pytest.raises(OcspError, match="another issuer"):
        load_staple(wrong, chain)


def test_a_staple_is_served_only_inside_its_validity_window(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    ca = pki.load_ca(test_pki.dir / "ca")
    path = tmp_path / "server.ocsp"
    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    path.write_bytes(ocsp_der(ca, test_pki.server.cert, this_update=start))
    table = StapleTable()
    der = leaf_der(test_pki.server.cert)
    table.replace({der: load_staple(path, test_pki.server.cert)})
    day = 86400
    assert table.lookup(der, now=start.timestamp() - 1) is None  # not yet valid
    assert table.lookup(der, now=start.timestamp() + 1) == path.read_bytes()
    assert table.lookup(der, now=start.timestamp() + day + 1) is None  # expired
    assert table.lookup(b"another certificate", now=start.timestamp() + 1) is None


def test_a_bad_ocsp_file_at_start_names_it(test_pki: PkiFiles, tmp_path: Path) -> None:
    bad = tmp_path / "bad.ocsp"
    bad.write_bytes(b"nope")
    cert = CertificateConfig(test_pki.server.cert, test_pki.server.key, ocsp_response=bad)
    with pytest.raises(TlsConfigError, match=str(bad)):
        CertificateStore(TlsConfig(certificates=(cert,)))


# -- certificate files ------------------------------------------------------------------------


def test_a_malformed_certificate_names_its_file(test_pki: PkiFiles, tmp_path: Path) -> None:
    """cryptography's ValueError used to escape as a traceback (at start, and
    from the supervisor on SIGHUP)."""
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    cert = CertificateConfig(broken, test_pki.server.key)
    with pytest.raises(TlsConfigError, match=rf"{broken}: not a readable PEM certificate"):
        CertificateStore(TlsConfig(certificates=(cert,)))


def test_reload_with_a_malformed_certificate_changes_nothing(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    live = pki.issue_server_cert(pki.load_ca(test_pki.dir / "ca"), tmp_path, "live", ["a.test"])
    store = CertificateStore(TlsConfig(certificates=(CertificateConfig(live.cert, live.key),)))
    before = live.cert.read_bytes()
    live.cert.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(TlsConfigError, match=str(live.cert)):
        store.reload()
    live.cert.write_bytes(before)
    store.reload()


def write_edge_toml(tmp_path: Path, *, tls_keys: str = "") -> Path:
    path = tmp_path / "edge.toml"
    path.write_text(
        f"""
[edge]
id = "e"
[tls]
{tls_keys}
[[tls.certificates]]
cert = "c.pem"
key = "k.pem"
[[origins]]
name = "o"
[origins.tunnel]
address = "127.0.0.1:1"
transport = "tcp"
"""
    )
    return path
