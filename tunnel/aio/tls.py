"""TLS contexts for the tunnel: TLS 1.3 only, mutual authentication against a
private CA, ECDSA certificates (DESIGN.md: P-256 signs 17x faster than RSA).

The peer's identity comes from its certificate (:func:`tunnel.runtime.pki.peer_identity`:
the ``geoedge://<role>/<id>`` URI SAN, else the CN), never from anything the
peer says later.
"""

from __future__ import annotations

import ssl
from pathlib import Path


def tunnel_server_context(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    """The origin's listener: requires a client certificate issued by ``ca``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _harden(context)
    context.load_cert_chain(cert, key)
    context.load_verify_locations(cafile=str(ca))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def tunnel_client_context(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    """The edge's dialer: presents its certificate, verifies the origin's name."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _harden(context)
    context.load_cert_chain(cert, key)
    context.load_verify_locations(cafile=str(ca))
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = True
    return context


def _harden(context: ssl.SSLContext) -> None:
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.options |= ssl.OP_NO_COMPRESSION
    # One tunnel connection lives for hours; tickets would only add key material.
    context.options |= ssl.OP_NO_TICKET
