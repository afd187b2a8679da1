"""From a parsed request head to the validated, rewritten head the edge forwards.

The rules, and why (each has a test in ``tests/unit/test_http1_request.py``):

Framing is normalised, never passed through. ``Content-Length`` and
``Transfer-Encoding`` are dropped from the client's head and re-emitted in
canonical form, so the backend sees exactly one unambiguous framing:

- both present → 400 (llhttp rejects it first); several ``Content-Length``
  fields → 400 *even when equal*: RFC 9110 §8.6 lets a recipient merge
  identical duplicates, but a proxy that merges while another hop does not is
  how smuggling starts (HAProxy and nginx reject too);
- ``Content-Length`` must be 1-18 ASCII digits after OWS removal
  (:func:`~edge.http1.syntax.parse_decimal`; ``+5``, ``1_0``, ``1 0`` → 400);
- ``Transfer-Encoding`` must be exactly ``chunked``: ``gzip, chunked`` → 501
  (a coding we do not implement, RFC 9112 §6.1), ``chunked, gzip`` or
  ``xchunked`` → 400 (chunked not final, RFC 9112 §6.3), twice → 400;
  any ``Transfer-Encoding`` in an HTTP/1.0 request → 400 (RFC 9112 §6.1).

Target: origin-form, without a fragment; ``*`` only with OPTIONS; absolute-form only for ``http``
or ``https`` with an authority equal (ASCII case-insensitively) to the Host
field, and then rewritten to origin-form (we have no notion of "other" hosts
to proxy to, so a mismatch is a confused or malicious client → 400). CONNECT
→ 501. Host: exactly one in HTTP/1.1 (RFC 9112 §3.2), syntactically valid.

Hop-by-hop fields are dropped: ``Connection`` and the fields it nominates
(except Host and the forwarding fields, which a client must not be able to
delete: the "hop-by-hop abuse" attack), ``Keep-Alive``,
``Proxy-Connection``, ``TE``, ``Trailer`` (a chunked body's trailer
fields go on as :func:`forwardable_trailers` says), ``HTTP2-Settings`` and ``Upgrade`` (so
``Upgrade: h2c`` never reaches the backend) unless the request is a valid
WebSocket handshake. Persistence towards the backend: an HTTP/1.1 request
always goes up keep-alive, even when the client asked to close (the edge
closes the client's connection itself, and rewrites that response head to
say so: :func:`edge.http1.response.closing_head`), so that the origin may keep
the backend connection for another stream (PROTOCOL.md §9, ``IDLE``). An
HTTP/1.0 request mirrors the client (``Connection: keep-alive`` only when it
asked), because the response travels back raw and a 1.0 client cannot read a
chunked one. A WebSocket handshake forwards ``Connection: Upgrade`` and
``Upgrade: websocket``.

Underscore spellings of every field above (``X_Forwarded_For``,
``Content_Length``, ``Transfer_Encoding``...) are dropped: some frameworks
read ``_`` as ``-``, so one would pass as the real field behind our checks
(nginx drops every field with an underscore by default).

Forwarding fields (DESIGN principle 8): untrusted peers lose every
``X-Forwarded-For``, ``X-Real-IP``, ``Forwarded``, ``X-Forwarded-Proto``,
``-Host``, ``-Port`` and ``X-Request-Id`` they sent; the edge sets them from
the real client address. A trusted proxy's ``X-Forwarded-For`` and
``Forwarded`` are appended to, its other forwarding fields and a well-formed
``X-Request-Id`` are kept.

Trace context (W3C): ``traceparent`` and ``tracestate`` are kept from a
trusted hop when well formed; otherwise the edge starts a trace with a
``traceparent`` of its own (sampled), and drops the client's.

A WebSocket handshake (``Upgrade`` listing ``websocket`` and ``Connection``
listing ``upgrade``) must be complete and valid (GET, HTTP/1.1, version 13, a
key of 16 bytes, no body) or it is rejected with 400 (RFC 6455 §4.2.1).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from edge.http1.errors import Http1UsageError, MessageRejected
from edge.http1.events import Headers, RequestHeadReceived, WebSocketUpgrade
from edge.http1.head import HeadParser
from edge.http1.limits import ClientContext
from edge.http1.syntax import (
    HOST_RE,
    MAX_CONTENT_LENGTH_DIGITS,
    REQUEST_ID_RE,
    TOKEN_RE,
    parse_decimal,
    split_tokens,
)
from edge.http1.websocket import is_valid_key

IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"TRACE"})
"""RFC 9110 §9.2.2."""

(
    _HOST,
    _CONTENT_LENGTH,
    _TRANSFER_ENCODING,
    _CONNECTION,
    _UPGRADE,
    _HOP_BY_HOP,
    _X_FORWARDED_FOR,
    _FORWARDED,
    _FORWARDING_KEPT_IF_TRUSTED,
    _REQUEST_ID,
    _WS_KEY,
    _WS_VERSION,
    _TRACE,
) = range(13)

_KINDS = {
    b"host": _HOST,
    b"content-length": _CONTENT_LENGTH,
    b"transfer-encoding": _TRANSFER_ENCODING,
    b"connection": _CONNECTION,
    b"upgrade": _UPGRADE,
    b"keep-alive": _HOP_BY_HOP,
    b"proxy-connection": _HOP_BY_HOP,
    b"te": _HOP_BY_HOP,
    b"trailer": _HOP_BY_HOP,
    b"http2-settings": _HOP_BY_HOP,
    b"x-forwarded-for": _X_FORWARDED_FOR,
    b"forwarded": _FORWARDED,
    b"x-real-ip": _FORWARDING_KEPT_IF_TRUSTED,
    b"x-forwarded-proto": _FORWARDING_KEPT_IF_TRUSTED,
    b"x-forwarded-host": _FORWARDING_KEPT_IF_TRUSTED,
    b"x-forwarded-port": _FORWARDING_KEPT_IF_TRUSTED,
    b"x-request-id": _REQUEST_ID,
    b"traceparent": _TRACE,
    b"tracestate": _TRACE,
    b"sec-websocket-key": _WS_KEY,
    b"sec-websocket-version": _WS_VERSION,
}

_UNNOMINATABLE = frozenset(
    {b"host", b"x-real-ip", b"x-forwarded-proto", b"x-forwarded-host", b"x-forwarded-port"}
)
"""Fields ``Connection`` may not delete (the others it could name are ours anyway)."""

EDGE_SET_FIELDS = frozenset({
    b"connection", b"upgrade", b"transfer-encoding", b"content-length",
    b"x-forwarded-for", b"forwarded", b"x-real-ip", b"x-forwarded-proto",
    b"x-forwarded-host", b"x-forwarded-port", b"x-request-id", b"traceparent", b"tracestate",
})  # fmt: skip
"""The fields of a forwarded head that the edge sets, or keeps only from a
trusted hop: never among a request's ``client_fields``, except the forwarding
fields a trusted proxy sent."""

_CONNECTION_OPTIONS = frozenset({b"close", b"keep-alive", b"upgrade"})

_TRAILERS_DROPPED = frozenset(_KINDS) | {
    # RFC 9110 §6.5.1: what a recipient must not take from a trailer section:
    # authentication, request modifiers (controls, conditionals, range) and
    # content metadata.
    b"authorization", b"proxy-authorization", b"cookie",
    b"cache-control", b"expect", b"max-forwards", b"pragma", b"range",
    b"if-match", b"if-none-match", b"if-modified-since", b"if-unmodified-since", b"if-range",
    b"content-encoding", b"content-type", b"content-range", b"content-language",
    b"content-location",
}  # fmt: skip
"""Besides these, every field the head rules police (:data:`_KINDS`). What a
trailer is for passes: checksums and digests (``Content-Digest``, RFC 9530),
timings, application fields."""

_ABSOLUTE_FORM_RE = re.compile(rb"([A-Za-z][A-Za-z0-9+.\-]*)://([^/?#]*)(.*)", re.S)
#: Octets as ints: ``int in bytes`` is one memchr, ``bytes in bytes`` a
#: general substring search (20 against 220 ns for a field name).
_UNDERSCORE, _HASH = b"_#"

Field = tuple[bytes, bytes, bytes]  # (name as sent, lowercased name, value)


class ForwardingIdentity:
    """The client's facts, encoded once per connection for the forwarding fields."""

    __slots__ = ("forwarded_for", "ip", "port", "scheme", "trusted")

    def __init__(self, context: ClientContext) -> None:
        self.ip = context.client_ip.encode("ascii")
        self.scheme = context.scheme.encode("ascii")
        self.port = str(context.server_port).encode("ascii")
        self.trusted = context.trusted_proxy
        if b":" in self.ip:  # RFC 7239 §6: IPv6 in brackets, quoted
            self.forwarded_for = b'"[' + self.ip + b']"'
        else:
            self.forwarded_for = _forwarded_value(self.ip)


class _Fields:
    """The client's header fields sorted by what the rules do with them."""

    __slots__ = (
        "connection",
        "content_length",
        "forwarded",
        "hosts",
        "kept",
        "pairs",
        "request_ids",
        "trace",
        "transfer_encoding",
        "trusted_present",
        "upgrade",
        "ws_keys",
        "ws_versions",
        "x_forwarded_for",
    )

    def __init__(self, raw: list[tuple[bytes, bytes]], trusted: bool) -> None:
        kept: list[Field] = []
        pairs: list[tuple[bytes, bytes]] = []  # kept's (lowercased name, value)
        self.hosts: list[bytes] = []
        self.content_length: list[bytes] = []
        self.transfer_encoding: list[bytes] = []
        self.connection: list[bytes] = []
        self.upgrade: list[bytes] = []
        self.x_forwarded_for: list[bytes] = []
        self.forwarded: list[bytes] = []
        self.trusted_present: set[bytes] = set()
        self.request_ids: list[bytes] = []
        self.trace: list[Field] = []
        self.ws_keys: list[bytes] = []
        self.ws_versions: list[bytes] = []
        kinds = _KINDS
        for name, value in raw:
            lname = name.lower()
            value = value.strip(b" \t")
            kind = kinds.get(lname)
            if kind is None:
                if _UNDERSCORE in lname and lname.replace(b"_", b"-") in kinds:
                    continue  # X_Forwarded_For: a backend may read it as the real one
                kept.append((name, lname, value))
                pairs.append((lname, value))
            elif kind == _HOST:
                self.hosts.append(value)
                kept.append((name, lname, value))
                pairs.append((lname, value))
            elif kind == _CONTENT_LENGTH:
                self.content_length.append(value)
            elif kind == _TRANSFER_ENCODING:
                self.transfer_encoding.append(value)
            elif kind == _CONNECTION:
                self.connection.append(value)
            elif kind == _UPGRADE:
                self.upgrade.append(value)
            elif kind == _X_FORWARDED_FOR:
                self.x_forwarded_for.append(value)
            elif kind == _FORWARDED:
                self.forwarded.append(value)
            elif kind == _FORWARDING_KEPT_IF_TRUSTED:
                if trusted:
                    self.trusted_present.add(lname)
                    kept.append((name, lname, value))
                    pairs.append((lname, value))
            elif kind == _REQUEST_ID:
                self.request_ids.append(value)
            elif kind == _TRACE:
                self.trace.append((name, lname, value))
            elif kind == _WS_KEY:
                self.ws_keys.append(value)
                kept.append((name, lname, value))
                pairs.append((lname, value))
            elif kind == _WS_VERSION:
                self.ws_versions.append(value)
                kept.append((name, lname, value))
                pairs.append((lname, value))
            # _HOP_BY_HOP: dropped
        self.kept = kept
        self.pairs = pairs


def build_request_head(
    parsed: HeadParser,
    identity: ForwardingIdentity,
    request_id_factory: Callable[[], str],
) -> RequestHeadReceived:
    """Validate one parsed head (raises :class:`MessageRejected`); its
    rewrite into the forwarded head waits for first use (:class:`_Rewrite`)."""
    method, version = parsed.method, parsed.http_version
    if method == b"CONNECT":
        raise MessageRejected(501, "CONNECT is not supported")
    fields = _Fields(parsed.headers, identity.trusted)
    host = _check_host(fields.hosts, version)
    target = _origin_form(method, parsed.target, host)
    content_length, chunked = _framing(fields, version)
    connection = split_tokens(fields.connection) if fields.connection else []
    close = b"close" in connection
    keep_alive = not close if version == b"1.1" else (b"keep-alive" in connection and not close)
    websocket = _websocket_handshake(fields, method, version, connection, content_length, chunked)
    nominated = set(connection) - _CONNECTION_OPTIONS - _UNNOMINATABLE
    if nominated:
        fields.kept = [f for f in fields.kept if f[1] not in nominated]
        fields.pairs = [f for f in fields.pairs if f[0] not in nominated]
    framing: list[Field] = []  # the edge's own framing and persistence fields
    if websocket is not None:
        framing.append((b"Connection", b"connection", b"Upgrade"))
        framing.append((b"Upgrade", b"upgrade", b"websocket"))
    elif version == b"1.0" and keep_alive:
        framing.append((b"Connection", b"connection", b"keep-alive"))
    if chunked:
        framing.append((b"Transfer-Encoding", b"transfer-encoding", b"chunked"))
    elif content_length is not None:
        framing.append((b"Content-Length", b"content-length", b"%d" % content_length))
    request_id = _request_id(fields.request_ids, identity.trusted, request_id_factory)
    trace_id, span_id = _trace_id(fields.trace, identity.trusted, request_id)
    idempotent = method in IDEMPOTENT_METHODS
    expects_body = chunked or bool(content_length)
    return RequestHeadReceived(
        method=method,
        target=target,
        http_version=version,
        client_fields=tuple(fields.pairs),
        forwarded=_Rewrite(fields, framing, identity, host, request_id, span_id),
        host=host.decode("ascii") if host is not None else None,
        request_id=request_id.decode("ascii"),
        trace_id=trace_id,
        keep_alive=keep_alive,
        websocket_upgrade=websocket,
        idempotent=idempotent,
        expects_body=expects_body,
        replayable=idempotent and not expects_body and websocket is None,
        content_length=content_length,
        chunked=chunked,
    )


class _Rewrite:
    """The forwarded head of a validated request: the client's fields, then the
    edge's framing, forwarding and trace fields (made by
    :meth:`RequestHeadReceived.head` on first use; a cache hit never asks)."""

    __slots__ = ("fields", "framing", "host", "identity", "request_id", "span_id")

    def __init__(
        self,
        fields: _Fields,
        framing: list[Field],
        identity: ForwardingIdentity,
        host: bytes | None,
        request_id: bytes,
        span_id: str | None,
    ) -> None:
        self.fields = fields
        self.framing = framing
        self.identity = identity
        self.host = host
        self.request_id = request_id
        self.span_id = span_id  # None: the trace a trusted hop sent goes on

    def forwarded(self, request: RequestHeadReceived) -> tuple[bytes, Headers]:
        fields = self.fields
        added = self.framing  # (asked once: RequestHeadReceived keeps the answer)
        _append_forwarding(added, fields, self.identity, self.host, self.request_id)
        if self.span_id is None:
            added.extend(fields.trace)
        else:
            traceparent = f"00-{request.trace_id}-{self.span_id}-01".encode()
            added.append((b"traceparent", b"traceparent", traceparent))
        parts = [request.method, b" ", request.target, b" HTTP/", request.http_version, b"\r\n"]
        for name, _, value in fields.kept:
            parts += (name, b": ", value, b"\r\n")
        for name, _, value in added:
            parts += (name, b": ", value, b"\r\n")
        parts.append(b"\r\n")
        headers = request.client_fields + tuple([(lname, value) for _, lname, value in added])
        return b"".join(parts), headers


def _check_host(hosts: list[bytes], version: bytes) -> bytes | None:
    if len(hosts) > 1:
        raise MessageRejected(400, "more than one Host field")
    if not hosts:
        if version == b"1.1":
            raise MessageRejected(400, "missing Host field")
        return None
    host = hosts[0]
    if HOST_RE.fullmatch(host) is None:
        raise MessageRejected(400, "invalid Host field")
    return host


def _origin_form(method: bytes, target: bytes, host: bytes | None) -> bytes:
    if _HASH in target:  # no form of request-target has one (RFC 9112 §3.2)
        raise MessageRejected(400, "fragment in the request target")
    if target[:1] == b"/":
        return target
    if target == b"*":
        if method == b"OPTIONS":
            return target
        raise MessageRejected(400, "asterisk-form target with a method other than OPTIONS")
    match = _ABSOLUTE_FORM_RE.fullmatch(target)
    if match is None or match[1].lower() not in (b"http", b"https"):
        raise MessageRejected(400, "unsupported request target")
    authority, path = match[2], match[3]
    if host is None or b"@" in authority or authority.lower() != host.lower():
        raise MessageRejected(400, "absolute-form target names another host")
    return path if path[:1] == b"/" else b"/" + path


def _framing(fields: _Fields, version: bytes) -> tuple[int | None, bool]:
    """(content_length, chunked) of the request body, or 400/501."""
    if fields.transfer_encoding:
        if version == b"1.0":
            raise MessageRejected(400, "Transfer-Encoding in an HTTP/1.0 request")
        if fields.content_length:
            raise MessageRejected(400, "both Content-Length and Transfer-Encoding")
        codings = split_tokens(fields.transfer_encoding)
        if codings == [b"chunked"]:
            return None, True
        if codings and codings[-1] == b"chunked" and b"chunked" not in codings[:-1]:
            raise MessageRejected(501, "unsupported transfer coding")
        raise MessageRejected(400, "chunked is not the only final transfer coding")
    if not fields.content_length:
        return None, False
    if len(fields.content_length) > 1:
        raise MessageRejected(400, "more than one Content-Length field")
    length = parse_decimal(fields.content_length[0], MAX_CONTENT_LENGTH_DIGITS)
    if length is None:
        raise MessageRejected(400, "invalid Content-Length")
    return length, False


def _websocket_handshake(
    fields: _Fields,
    method: bytes,
    version: bytes,
    connection: list[bytes],
    content_length: int | None,
    chunked: bool,
) -> WebSocketUpgrade | None:
    if not fields.upgrade or b"upgrade" not in connection:
        return None
    if b"websocket" not in split_tokens(fields.upgrade):
        return None  # h2c or anything else: Upgrade is stripped, the request goes on
    if method != b"GET" or version != b"1.1":
        raise MessageRejected(400, "WebSocket handshake must be GET over HTTP/1.1")
    if fields.ws_versions != [b"13"]:
        raise MessageRejected(400, "WebSocket handshake without Sec-WebSocket-Version: 13")
    if len(fields.ws_keys) != 1 or not is_valid_key(fields.ws_keys[0]):
        raise MessageRejected(400, "WebSocket handshake with an invalid Sec-WebSocket-Key")
    if chunked or content_length:
        raise MessageRejected(400, "WebSocket handshake with a body")
    return WebSocketUpgrade(method=method, key=fields.ws_keys[0])


class RequestIds:
    """A worker's request ids, ``<prefix><counter as 8+ hex digits>``, as a
    reader's ``request_id_factory``: the prefix is checked once, so every id
    is valid by construction and the reader takes them as they are (a
    factory of any other kind has each id checked)."""

    __slots__ = ("_count", "_prefix")

    def __init__(self, prefix: str) -> None:
        encoded = prefix.encode("utf-8")
        if len(encoded) > 180 or REQUEST_ID_RE.fullmatch(encoded + b"0") is None:
            raise ValueError(f"unusable request id prefix: {prefix!r}")
        self._prefix = encoded
        self._count = 0

    def __call__(self) -> str:
        return self.next_id().decode("ascii")

    def next_id(self) -> bytes:
        self._count += 1
        return self._prefix + b"%08x" % self._count


def _request_id(ids: list[bytes], trusted: bool, factory: Callable[[], str]) -> bytes:
    if trusted and ids and REQUEST_ID_RE.fullmatch(ids[0]) is not None:
        return ids[0]
    if type(factory) is RequestIds:
        sequence: RequestIds = factory
        return sequence.next_id()
    request_id = factory()
    encoded = request_id.encode("latin-1", "replace")
    if not request_id.isascii() or REQUEST_ID_RE.fullmatch(encoded) is None:
        raise Http1UsageError(f"request_id_factory returned an unusable id: {request_id!r}")
    return encoded


def _append_forwarding(
    out: list[Field],
    fields: _Fields,
    identity: ForwardingIdentity,
    host: bytes | None,
    request_id: bytes,
) -> None:
    """Add the forwarding fields for the real client (DESIGN principle 8)."""
    trusted, ip = identity.trusted, identity.ip
    xff = ip
    if trusted and fields.x_forwarded_for:
        xff = b", ".join(fields.x_forwarded_for) + b", " + ip
    out.append((b"X-Forwarded-For", b"x-forwarded-for", xff))
    element = b"for=" + identity.forwarded_for + b";proto=" + identity.scheme
    if host is not None:
        element += b";host=" + _forwarded_value(host)
    if trusted and fields.forwarded:
        element = b", ".join(fields.forwarded) + b", " + element
    out.append((b"Forwarded", b"forwarded", element))
    present = fields.trusted_present
    if b"x-real-ip" not in present:
        out.append((b"X-Real-IP", b"x-real-ip", ip))
    if b"x-forwarded-proto" not in present:
        out.append((b"X-Forwarded-Proto", b"x-forwarded-proto", identity.scheme))
    if host is not None and b"x-forwarded-host" not in present:
        out.append((b"X-Forwarded-Host", b"x-forwarded-host", host))
    if b"x-forwarded-port" not in present:
        out.append((b"X-Forwarded-Port", b"x-forwarded-port", identity.port))
    out.append((b"X-Request-Id", b"x-request-id", request_id))


_TRACEPARENT_RE = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


def _trace_id(trace: list[Field], trusted: bool, request_id: bytes) -> tuple[str, str | None]:
    """W3C trace context: a well-formed ``traceparent`` (and its ``tracestate``)
    from a trusted hop is kept (``(its trace id, None)``); otherwise the edge
    starts a trace (``(a new trace id, the span id of its traceparent)``), so
    Node's own traces join the edge's logs by trace id.

    A trace the edge starts takes its ids from one hash of the request id,
    which is unique per worker (a random prefix and a counter): the reader
    stays a pure function of its input and its id factory. The first 16
    octets are the trace id, the last 8 the span id."""
    parents = [f for f in trace if f[1] == b"traceparent"]
    if trusted and len(parents) == 1:
        match = _TRACEPARENT_RE.fullmatch(parents[0][2])
        if match and match[1] != b"0" * 32 and match[2] != b"0" * 16:
            return match[1].decode("ascii"), None
    ids = hashlib.blake2b(request_id, digest_size=24, person=b"geoedge-trace").hexdigest()
    return ids[:32], ids[32:]


def forwardable_trailers(section: bytes) -> bytes:
    """The field lines of a request's trailer section (validated, each ending in
    CRLF) that go on to the backend: a trailer is a second header section, and a
    client must not get past the head rules there (an ``X-Forwarded-For``, a
    ``Host``, a ``Content-Length``, their underscore spellings) nor have a
    field RFC 9110 §6.5.1 keeps out of trailers read as if it were in the head."""
    if not section:
        return b""
    dropped = _TRAILERS_DROPPED
    kept = []
    for line in section.split(b"\r\n")[:-1]:
        name = line.partition(b":")[0].lower()
        if name in dropped or (_UNDERSCORE in name and name.replace(b"_", b"-") in dropped):
            continue
        kept.append(line + b"\r\n")
    return b"".join(kept)


def _forwarded_value(value: bytes) -> bytes:
    """A token as is, anything else as a quoted-string (RFC 7239 §4)."""
    if TOKEN_RE.fullmatch(value) is not None:
        return value
    return b'"' + value.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'
