"""One tunnel stream of a client connection, and the requests awaiting a response.

:class:`Upstream` is the ``asyncio.Protocol`` of a
:class:`~tunnel.aio.stream.TunnelStream`: it only hands what the stream does to
its :class:`~edge.proxy.ClientConnection`, which owns every decision (a client
connection outlives its streams: Node.js ends idle keep-alive sockets, and the
next request goes on a fresh stream). :class:`PendingRequest` is what the
connection remembers of a request sent up until its response completes: enough
for the access log and for a replay. :func:`stream_metadata` describes the
client connection to the origin (PROTOCOL.md §7).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge.http1 import ResponseReader
from tunnel.aio.stream import TunnelStream
from tunnel.mux import StreamMetadata

if TYPE_CHECKING:
    from edge.proxy import ClientConnection


@dataclass(slots=True)
class PendingRequest:
    """A request sent up whose response has not completed (for logs and replay)."""

    method: str
    path: str
    host: str | None
    request_id: str
    started: float
    replay: bytes | None
    websocket_key: bytes | None
    keep_alive: bool = True
    bytes_in: int = 0
    status: int = 0
    bytes_out: int = 0
    """Octets of its response written to the client transport (queued)."""
    out_start: int = -1
    """Offset of its first response octet in the connection's output; -1 while
    nothing of its response went to the client (so it can still get a 502)."""
    first_byte: float = 0.0
    retried: bool = False
    outcome: str = "ok"
    """How it ended, for the access log (README "Access log")."""
    reason: str = ""
    """Why the edge answered or refused it itself (logs only, never the wire)."""

    @property
    def answered(self) -> bool:
        """Some of its response went to the client: an error can only be a close."""
        return self.out_start >= 0


class Upstream(asyncio.Protocol):
    """The protocol of one tunnel stream; forwards everything to its client."""

    __slots__ = ("client", "origin", "reader", "stream")

    def __init__(self, client: ClientConnection, limits: object) -> None:
        self.client = client
        self.origin: str | None = None
        self.reader = ResponseReader(limits)  # type: ignore[arg-type]
        self.stream: TunnelStream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.stream = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.client._upstream_data(self, data)

    def eof_received(self) -> bool:
        self.client._upstream_eof(self)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._upstream_lost(self, exc)

    def pause_writing(self) -> None:
        self.client._pause_client_reading()

    def resume_writing(self) -> None:
        self.client._resume_client_reading()


def peer_address(value: object) -> tuple[str, int] | None:
    """``(host, port)`` of a ``peername``/``sockname`` extra (None for a Unix socket)."""
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


def stream_metadata(
    transport: asyncio.BaseTransport,
    peer: tuple[str, int] | None,
    local: tuple[str, int] | None,
    edge_id: str,
) -> StreamMetadata:
    """What the origin learns of a client connection: addresses, SNI, ALPN and the
    TLS facts (encoded once per connection; the request fields are appended per
    stream)."""
    ssl_object: ssl.SSLObject | None = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return StreamMetadata(client_address=peer, server_address=local, edge_id=edge_id)
    cipher = ssl_object.cipher()
    return StreamMetadata(
        client_address=peer,
        server_address=local,
        server_name=getattr(ssl_object, "geoedge_server_name", None),
        alpn=ssl_object.selected_alpn_protocol(),
        tls_version=ssl_object.version(),
        tls_cipher=cipher[0] if cipher else None,
        edge_id=edge_id,
        tls_resumed=ssl_object.session_reused,
    )
