"""Who a tunnel peer certificate says it is: its ``geoedge://<role>/<identity>``
URI SAN, else its common name.

Both ends of a tunnel read this name (the origin to label an edge, the edge to
check that it dialled an origin, ``tunnel.aio.transport``); ``geoedge.pki``
writes it when it issues a peer certificate. The reader belongs to the tunnel,
the writer to the tooling, and the scheme below is the one thing they share.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cryptography import x509
from cryptography.x509.oid import NameOID

__all__ = [
    "IDENTITY_RE",
    "PEER_ROLES",
    "PEER_URI_SCHEME",
    "PeerName",
    "PeerRole",
    "extension_value",
    "parse_peer_name",
    "peer_identity",
]

#: URI SAN scheme of tunnel peer certificates: ``geoedge://<role>/<identity>``.
PEER_URI_SCHEME = "geoedge"

PeerRole = Literal["edge", "origin"]
PEER_ROLES: tuple[str, ...] = ("edge", "origin")

#: An identity is one DNS-label-like token: it appears in logs, metrics labels and URIs.
IDENTITY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True, slots=True)
class PeerName:
    """Who a tunnel peer certificate says it is.

    ``role`` is ``None`` when the identity came from the CN fallback (a
    certificate not issued by ``geoedge.pki.issue_peer_cert``).
    """

    identity: str
    role: str | None


def parse_peer_name(cert: bytes | x509.Certificate | Mapping[str, Any]) -> PeerName | None:
    """Who a peer certificate names: its ``geoedge://`` URI SAN, else its CN.

    ``cert`` is the DER from ``SSLObject.getpeercert(binary_form=True)`` (the
    robust input: the dict form is empty unless the certificate was
    verified), a parsed certificate, or the dict from ``getpeercert()``.
    """
    if isinstance(cert, Mapping):
        return _peer_name_from_dict(cert)
    if isinstance(cert, bytes | bytearray | memoryview):
        try:
            cert = x509.load_der_x509_certificate(bytes(cert))
        except ValueError:
            return None
    for uri in _uri_sans(cert):
        name = _peer_name_from_uri(uri)
        if name is not None:
            return name
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if cns and isinstance(cns[0].value, str) and cns[0].value:
        return PeerName(identity=cns[0].value, role=None)
    return None


def peer_identity(cert: bytes | x509.Certificate | Mapping[str, Any] | None) -> str | None:
    """The identity of a tunnel peer (``tokyo-1``), or ``None`` if it names none."""
    if cert is None:
        return None
    name = parse_peer_name(cert)
    return None if name is None else name.identity


def extension_value(cert: x509.Certificate, ext_type: type[Any]) -> Any:
    """The value of one extension of ``cert``, or ``None`` if it has none."""
    try:
        return cert.extensions.get_extension_for_class(ext_type).value
    except x509.ExtensionNotFound:
        return None


def _uri_sans(cert: x509.Certificate) -> list[str]:
    san = extension_value(cert, x509.SubjectAlternativeName)
    return [] if san is None else san.get_values_for_type(x509.UniformResourceIdentifier)


def _peer_name_from_uri(uri: str) -> PeerName | None:
    prefix = f"{PEER_URI_SCHEME}://"
    if not uri.startswith(prefix):
        return None
    role, sep, identity = uri[len(prefix) :].partition("/")
    if not sep or role not in PEER_ROLES or not IDENTITY_RE.match(identity):
        return None
    return PeerName(identity=identity, role=role)


def _peer_name_from_dict(cert: Mapping[str, Any]) -> PeerName | None:
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "URI":
            name = _peer_name_from_uri(value)
            if name is not None:
                return name
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return PeerName(identity=value, role=None)
    return None
