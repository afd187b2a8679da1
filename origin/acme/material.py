"""What the origin makes for one issuance: the certificate's key and CSR, and
what each challenge type needs the edges (or DNS) to show.

- HTTP-01 (RFC 8555 §8.3): the key authorization, served by every edge.
- TLS-ALPN-01 (RFC 8737 §3): a self-signed certificate for the one name with
  the critical ``id-pe-acmeIdentifier`` extension holding SHA-256 of the key
  authorization, served by every edge to clients offering ``acme-tls/1``.
  certbot's ``acme`` package dropped its TLS-ALPN-01 classes; the two below
  register the challenge with it so its orders parse it.
- DNS-01 (RFC 8555 §8.4): the TXT value at ``_acme-challenge.<name>``.

Pure functions of their inputs (keys are made here, with ``cryptography``).
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

from acme import challenges
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID, ObjectIdentifier
from josepy.jwk import JWK

from origin.acme.config import KeyType

__all__ = [
    "ACME_IDENTIFIER_OID",
    "TLSALPN01",
    "TLSALPN01Response",
    "make_csr",
    "make_key",
    "private_key_pem",
    "tls_alpn_certificate",
]

#: RFC 8737 §6.1: id-pe-acmeIdentifier.
ACME_IDENTIFIER_OID = ObjectIdentifier("1.3.6.1.5.5.7.1.31")

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@challenges.ChallengeResponse.register
class TLSALPN01Response(challenges.KeyAuthorizationChallengeResponse):
    """ACME tls-alpn-01 challenge response (an empty object on the wire)."""

    typ = "tls-alpn-01"


@challenges.Challenge.register
class TLSALPN01(challenges.KeyAuthorizationChallenge):
    """ACME tls-alpn-01 challenge (RFC 8737)."""

    response_cls = TLSALPN01Response
    typ = response_cls.typ

    def validation(self, account_key: JWK, **kwargs: Any) -> str:
        return self.key_authorization(account_key)


def make_key(key_type: KeyType) -> PrivateKey:
    if key_type == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "ecdsa-p384":
        return ec.generate_private_key(ec.SECP384R1())
    return rsa.generate_private_key(65537, 2048 if key_type == "rsa-2048" else 4096)


def private_key_pem(key: PrivateKey) -> str:
    """PKCS#8 PEM, unencrypted (the files holding it are 0600)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def make_csr(key: PrivateKey, domains: tuple[str, ...]) -> bytes:
    """A PEM CSR for ``domains`` (all as SANs; the first also as CN)."""
    builder = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, domains[0])]))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(d) for d in domains]), critical=False
        )
    )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def tls_alpn_certificate(
    domain: str, key_authorization: str, now: datetime.datetime
) -> tuple[str, str]:
    """RFC 8737 §3's challenge certificate for ``domain``: (certificate PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    digest = hashlib.sha256(key_authorization.encode()).digest()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, domain)])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(domain)]), critical=False)
        # The extension's value is the DER OCTET STRING of the digest (§3).
        .add_extension(
            x509.UnrecognizedExtension(ACME_IDENTIFIER_OID, b"\x04\x20" + digest), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode()
    return pem, private_key_pem(key)
