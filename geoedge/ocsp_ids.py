"""How OCSP names certificates (RFC 6960 §4.1.1 CertID, §4.2.2.3
ResponderID): hashes of an issuer's subject and of its public key's BIT
STRING contents. Shared by the edge (checking response files it staples)
and the origin (checking the responses it fetches for ACME certificates).
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509 import ocsp

__all__ = ["identifies_responder", "key_bits", "names_issuer"]


def key_bits(certificate: x509.Certificate) -> bytes | None:
    """The contents of the certificate's subjectPublicKey BIT STRING (ECDSA
    and RSA keys), or None for other key types."""
    key = certificate.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        return key.public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
    if isinstance(key, rsa.RSAPublicKey):
        return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
    return None


def names_issuer(single: ocsp.OCSPSingleResponse, issuer: x509.Certificate) -> bool:
    """The response's CertID names ``issuer`` (other key types: True, the
    serial number check stands alone)."""
    bits = key_bits(issuer)
    if bits is None:
        return True
    algorithm = single.hash_algorithm
    name_hash = hashes.Hash(algorithm)
    name_hash.update(issuer.subject.public_bytes())
    key_hash = hashes.Hash(algorithm)
    key_hash.update(bits)
    return (
        name_hash.finalize() == single.issuer_name_hash
        and key_hash.finalize() == single.issuer_key_hash
    )


def identifies_responder(response: ocsp.OCSPResponse, certificate: x509.Certificate) -> bool:
    """The response's ResponderID (by name, or by SHA-1 of the key) is ``certificate``."""
    if response.responder_name is not None:
        return response.responder_name == certificate.subject
    bits = key_bits(certificate)
    if bits is None or response.responder_key_hash is None:
        return False
    digest = hashes.Hash(hashes.SHA1())
    digest.update(bits)
    return digest.finalize() == response.responder_key_hash
