"""OCSP responses for the certificates the origin issues, fetched once by the
origin and stapled by every edge (the edge's stapling: :mod:`edge.ocsp`).

Where this matters, and where it does not: OCSP is optional for publicly
trusted CAs since 2023 (CA/Browser Forum ballot SC063), and Let's Encrypt
ended it in 2025 (no OCSP URL in certificates since 7 May, responders off
since 6 August): their certificates name no responder, so nothing is
fetched and nothing is stapled, and that is correct. CAs that still name a
responder in their certificates (the leaf's Authority Information Access)
get their responses stapled, so clients need not ask the CA themselves.

- The request (RFC 6960, with RFC 5019's profile: SHA-1 CertID, one
  certificate, POST) names the leaf and its issuer, the chain's second
  certificate.
- A response is kept only when it is ``successful``, about this serial and
  issuer, signed by the issuer (or by a responder certificate the issuer
  signed for OCSP signing, RFC 6960 §4.2.2.2), current, and ``good``. A
  ``revoked`` answer is not stapled: the certificate must be replaced, and
  the manager renews it at once. ``unknown`` (a CA that has not yet
  published a new certificate) is tried again later.
- Refreshed halfway through its validity (thisUpdate to nextUpdate), as
  certbot and Caddy do; a response without nextUpdate every 12 hours.

Pure functions but :func:`fetch` (time is a parameter).
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509 import ocsp
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID

from geoedge.ocsp_ids import identifies_responder, names_issuer

__all__ = [
    "OcspAnswer",
    "OcspError",
    "check_response",
    "fetch",
    "refresh_at",
    "request_der",
    "responder_url",
]

#: When a response carries no nextUpdate: ask again after this long.
NO_NEXT_UPDATE_REFRESH_S = 12 * 3600.0
#: The largest response accepted (a response with its responder's chain is ~2-4 KiB).
MAX_RESPONSE_BYTES = 64 * 1024


class OcspError(Exception):
    """No usable OCSP response; the message says why."""


@dataclass(frozen=True, slots=True)
class OcspAnswer:
    """A checked response: its DER and validity (Unix times)."""

    der: bytes
    status: str
    """``good``, ``revoked`` or ``unknown``."""
    this_update: float
    next_update: float | None

    def valid_at(self, now: float) -> bool:
        return self.this_update <= now and (self.next_update is None or now < self.next_update)


def _chain(chain_pem: str) -> tuple[x509.Certificate, x509.Certificate]:
    certificates = x509.load_pem_x509_certificates(chain_pem.encode())
    if len(certificates) < 2:
        raise OcspError("the chain holds no issuer certificate")
    return certificates[0], certificates[1]


def responder_url(chain_pem: str) -> str | None:
    """The leaf's OCSP responder (Authority Information Access), or None."""
    leaf = x509.load_pem_x509_certificate(chain_pem.encode())
    try:
        aia = leaf.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
    except x509.ExtensionNotFound:
        return None
    for description in aia:
        location = description.access_location
        if description.access_method == AuthorityInformationAccessOID.OCSP and isinstance(
            location, x509.UniformResourceIdentifier
        ):
            return str(location.value)
    return None


def request_der(chain_pem: str) -> bytes:
    """The DER OCSP request for the chain's leaf."""
    leaf, issuer = _chain(chain_pem)
    builder = ocsp.OCSPRequestBuilder().add_certificate(leaf, issuer, hashes.SHA1())
    return builder.build().public_bytes(Encoding.DER)


def check_response(der: bytes, chain_pem: str, now: float) -> OcspAnswer:
    """``der`` checked as the response for the chain's leaf (see the module
    docstring); :class:`OcspError` otherwise."""
    leaf, issuer = _chain(chain_pem)
    try:
        response = ocsp.load_der_ocsp_response(der)
    except ValueError as exc:
        raise OcspError(f"not a DER OCSP response ({exc})") from None
    if response.response_status != ocsp.OCSPResponseStatus.SUCCESSFUL:
        raise OcspError(f"the responder answered {response.response_status.name}")
    single = next((s for s in response.responses if s.serial_number == leaf.serial_number), None)
    if single is None or not names_issuer(single, issuer):
        raise OcspError(f"the response is not about serial {leaf.serial_number:x} of this issuer")
    _check_signature(response, issuer)
    this_update = single.this_update_utc.timestamp()
    next_update = None if single.next_update_utc is None else single.next_update_utc.timestamp()
    if this_update > now + 300 or (next_update is not None and next_update <= now):
        raise OcspError("the response is not current")
    return OcspAnswer(der, single.certificate_status.name.lower(), this_update, next_update)


def refresh_at(answer: OcspAnswer, now: float) -> float:
    """When to fetch the next response: halfway through this one's validity."""
    if answer.next_update is None:
        return now + NO_NEXT_UPDATE_REFRESH_S
    return max(now + 60.0, answer.this_update + (answer.next_update - answer.this_update) / 2)


def _check_signature(response: ocsp.OCSPResponse, issuer: x509.Certificate) -> None:
    """Signed by the issuer, or by a certificate the issuer signed for OCSP signing
    that the response carries (RFC 6960 §4.2.2.2)."""
    if identifies_responder(response, issuer):
        _verify(issuer, response.signature, response.tbs_response_bytes, response)
        return
    delegated = [c for c in response.certificates if identifies_responder(response, c)]
    if not delegated:
        raise OcspError("the response is signed by neither the issuer nor its responder")
    responder = delegated[0]
    try:
        usages = responder.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usages = None
    if usages is None or ExtendedKeyUsageOID.OCSP_SIGNING not in usages:
        raise OcspError("the responder's certificate is not for OCSP signing")
    _verify(issuer, responder.signature, responder.tbs_certificate_bytes, responder)
    _verify(responder, response.signature, response.tbs_response_bytes, response)


def _verify(
    signer: x509.Certificate,
    signature: bytes,
    data: bytes,
    signed: x509.Certificate | ocsp.OCSPResponse,
) -> None:
    key = signer.public_key()
    algorithm = signed.signature_hash_algorithm
    try:
        if isinstance(key, ec.EllipticCurvePublicKey) and algorithm is not None:
            key.verify(signature, data, ec.ECDSA(algorithm))
        elif isinstance(key, rsa.RSAPublicKey) and algorithm is not None:
            key.verify(signature, data, padding.PKCS1v15(), algorithm)
        else:
            raise OcspError("the response's signature algorithm is not supported")
    except InvalidSignature:
        raise OcspError("the response's signature does not verify") from None


async def fetch(url: str, request: bytes, timeout_s: float) -> bytes:
    """POST ``request`` to the responder at ``url``; the DER response."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.post(
                url, data=request, headers={"Content-Type": "application/ocsp-request"}
            ) as response,
        ):
            if response.status != 200:
                raise OcspError(f"{url}: HTTP {response.status}")
            body = await response.content.read(MAX_RESPONSE_BYTES + 1)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise OcspError(f"{url}: {type(exc).__name__} {exc}") from None
    if len(body) > MAX_RESPONSE_BYTES:
        raise OcspError(f"{url}: a response over {MAX_RESPONSE_BYTES} octets")
    return body
