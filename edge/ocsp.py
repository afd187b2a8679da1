"""OCSP stapling from response files: which response goes with which certificate,
and whether it may still be stapled.

The edge does not fetch OCSP responses itself (nor does HAProxy: its
``ocsp-update`` came late and is optional; nginx's ``ssl_stapling_file`` is
the same model). An operator fetches the response next to the certificate
(``openssl ocsp -issuer chain.pem -cert cert.pem -url "$(openssl x509 -noout
-ocsp_uri -in cert.pem)" -respout cert.ocsp``), names it in
``[[tls.certificates]] ocsp_response``, and sends SIGHUP after each refresh.

A file is checked when it is loaded (start, SIGHUP): it must be a DER OCSP
response with status ``successful`` whose single response is for this
certificate's serial number (and, when the chain holds the issuer, for this
issuer). A bad file is an error naming it, and a reload that meets one keeps
everything as it was. A response is stapled only inside its validity window
(``thisUpdate`` to ``nextUpdate``): a stale staple would make a must-staple
certificate fail in browsers, no staple only makes them ask the CA.

The stapling itself is :class:`edge.openssl.StatusCallback`; this module is
pure data and decisions (time is a parameter).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509 import ocsp

from geoedge.ocsp_ids import names_issuer

log = logging.getLogger("geoedge.edge.tls")

__all__ = ["OcspError", "OcspStaple", "StapleTable", "load_staple"]


class OcspError(ValueError):
    """An OCSP response file that cannot be stapled; the message names the file."""


@dataclass(frozen=True, slots=True)
class OcspStaple:
    """One loaded response: its DER and when it may be stapled."""

    path: Path
    der: bytes
    status: str
    """``good``, ``revoked`` or ``unknown`` (stapled whatever it says)."""
    this_update: float
    next_update: float | None
    """Unix times; no nextUpdate means "newer information is always available"
    (RFC 6960 §4.2.2.1): stapled until replaced."""

    def valid_at(self, now: float) -> bool:
        return self.this_update <= now and (self.next_update is None or now < self.next_update)


def load_staple(path: Path, cert_path: Path) -> OcspStaple:
    """Load ``path`` as the OCSP response for the leaf of ``cert_path``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OcspError(f"{path}: {exc.strerror or exc}") from exc
    try:
        response = ocsp.load_der_ocsp_response(data)
    except ValueError as exc:
        raise OcspError(f"{path}: not a DER OCSP response ({exc})") from exc
    if response.response_status != ocsp.OCSPResponseStatus.SUCCESSFUL:
        raise OcspError(f"{path}: OCSP response status is {response.response_status.name}")
    chain = _load_chain(cert_path)
    leaf = chain[0]
    single = next(iter(response.responses), None)
    if single is None or single.serial_number != leaf.serial_number:
        raise OcspError(
            f"{path}: the response is not for {cert_path} (serial {leaf.serial_number:x})"
        )
    if len(chain) > 1 and not names_issuer(single, chain[1]):
        raise OcspError(f"{path}: the response is for another issuer than {cert_path}'s")
    next_update = single.next_update_utc
    return OcspStaple(
        path=path,
        der=data,
        status=single.certificate_status.name.lower(),
        this_update=single.this_update_utc.timestamp(),
        next_update=next_update.timestamp() if next_update is not None else None,
    )


def _load_chain(cert_path: Path) -> list[x509.Certificate]:
    try:
        chain = x509.load_pem_x509_certificates(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise OcspError(f"{cert_path}: cannot read the certificate ({exc})") from exc
    return chain


class StapleTable:
    """Responses by certificate DER; :meth:`lookup` is the status callback's question."""

    def __init__(self) -> None:
        self._by_certificate: dict[bytes, OcspStaple] = {}
        self._warned: set[Path] = set()

    def replace(self, staples: Mapping[bytes, OcspStaple]) -> None:
        self._by_certificate = dict(staples)
        self._warned.clear()

    def __len__(self) -> int:
        return len(self._by_certificate)

    def items(self) -> list[tuple[bytes, OcspStaple]]:
        return list(self._by_certificate.items())

    def lookup(self, certificate_der: bytes, now: float | None = None) -> bytes | None:
        staple = self._by_certificate.get(certificate_der)
        if staple is None:
            return None
        if staple.valid_at(time.time() if now is None else now):
            return staple.der
        if staple.path not in self._warned:
            self._warned.add(staple.path)
            log.warning("OCSP response %s is outside its validity window: not stapled", staple.path)
        return None


def leaf_der(cert_path: Path) -> bytes:
    """The DER of the first certificate of a PEM chain (what OpenSSL serves)."""
    return _load_chain(cert_path)[0].public_bytes(serialization.Encoding.DER)
