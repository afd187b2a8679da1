"""The pieces of the RFC 6455 opening handshake a proxy has to check.

The edge does not speak WebSocket: it checks that the request is a real
handshake (so an ``Upgrade`` header cannot smuggle a tunnel for anything
else), and that the backend's 101 answers *this* request's key (so a
confused backend cannot switch the client's connection to raw bytes).
"""

from __future__ import annotations

import base64
import hashlib
import re

from edge.http1.syntax import split_tokens

WEBSOCKET_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
"""RFC 6455 §1.3."""

_KEY_RE = re.compile(rb"[A-Za-z0-9+/]{22}==")
"""base64 of exactly 16 bytes is 22 symbols and ``==`` (RFC 6455 §4.1, item 7)."""


def websocket_accept(key: bytes) -> bytes:
    """The ``Sec-WebSocket-Accept`` value that answers ``key`` (RFC 6455 §4.2.2 item 5.4)."""
    return base64.b64encode(hashlib.sha1(key + WEBSOCKET_GUID).digest())


def is_valid_key(key: bytes) -> bool:
    """``Sec-WebSocket-Key`` is base64 of 16 bytes (any 16 bytes, padding bits included)."""
    return _KEY_RE.fullmatch(key) is not None


def accepts_handshake(headers: list[tuple[bytes, bytes]], key: bytes) -> bool:
    """Does a 101 response's header list complete the handshake for ``key``?

    RFC 6455 §4.1 (client side, items 2-4): ``Upgrade`` contains ``websocket``,
    ``Connection`` contains ``upgrade`` and there is exactly one
    ``Sec-WebSocket-Accept`` equal to :func:`websocket_accept` of the key.
    ``headers`` have lowercased names and OWS-stripped values.
    """
    upgrade: list[bytes] = []
    connection: list[bytes] = []
    accepts: list[bytes] = []
    for name, value in headers:
        if name == b"upgrade":
            upgrade.append(value)
        elif name == b"connection":
            connection.append(value)
        elif name == b"sec-websocket-accept":
            accepts.append(value)
    return (
        b"websocket" in split_tokens(upgrade)
        and b"upgrade" in split_tokens(connection)
        and accepts == [websocket_accept(key)]
    )
