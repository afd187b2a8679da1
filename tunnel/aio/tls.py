"""TLS contexts for the tunnel: TLS 1.3 only, mutual authentication against a
private CA, ECDSA certificates (DESIGN.md: P-256 signs 17x faster than RSA).

The peer's identity comes from its certificate (:func:`tunnel.peer_name.peer_identity`:
the ``geoedge://<role>/<id>`` URI SAN, else the CN), never from anything the
peer says later.
"""

from __future__ import annotations

import ssl
from pathlib import Path


class TunnelTlsError(Exception):
    """A tunnel certificate, key or CA could not be loaded; the message names the
    file (``ssl`` itself raises ``FileNotFoundError`` without a file name)."""


def tunnel_server_context(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    """The origin's listener: requires a client certificate issued by ``ca``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _harden(context)
    _load(context, cert, key, ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def tunnel_client_context(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    """The edge's dialer: presents its certificate, verifies the origin's name."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _harden(context)
    _load(context, cert, key, ca)
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = True
    return context


def _load(context: ssl.SSLContext, cert: Path, key: Path, ca: Path) -> None:
    for path, what in ((cert, "certificate"), (key, "private key"), (ca, "CA certificate")):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise TunnelTlsError(
                f"{path}: cannot read the tunnel {what} ({exc.strerror or exc})"
            ) from exc
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, ValueError) as exc:
        raise TunnelTlsError(f"{cert} / {key}: not a certificate and its key ({exc})") from exc
    try:
        context.load_verify_locations(cafile=str(ca))
    except ssl.SSLError as exc:
        raise TunnelTlsError(f"{ca}: not a PEM CA certificate ({exc})") from exc


def _harden(context: ssl.SSLContext) -> None:
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.options |= ssl.OP_NO_COMPRESSION
    # One tunnel connection lives for hours; tickets would only add key material.
    context.options |= ssl.OP_NO_TICKET
