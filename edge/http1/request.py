"""The request side: client bytes in, events to forward (or reject) out.

:class:`RequestReader` is sans-I/O (DESIGN principle 1): ``feed(data)``
returns events; it never raises on bad input, never reads a clock, never
buffers a body. The I/O adapter arms the header-read timer while
:attr:`RequestReader.in_head` and the keep-alive idle timer while
:attr:`RequestReader.idle`.

Choices documented here (the head rules live in :mod:`edge.http1.request_head`):

- Chunked bodies are re-encoded, never passed through: each run of payload
  bytes received becomes one complete chunk (``<hex>\\r\\n<data>\\r\\n``), chunk
  extensions are dropped, and the body ends with the last chunk and the
  trailer fields that may go on (:func:`~edge.http1.request_head.forwardable_trailers`):
  a trailer section is a second header section, so every field the head
  rules police (framing, Host, hop-by-hop, forwarding, request id, trace
  context) and every field RFC 9110 §6.5.1 keeps out of trailers
  (authentication, cookies, request modifiers, content metadata) is dropped
  from it; the rest reach Node.js (``req.trailers``).
- A request that does not keep the connection alive (``Connection: close``,
  HTTP/1.0 without keep-alive) ends the conversation: bytes the client
  pipelines after it are discarded (RFC 9112 §9.6).
- A rejection ends the conversation: body bytes scanned in the same ``feed``
  just before a framing error are not reported (the edge resets the backend
  stream anyway), so how much of a bad body was forwarded depends on how the
  bytes were split; everything else is independent of the split.
- EOF between requests is :class:`ClientClosed`; EOF inside a head or body is
  ``RequestRejected(400, ...)`` (the request is truncated: the edge resets
  the backend stream; answering 400 to a half-closed client is harmless).
- After a WebSocket handshake (``RequestHeadReceived`` with
  ``websocket_upgrade`` set, then ``RequestCompleted``), client bytes are held,
  neither parsed nor forwarded, until the edge calls :meth:`upgrade_accepted`
  (they are returned; from then on ``feed`` returns one :class:`TunnelBytes`
  per call) or :meth:`upgrade_refused` (they are parsed as HTTP, through every
  rewrite rule: a request smuggled behind a refused upgrade gets no pass).
"""

from __future__ import annotations

from collections.abc import Callable

from edge.http1.chunked import ChunkedScanner
from edge.http1.errors import Http1UsageError, MessageRejected
from edge.http1.events import (
    ClientClosed,
    RequestBodyReceived,
    RequestCompleted,
    RequestEvent,
    RequestRejected,
    TunnelBytes,
)
from edge.http1.head import HeadParser
from edge.http1.limits import ClientContext, HttpLimits
from edge.http1.request_head import ForwardingIdentity, build_request_head, forwardable_trailers

_HEAD, _BODY_LENGTH, _BODY_CHUNKED, _UPGRADE_HELD, _TUNNEL, _DRAINING, _DEAD = range(7)
_COMPLETED = RequestCompleted()  # events are immutable: one serves every request


class RequestReader:
    """Parses one client connection's requests; see the module docstring."""

    __slots__ = (
        "_chunked",
        "_eof",
        "_head",
        "_held",
        "_identity",
        "_keep_alive",
        "_limits",
        "_remaining",
        "_request_id_factory",
        "_stash",
        "_state",
    )

    def __init__(
        self,
        limits: HttpLimits,
        context: ClientContext,
        request_id_factory: Callable[[], str],
        identity: ForwardingIdentity | None = None,
    ) -> None:
        """``identity``: the forwarding facts of ``context``, when the caller
        made them already (an HTTP/2 connection reads each stream with a
        reader of its own, and the client is the same for all)."""
        self._limits = limits
        self._identity = ForwardingIdentity(context) if identity is None else identity
        self._request_id_factory = request_id_factory
        self._state = _HEAD
        self._head = HeadParser(limits, response=False)
        self._chunked: ChunkedScanner | None = None
        self._remaining = 0
        self._keep_alive = True
        self._stash = b""
        self._held = b""
        self._eof = False

    # What the adapter asks ----------------------------------------------------------

    @property
    def in_head(self) -> bool:
        """Part of a request head has arrived: arm the header-read timeout."""
        return self._state == _HEAD and not self._eof and self._head.started

    @property
    def in_body(self) -> bool:
        """A request head went up and its body is still arriving: arm the body timer."""
        return (self._state == _BODY_LENGTH or self._state == _BODY_CHUNKED) and not self._eof

    @property
    def idle(self) -> bool:
        """Between requests, nothing of the next one received: arm the idle timeout."""
        return self._state == _HEAD and not self._eof and not self._head.started

    @property
    def between_requests(self) -> bool:
        """Every request forwarded so far was forwarded whole (its body too), and
        no upgrade is pending: the backend is at a message boundary. True after
        a last request (``Connection: close``) too: it went up whole."""
        return self._state == _HEAD or self._state == _DRAINING

    @property
    def awaiting_upgrade(self) -> bool:
        """A WebSocket handshake was forwarded; client bytes are being held."""
        return self._state == _UPGRADE_HELD

    @property
    def tunnelling(self) -> bool:
        """The upgrade was accepted: ``feed`` passes bytes through."""
        return self._state == _TUNNEL

    @property
    def buffered_bytes(self) -> int:
        """Bytes held inside the reader right now (never more than the limits allow)."""
        held = len(self._stash) + len(self._held)
        return held + self._head.buffered_bytes if self._state == _HEAD else held

    # Input ----------------------------------------------------------------------

    def feed(self, data: bytes) -> list[RequestEvent]:
        """Parse client bytes; never raises on bad input."""
        state = self._state
        if self._eof or state >= _DRAINING:
            return []
        if state == _TUNNEL:
            return [TunnelBytes(data)] if data else []
        if state == _UPGRADE_HELD:
            return self._hold(data)
        return self._parse(data)

    def feed_eof(self) -> list[RequestEvent]:
        """The client closed its sending side."""
        if self._eof:
            return []
        self._eof = True
        state = self._state
        if state == _DEAD:
            return []
        if state == _HEAD and (self._head.started or self._stash):
            return self._reject(400, "client closed inside a request head")
        if state in (_BODY_LENGTH, _BODY_CHUNKED):
            return self._reject(400, "client closed inside a request body")
        return [ClientClosed()]

    def upgrade_accepted(self) -> bytes:
        """The backend answered 101: return the held bytes; the reader now passes
        everything through (:class:`TunnelBytes`)."""
        if self._state != _UPGRADE_HELD:
            raise Http1UsageError("upgrade_accepted() with no WebSocket upgrade pending")
        held, self._held = self._held, b""
        self._state = _TUNNEL
        return held

    def upgrade_refused(self) -> list[RequestEvent]:
        """The backend answered the handshake with a final non-101 response:
        parse the held bytes as HTTP again and return their events."""
        if self._state != _UPGRADE_HELD:
            raise Http1UsageError("upgrade_refused() with no WebSocket upgrade pending")
        held, self._held = self._held, b""
        self._state = _HEAD if self._keep_alive else _DRAINING
        events = self._parse(held) if held and self._state == _HEAD else []
        if self._eof and self._state == _HEAD and self._head.started:
            events += self._reject(400, "client closed inside a request head")
        elif self._eof and self._state in (_BODY_LENGTH, _BODY_CHUNKED):
            events += self._reject(400, "client closed inside a request body")
        return events

    # Parsing ----------------------------------------------------------------------

    def _parse(self, data: bytes) -> list[RequestEvent]:
        if self._stash:
            data = self._stash + data
            self._stash = b""
        events: list[RequestEvent] = []
        try:
            self._consume(data, events)
        except MessageRejected as exc:
            events += self._reject(exc.status, exc.reason)
        return events

    def _consume(self, data: bytes, events: list[RequestEvent]) -> None:
        pos, size = 0, len(data)
        while pos < size:
            state = self._state
            if state == _HEAD:
                end = self._head.feed(data, pos)
                if end < 0:
                    return
                self._start_request(events)
                pos = end
            elif state == _BODY_LENGTH:
                take = min(self._remaining, size - pos)
                chunk = data if take == size else data[pos : pos + take]
                events.append(RequestBodyReceived(chunk))
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._complete(events)
            elif state == _BODY_CHUNKED:
                pos = self._read_chunked(data, pos, events)
                if self._state == _BODY_CHUNKED:
                    self._stash = data[pos:]  # an incomplete chunk-size line, bounded
                    return
            elif state == _UPGRADE_HELD:
                events += self._hold(data[pos:])
                return
            else:
                return  # draining: bytes after a request that closes are discarded

    def _start_request(self, events: list[RequestEvent]) -> None:
        head = build_request_head(self._head, self._identity, self._request_id_factory)
        if head.content_length is not None and head.content_length > self._limits.max_body_bytes:
            raise MessageRejected(413, "Content-Length above max_body_bytes")
        self._head = HeadParser(self._limits, response=False)
        self._keep_alive = head.keep_alive
        events.append(head)
        if head.websocket_upgrade is not None:
            events.append(_COMPLETED)
            self._state = _UPGRADE_HELD
        elif head.chunked:
            self._chunked = ChunkedScanner(self._limits, self._limits.max_body_bytes)
            self._state = _BODY_CHUNKED
        elif head.content_length:
            self._remaining = head.content_length
            self._state = _BODY_LENGTH
        else:
            self._complete(events)

    def _read_chunked(self, data: bytes, pos: int, events: list[RequestEvent]) -> int:
        scanner = self._chunked
        assert scanner is not None
        spans: list[tuple[int, int]] = []
        end = scanner.scan(data, pos, spans)
        parts: list[bytes | memoryview] = []
        if spans:
            view = memoryview(data)
            for start, stop in spans:
                parts += (b"%x\r\n" % (stop - start), view[start:stop], b"\r\n")
        if scanner.done:
            parts += (b"0\r\n", forwardable_trailers(scanner.trailers), b"\r\n")
        if parts:
            events.append(RequestBodyReceived(b"".join(parts)))
        if scanner.done:
            self._chunked = None
            self._complete(events)
        return end

    def _complete(self, events: list[RequestEvent]) -> None:
        events.append(_COMPLETED)
        self._state = _HEAD if self._keep_alive else _DRAINING

    def _hold(self, data: bytes) -> list[RequestEvent]:
        if len(self._held) + len(data) > self._limits.max_held_upgrade_bytes:
            return self._reject(400, "too many bytes sent before the upgrade was answered")
        self._held += data
        return []

    def _reject(self, status: int, reason: str) -> list[RequestEvent]:
        mid_request = self._state in (_BODY_LENGTH, _BODY_CHUNKED, _UPGRADE_HELD)
        self._state = _DEAD
        self._stash = self._held = b""
        self._head = HeadParser(self._limits, response=False)
        return [RequestRejected(status, reason, mid_request)]
