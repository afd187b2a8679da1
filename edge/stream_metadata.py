"""What the origin learns of a client connection (PROTOCOL.md §6.2), encoded once.

Every request of a connection opens its own stream (§6.7), and each stream's
OPEN repeats the connection's items (addresses, SNI, ALPN, TLS facts, edge
id); encoding them once per connection and appending the request's own items
(:func:`tunnel.mux.metadata.encode_request_fields`) keeps that off the
per-request path.
"""

from __future__ import annotations

import asyncio

from tunnel.mux import StreamMetadata

__all__ = ["connection_metadata", "peer_address"]


def peer_address(value: object) -> tuple[str, int] | None:
    """``(host, port)`` of a ``peername``/``sockname`` extra (None for a Unix socket)."""
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


def connection_metadata(
    transport: asyncio.BaseTransport,
    peer: tuple[str, int] | None,
    local: tuple[str, int] | None,
    edge_id: str,
    *,
    alpn: str | None = None,
) -> bytes:
    """The encoded metadata items of a client connection: addresses, SNI, ALPN
    and TLS facts (``alpn`` overrides what the TLS object says)."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        metadata = StreamMetadata(
            client_address=peer, server_address=local, edge_id=edge_id, alpn=alpn
        )
        return metadata.encode()
    cipher = ssl_object.cipher()
    return StreamMetadata(
        client_address=peer,
        server_address=local,
        server_name=getattr(ssl_object, "geoedge_server_name", None),
        alpn=alpn or ssl_object.selected_alpn_protocol(),
        tls_version=ssl_object.version(),
        tls_cipher=cipher[0] if cipher else None,
        edge_id=edge_id,
        tls_resumed=ssl_object.session_reused,
    ).encode()
