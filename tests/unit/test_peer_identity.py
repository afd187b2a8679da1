"""Which tunnel peer certificates each side accepts (:func:`check_peer_certificate`):
the role in the ``geoedge://<role>/<id>`` URI SAN decides, then the allow-list."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import PkiFiles
from tunnel.aio.errors import PeerRefused
from tunnel.aio.transport import check_peer_certificate


def der(path: object) -> bytes:
    with open(path, "rb") as f:  # type: ignore[call-overload]
        cert = x509.load_pem_x509_certificate(f.read())
    return cert.public_bytes(serialization.Encoding.DER)


def cn_only_certificate(name: str) -> bytes:
    """A certificate naming ``name`` in its CN only (no geoedge:// URI SAN)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


ANY = frozenset({"*"})


def test_each_side_accepts_only_the_other_role(test_pki: PkiFiles) -> None:
    edge, origin = der(test_pki.edge.cert), der(test_pki.origin.cert)
    assert check_peer_certificate(edge, expect_role="edge", allowed=ANY) == "edge-1"
    assert check_peer_certificate(origin, expect_role="origin", allowed=ANY) == "origin-1"
    with pytest.raises(PeerRefused, match="has role 'origin', expected role 'edge'"):
        check_peer_certificate(origin, expect_role="edge", allowed=ANY)
    with pytest.raises(PeerRefused, match="has role 'edge', expected role 'origin'"):
        check_peer_certificate(edge, expect_role="origin", allowed=ANY)


def test_the_role_is_checked_before_the_allow_list(test_pki: PkiFiles) -> None:
    """An origin certificate whose identity happens to be allowed is still refused."""
    impostor = der(test_pki.impostor_origin.cert)  # says origin-1, role edge
    with pytest.raises(PeerRefused, match="expected role 'origin'"):
        check_peer_certificate(impostor, expect_role="origin", allowed=frozenset({"origin-1"}))
    origin = der(test_pki.origin.cert)
    with pytest.raises(PeerRefused, match="expected role 'edge'"):
        check_peer_certificate(origin, expect_role="edge", allowed=frozenset({"origin-1"}))


def test_a_certificate_without_a_role_is_refused() -> None:
    with pytest.raises(PeerRefused, match="no role"):
        check_peer_certificate(cn_only_certificate("edge-1"), expect_role="edge", allowed=ANY)


def test_the_allow_list_still_applies(test_pki: PkiFiles) -> None:
    edge2 = der(test_pki.edge2.cert)
    with pytest.raises(PeerRefused, match="'edge-2' is not in allowed_identities"):
        check_peer_certificate(edge2, expect_role="edge", allowed=frozenset({"edge-1"}))
    assert check_peer_certificate(edge2, expect_role="edge", allowed=frozenset({"edge-2"}))


def test_no_certificate_is_refused() -> None:
    with pytest.raises(PeerRefused):
        check_peer_certificate(None, expect_role="edge", allowed=ANY)
