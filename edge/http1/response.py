"""The response side: backend bytes in, events out; bytes are forwarded untouched.

:class:`ResponseReader` does not rewrite anything: it finds where each
response ends (keep-alive, pipelining), recognises interim responses and
WebSocket switches, rejects framing a client could misread, and exposes the
fields the access log and the keep-alive decision need.

Framing (RFC 9112 §6.3), for the final response to the oldest outstanding
request (:meth:`ResponseReader.expect` keeps them in a FIFO):

1. a response to HEAD, a 204 or a 304 has no body, whatever its fields say;
2. 1xx other than 101 are interim: forwarded, and the request stays outstanding;
3. a 101 is valid only for a WebSocket handshake, and only if it answers the
   handshake's key (``Sec-WebSocket-Accept``, ``Upgrade: websocket``,
   ``Connection: upgrade``, HTTP/1.1): then :class:`WebSocketAccepted` and raw
   :class:`TunnelBytes` from the next byte on; otherwise
   :class:`WebSocketRefused` *without* a head event, so nothing has been
   forwarded and the edge can answer 502 and close;
4. ``Transfer-Encoding`` with ``chunked`` last (once): chunked; with anything
   else last: the body runs to EOF. ``Transfer-Encoding`` in an HTTP/1.0
   response, or with ``Content-Length``: invalid (a downstream client could
   frame it differently);
5. ``Content-Length`` (exactly one, 1-18 ASCII digits): that many bytes;
6. otherwise the body runs until the backend closes (then
   ``ResponseCompleted(close_after=True)``).

After a response that closes the connection, further backend bytes are
discarded (RFC 9112 §9.6). Invalid input gives :class:`ResponseInvalid`, then
the reader is dead.

``decode_chunked=True`` (the HTTP/2 front end): body events of a chunked
response carry the payload only, without chunk framing, since HTTP/2 frames
the body itself; its trailer fields come in ``ResponseCompleted.trailers``.
"""

from __future__ import annotations

import re

from edge.http1.chunked import ChunkedScanner, trailer_fields
from edge.http1.errors import MessageRejected
from edge.http1.events import (
    BackendClosed,
    Headers,
    ResponseBodyReceived,
    ResponseCompleted,
    ResponseEvent,
    ResponseHeadReceived,
    ResponseInvalid,
    TunnelBytes,
    WebSocketAccepted,
    WebSocketRefused,
)
from edge.http1.head import HeadParser
from edge.http1.limits import HttpLimits
from edge.http1.syntax import MAX_CONTENT_LENGTH_DIGITS, parse_decimal, split_tokens
from edge.http1.websocket import accepts_handshake

_HEAD, _BODY_LENGTH, _BODY_CHUNKED, _BODY_UNTIL_EOF, _TUNNEL, _CLOSING, _DEAD = range(7)

_NO_BODY_STATUSES = frozenset({204, 304})


class ResponseReader:
    """Parses one backend stream's responses; see the module docstring."""

    __slots__ = (
        "_chunked",
        "_close_after",
        "_decode",
        "_eof",
        "_head",
        "_limits",
        "_pending",
        "_remaining",
        "_started",
        "_stash",
        "_state",
    )

    def __init__(self, limits: HttpLimits, *, decode_chunked: bool = False) -> None:
        self._limits = limits
        self._decode = decode_chunked
        # Requests sent, awaiting their responses: a few at most (a list: an
        # empty deque costs 760 B on every WebSocket the edge holds).
        self._pending: list[tuple[bytes, bytes | None]] = []
        self._state = _HEAD
        self._head = HeadParser(limits, response=True)
        self._chunked: ChunkedScanner | None = None
        self._remaining = 0
        self._close_after = False
        self._stash = b""
        self._started = False
        self._eof = False

    def expect(self, method: bytes, websocket_key: bytes | None) -> None:
        """Record a request forwarded to the backend, in order (pipelining)."""
        self._pending.append((method, websocket_key))

    @property
    def outstanding(self) -> int:
        """Requests forwarded whose final response has not completed."""
        return len(self._pending) + (self._state in (_BODY_LENGTH, _BODY_CHUNKED, _BODY_UNTIL_EOF))

    @property
    def at_boundary(self) -> bool:
        """Every forwarded request was answered in full, no byte of another
        response arrived, and the backend kept the connection alive."""
        return (
            self._state == _HEAD
            and not self._pending
            and not self._started
            and not self._stash
            and not self._close_after
            and not self._eof
        )

    @property
    def buffered_bytes(self) -> int:
        """Bytes held inside the reader right now (never more than the limits allow)."""
        return len(self._stash) + self._head.buffered_bytes

    def feed(self, data: bytes) -> list[ResponseEvent]:
        """Parse backend bytes; never raises on bad input."""
        state = self._state
        if self._eof or state >= _CLOSING or not data:
            return []
        if state == _TUNNEL:
            return [TunnelBytes(data)]
        if self._stash:
            data = self._stash + data
            self._stash = b""
        events: list[ResponseEvent] = []
        try:
            self._consume(data, events)
        except MessageRejected as exc:
            self._die()
            events.append(ResponseInvalid(exc.reason))
        return events

    def feed_eof(self) -> list[ResponseEvent]:
        """The backend closed its side."""
        if self._eof:
            return []
        self._eof = True
        state = self._state
        if state == _DEAD:
            return []
        if state in (_BODY_LENGTH, _BODY_CHUNKED) or (state == _HEAD and self._started):
            return [BackendClosed(before_response=False, mid_response=True)]
        # Requests still queued behind a complete response got no byte: before_response.
        closed = BackendClosed(before_response=bool(self._pending), mid_response=False)
        if state == _BODY_UNTIL_EOF:
            return [ResponseCompleted(close_after=True), closed]
        return [closed]

    def _consume(self, data: bytes, events: list[ResponseEvent]) -> None:
        pos, size = 0, len(data)
        while pos < size:
            state = self._state
            if state == _HEAD:
                if not self._pending:
                    raise MessageRejected(502, "response bytes with no request outstanding")
                self._started = True
                end = self._head.feed(data, pos)
                if end < 0:
                    return
                self._on_head(events)
                pos = end
            elif state == _BODY_LENGTH:
                take = min(self._remaining, size - pos)
                chunk = data if take == size else data[pos : pos + take]
                events.append(ResponseBodyReceived(chunk))
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._complete(events)
            elif state == _BODY_CHUNKED:
                pos = self._read_chunked(data, pos, events)
                if self._state == _BODY_CHUNKED:
                    self._stash = data[pos:]  # an incomplete chunk-size line, bounded
                    return
            elif state == _BODY_UNTIL_EOF:
                events.append(ResponseBodyReceived(data[pos:] if pos else data))
                return
            elif state == _TUNNEL:
                events.append(TunnelBytes(data[pos:]))
                return
            else:
                return  # closing: bytes after the last response are discarded

    def _read_chunked(self, data: bytes, pos: int, events: list[ResponseEvent]) -> int:
        scanner = self._chunked
        assert scanner is not None
        if self._decode:
            spans: list[tuple[int, int]] = []
            end = scanner.scan(data, pos, spans)
            if spans:
                view = memoryview(data)
                events.append(ResponseBodyReceived(b"".join(view[a:b] for a, b in spans)))
        else:
            end = scanner.scan(data, pos, [])
            if end > pos:
                chunk = data if end - pos == len(data) else data[pos:end]
                events.append(ResponseBodyReceived(chunk))
        if scanner.done:
            self._chunked = None
            trailers = scanner.trailers
            self._complete(events, trailer_fields(trailers) if self._decode and trailers else ())
        return end

    def _on_head(self, events: list[ResponseEvent]) -> None:
        head = self._head
        self._head = HeadParser(self._limits, response=True)
        status = head.status
        if not 100 <= status <= 599:
            raise MessageRejected(502, f"invalid status code {status}")
        headers = [(name.lower(), value.strip(b" \t")) for name, value in head.headers]
        method, key = self._pending[0]
        if status == 101:
            self._switch_protocols(head, headers, key, events)
            return
        if status < 200:
            events.append(_head_event(head, headers, True, None, False))
            return
        del self._pending[0]
        self._start_body(head, headers, method, events)

    def _switch_protocols(
        self,
        head: HeadParser,
        headers: list[tuple[bytes, bytes]],
        key: bytes | None,
        events: list[ResponseEvent],
    ) -> None:
        if key is None:
            raise MessageRejected(502, "101 to a request that asked for no upgrade")
        if head.http_version != b"1.1" or not accepts_handshake(headers, key):
            self._die()
            events.append(WebSocketRefused(101))
            return
        del self._pending[0]
        events.append(_head_event(head, headers, True, None, False))
        events.append(WebSocketAccepted())
        self._state = _TUNNEL

    def _start_body(
        self,
        head: HeadParser,
        headers: list[tuple[bytes, bytes]],
        method: bytes,
        events: list[ResponseEvent],
    ) -> None:
        version = head.http_version
        content_length, chunked, coded = _framing(headers, version)
        tokens = split_tokens([value for name, value in headers if name == b"connection"])
        close = b"close" in tokens
        keep_alive = not close if version == b"1.1" else (b"keep-alive" in tokens and not close)
        if method == b"HEAD" or head.status in _NO_BODY_STATUSES:
            state = _HEAD
        elif chunked:
            state = _BODY_CHUNKED
        elif coded or content_length is None:
            state, keep_alive = _BODY_UNTIL_EOF, False
        else:
            state = _BODY_LENGTH if content_length else _HEAD
        event = _head_event(head, headers, keep_alive, content_length, chunked)
        event.close_delimited = state == _BODY_UNTIL_EOF
        event.nominated = nominated_fields(tokens)
        events.append(event)
        self._close_after = not keep_alive
        if state == _HEAD:
            self._complete(events)
        elif state == _BODY_CHUNKED:
            self._chunked = ChunkedScanner(self._limits)
            self._state = state
        else:
            self._remaining = content_length or 0
            self._state = state

    def _complete(self, events: list[ResponseEvent], trailers: Headers = ()) -> None:
        if trailers:
            events.append(ResponseCompleted(self._close_after, trailers))
        else:  # events are immutable: these two serve every response without trailers
            events.append(_COMPLETED_CLOSING if self._close_after else _COMPLETED)
        self._started = False
        self._state = _CLOSING if self._close_after else _HEAD

    def _die(self) -> None:
        self._state = _DEAD
        self._stash = b""
        self._head = HeadParser(self._limits, response=True)


def _head_event(
    head: HeadParser,
    headers: list[tuple[bytes, bytes]],
    keep_alive: bool,
    content_length: int | None,
    chunked: bool,
) -> ResponseHeadReceived:
    return ResponseHeadReceived(
        status=head.status,
        reason=head.reason,
        http_version=head.http_version,
        headers=tuple(headers),
        head=head.raw,
        keep_alive=keep_alive,
        content_length=content_length,
        chunked=chunked,
    )


def _framing(headers: list[tuple[bytes, bytes]], version: bytes) -> tuple[int | None, bool, bool]:
    """(content_length, chunked, other_coding) from the response's fields."""
    lengths = [value for name, value in headers if name == b"content-length"]
    codings_fields = [value for name, value in headers if name == b"transfer-encoding"]
    if codings_fields:
        if version == b"1.0":
            raise MessageRejected(502, "Transfer-Encoding in an HTTP/1.0 response")
        if lengths:
            raise MessageRejected(502, "both Content-Length and Transfer-Encoding")
        codings = split_tokens(codings_fields)
        chunked = bool(codings) and codings[-1] == b"chunked" and codings.count(b"chunked") == 1
        if not chunked and b"chunked" in codings:
            raise MessageRejected(502, "chunked is not the final transfer coding")
        return None, chunked, not chunked
    if not lengths:
        return None, False, False
    if len(lengths) > 1:
        raise MessageRejected(502, "more than one Content-Length field")
    length = parse_decimal(lengths[0], MAX_CONTENT_LENGTH_DIGITS)
    if length is None:
        raise MessageRejected(502, "invalid Content-Length")
    return length, False, False


#: A response's fields about the connection it came on (RFC 9110 §7.6.1): the
#: backend's ``Connection`` and ``Keep-Alive`` speak of a connection the origin
#: pools, never of the client's (Node's ``Keep-Alive: timeout=5`` told clients
#: that honour it, such as undici, to drop an edge connection kept for 75 s).
_RESPONSE_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection"})
_CONNECTION_OPTIONS = frozenset({b"close", b"keep-alive"})
#: Fields ``Connection`` may not take away: the client frames the body by them.
_UNNOMINATABLE = frozenset({b"content-length", b"transfer-encoding"})
_NOTHING_NOMINATED: frozenset[bytes] = frozenset()
_COMPLETED = ResponseCompleted(close_after=False)
_COMPLETED_CLOSING = ResponseCompleted(close_after=True)
#: Octets as ints: ``int in bytes`` is one memchr, ``bytes in bytes`` a
#: general substring search (20 against 220 ns).
_CR, _LF = b"\r\n"
#: The fields of :data:`_RESPONSE_HOP_BY_HOP` as lines of a raw head, with any
#: obs-fold continuation lines: one pass in C for every response. A head ends
#: in CRLF CRLF and llhttp takes no bare LF, so each match is ``\n`` + a whole
#: line but its CR, and taking it out leaves the CRLFs around it whole.
_HOP_BY_HOP_LINES = re.compile(
    rb"\n(?:connection|keep-alive|proxy-connection)[ \t]*:[^\n]*(?:\n[ \t][^\n]*)*",
    re.IGNORECASE,
)


def nominated_fields(options: list[bytes]) -> frozenset[bytes]:
    """The fields a response's ``Connection`` options (lowercase tokens) name
    besides its own ``close`` and ``keep-alive``: they are about the backend
    connection too (RFC 9110 §7.6.1), but for the body's framing."""
    for option in options:
        if option not in _CONNECTION_OPTIONS and option not in _UNNOMINATABLE:
            return frozenset(options) - _CONNECTION_OPTIONS - _UNNOMINATABLE
    return _NOTHING_NOMINATED


def closing_head(head: bytes, nominated: frozenset[bytes] = _NOTHING_NOMINATED) -> bytes:
    """``head`` (a raw final response head) as :func:`reusable_head` makes it,
    saying ``Connection: close``: the client's connection ends after it."""
    return reusable_head(head, nominated)[:-2] + b"Connection: close\r\n\r\n"


def reusable_head(head: bytes, nominated: frozenset[bytes] = _NOTHING_NOMINATED) -> bytes:
    """``head`` (a raw final response head) without the fields about the
    backend connection: ``Connection``, ``Keep-Alive``, ``Proxy-Connection``
    and the fields ``Connection`` names (``nominated``, lowercase). The
    client's connection lives by the edge's rules (the next request takes
    another stream, PROTOCOL.md §6.7)."""
    if not nominated:
        return _HOP_BY_HOP_LINES.sub(b"", head)
    dropped = _RESPONSE_HOP_BY_HOP | nominated
    lines = head.rstrip(b"\r\n").split(b"\n")
    kept = [lines[0].rstrip(b"\r")]
    dropping = False
    for line in lines[1:]:
        line = line.rstrip(b"\r")
        if line[:1] in (b" ", b"\t"):  # obs-fold: the rest of the field above
            if not dropping:
                kept.append(line)
            continue
        dropping = line.partition(b":")[0].strip().lower() in dropped
        if not dropping:
            kept.append(line)
    return b"\r\n".join(kept) + b"\r\n\r\n"


def client_head(
    head: bytes, headers: Headers, nominated: frozenset[bytes], fields: list[bytes]
) -> bytes:
    """``head`` (a raw final response head, its fields ``headers`` as the
    reader reported them) as :func:`reusable_head` makes it, with the field
    lines ``fields`` first, in their order: what :func:`with_field` over each
    of them, last first, would make, in one pass. A head whose lines are its
    fields one to one (no obs-fold) and that names no field in ``Connection``
    is cut by its lines; any other takes the general way."""
    for field in fields:
        if _CR in field or _LF in field:
            raise ValueError("client_head needs one-line fields")
    lines = head.split(b"\r\n")
    if nominated or len(lines) != len(headers) + 3:
        return with_fields(reusable_head(head, nominated), fields)
    kept = [lines[0], *fields]
    dropped = _RESPONSE_HOP_BY_HOP
    line = 1
    for name, _ in headers:
        if name not in dropped:
            kept.append(lines[line])
        line += 1
    kept += (b"", b"")
    return b"\r\n".join(kept)


def with_fields(response: bytes, fields: list[bytes]) -> bytes:
    """``response`` with the field lines ``fields`` right after its status
    line, in their order (:func:`with_field` for each, last first)."""
    for field in reversed(fields):
        response = with_field(response, field)
    return response


def with_field(response: bytes, field: bytes) -> bytes:
    """``response`` (a final response head, or a whole response the edge wrote)
    with the field line ``field`` (``b"Name: value"``) right after its status line.

    First, so that it wins where a field may appear once and the first one
    counts (RFC 6797 §8.1 for Strict-Transport-Security); the fields that
    follow, framing included, are untouched. ``field`` must be a valid field
    line without CR or LF (the caller builds it from configuration)."""
    end = response.find(b"\r\n") + 2
    if end < 2 or _CR in field or _LF in field:
        raise ValueError("with_field needs a response with a status line and a one-line field")
    return b"".join((response[:end], field, b"\r\n", response[end:]))
