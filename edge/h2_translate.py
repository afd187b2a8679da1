"""HTTP/2 requests to HTTP/1.1 octets and HTTP/1.1 response heads to HTTP/2 fields (pure).

Why translate a request into HTTP/1.1 octets and read it back: every rule the
edge applies to a request (framing, Host, forwarding fields, trust, request
id, WebSocket handshakes, limits) lives in :mod:`edge.http1`, with its tests
and its fuzzers. An HTTP/2 request written as an HTTP/1.1 head and fed to the
same :class:`edge.http1.RequestReader` goes through all of them, and what
reaches Node.js is exactly what an HTTP/1.1 client's request would become.
:mod:`edge.h2_fields` has already refused what HTTP/2 forbids (RFC 9113
§8.2: no CR, LF or NUL in a field, lowercase names, no connection-specific
fields, valid pseudo-header sets), so the head written here is well formed.

- ``:authority`` becomes ``Host`` (a ``host`` field beside it is dropped:
  RFC 9113 §8.3.1 makes them the same; without ``:authority`` the ``host``
  field is the request's ``Host``); ``:method`` and ``:path`` the request
  line; ``cookie`` fields are joined with ``"; "`` (§8.2.3).
- A request with a body and no ``content-length`` is sent up chunked (the
  front end chunk-frames its DATA, and puts its trailers, if any, in the last
  chunk, where the HTTP/1.1 reader's trailer rules apply); after a body with
  a ``content-length`` HTTP/1.1 cannot carry trailers, and they are dropped.
- Extended CONNECT with ``:protocol websocket`` (RFC 8441) becomes an
  HTTP/1.1 WebSocket handshake with a key of the edge's own; the backend's
  101 becomes a ``200``.
- Response heads lose the fields HTTP/2 forbids (``connection``,
  ``keep-alive``, ``proxy-connection``, ``transfer-encoding``, ``upgrade``)
  and, for a WebSocket, the handshake's own.
"""

from __future__ import annotations

import base64
import os

from edge.h2_fields import CONNECTION_SPECIFIC
from edge.http1.events import Headers

__all__ = ["H2Request", "response_fields", "response_trailers", "translate_request"]

_RESPONSE_DROPPED = CONNECTION_SPECIFIC | {b"te"}
_WEBSOCKET_DROPPED = _RESPONSE_DROPPED | {b"sec-websocket-accept"}
_REQUEST_DROPPED = _RESPONSE_DROPPED | {
    b"host", b"cookie", b"sec-websocket-key", b"sec-websocket-version"
}  # fmt: skip
_COLON = ord(":")


class H2Request:
    """What :func:`translate_request` makes of an HTTP/2 request (read-only
    by convention; one per request, a typed class in the compiled build)."""

    __slots__ = ("chunked", "head", "websocket")

    def __init__(self, head: bytes, chunked: bool, websocket: bool) -> None:
        self.head = head  # an HTTP/1.1 request head, to feed to a RequestReader
        self.chunked = chunked  # the body is to be chunk-framed (no content-length, a body follows)
        self.websocket = websocket  # an RFC 8441 WebSocket: answer the backend's 101 with 200


def translate_request(
    headers: list[tuple[bytes, bytes]], *, ends_stream: bool, key: bytes | None = None
) -> H2Request:
    """The HTTP/1.1 form of an HTTP/2 request's fields (see the module docstring).
    ``ends_stream``: the HEADERS frame ended the stream (no body). ``key``: the
    WebSocket key to use (a random one by default)."""
    pseudo: dict[bytes, bytes] = {}
    fields: list[tuple[bytes, bytes]] = []
    cookies: list[bytes] = []
    has_length = False
    host: bytes | None = None
    for name, value in headers:
        if name and name[0] == _COLON:
            pseudo[name] = value
        elif name == b"cookie":
            cookies.append(value)
        elif name not in _REQUEST_DROPPED:
            if name == b"content-length":
                if has_length:
                    continue  # the same number again (edge.h2_fields): one line says it
                has_length = True
            fields.append((name, value))
        elif name == b"host":
            host = value
    method = pseudo.get(b":method", b"")
    authority = pseudo.get(b":authority", host)
    websocket = method == b"CONNECT" and pseudo.get(b":protocol") == b"websocket"
    if websocket:
        line = b"GET " + pseudo.get(b":path", b"/") + b" HTTP/1.1"
    elif method == b"CONNECT":
        line = b"CONNECT " + (authority or b"") + b" HTTP/1.1"  # the reader answers 501
    else:
        line = method + b" " + pseudo.get(b":path", b"") + b" HTTP/1.1"
    out = [line]
    if authority is not None:
        out.append(b"host: " + authority)
    if cookies:
        out.append(b"cookie: " + b"; ".join(cookies))
    out += [name + b": " + value for name, value in fields]
    chunked = False
    if websocket:
        key = key or base64.b64encode(os.urandom(16))
        out += [
            b"upgrade: websocket",
            b"connection: Upgrade",
            b"sec-websocket-key: " + key,
            b"sec-websocket-version: 13",
        ]
    elif not ends_stream and not has_length:
        out.append(b"transfer-encoding: chunked")
        chunked = True
    return H2Request(b"\r\n".join(out) + b"\r\n\r\n", chunked, websocket)


def response_trailers(trailers: Headers) -> list[tuple[bytes, bytes]]:
    """HTTP/2 trailer fields of a chunked response's trailer section: without
    the connection-specific fields HTTP/2 forbids, nor a ``content-length``
    (RFC 9110 §6.5.1: no framing fields in trailers)."""
    return [
        (name, value)
        for name, value in trailers
        if name not in _RESPONSE_DROPPED and name != b"content-length"
    ]


def response_fields(
    status: int,
    headers: Headers,
    *,
    websocket: bool = False,
    extra: bytes | None = None,
    nominated: frozenset[bytes] = frozenset(),
) -> list[tuple[bytes, bytes]]:
    """HTTP/2 fields of a response head: ``:status`` first, then the backend's
    fields HTTP/2 allows but those its ``Connection`` named (``nominated``),
    then ``extra`` (``b"Name: value"``, e.g. HSTS)."""
    dropped = _WEBSOCKET_DROPPED if websocket else _RESPONSE_DROPPED
    if nominated:
        dropped = dropped | nominated
    fields = [(b":status", b"200" if websocket and status == 101 else b"%d" % status)]
    if extra is not None:
        name, _, value = extra.partition(b":")
        fields.append((name.strip().lower(), value.strip()))
    fields += [(name, value) for name, value in headers if name not in dropped]
    return fields
