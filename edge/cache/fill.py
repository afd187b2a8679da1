"""The client a cacheable request's exchange answers through: it stores,
compresses, freshens and stands in with a stale response.

A :class:`Fill` sits between an exchange (:mod:`edge.exchange`) and its
front end's client. The exchange's reader hands it the response's payload
(chunk framing removed), so it can keep the body; it writes to the front end
a head it built (:func:`edge.cache.responses.make_head`) and the body framed
for that client: as it came when its length is known, else chunked for an
HTTP/1.1 client (and the rest of the connection for an HTTP/1.0 one).

What it does with the final response head, in order:

1. a 304 to the cache's own conditional request: freshen the stored
   response (RFC 9111 §4.3.4) and serve it to this client
   (:func:`edge.cache.responses.stored_reply`: its own conditions, ranges,
   compression), the 304 itself going nowhere;
2. a 5xx while it revalidates a stale response that may stand in for an
   origin in trouble (:func:`edge.cache.policy.stale_on_error`): serve that;
3. otherwise forward it, with ``Cache-Status``, without the fields meant
   for this cache (``Surrogate-Control``, the purge tags unless configured
   otherwise), compressed for this client when it may be, and keep its
   body to store if the response is storable (:func:`edge.cache.policy.not_storable`)
   and not larger than ``max_object_bytes``.

An exchange that fails before any response (no tunnel, a reset, a timeout)
asks its client to :meth:`answer` with an error: a stale response that may
stand in is served instead.

The fill tells its cache once it knows the response will not be stored
(:meth:`edge.cache.cache.EdgeCache.fill_refused`: at its head, or when its
body outgrows ``max_object_bytes``), so the requests that waited for it
(collapsing) go to the origin themselves without waiting for its body, and
when its exchange finishes (:meth:`edge.cache.cache.EdgeCache.fill_ended`),
so they get the stored response.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from edge.cache.compress import Encoder, compressible, encoded_fields
from edge.cache.config import CacheConfig, CompressionConfig
from edge.cache.freshness import FreshnessRules, ResponseFacts
from edge.cache.lookup import CacheCounters, Lookup
from edge.cache.policy import not_storable, stale_on_error
from edge.cache.relay import Relay
from edge.cache.responses import Reply, make_head, serve, with_vary
from edge.cache.store import CacheStore
from edge.h2_fields import CONNECTION_SPECIFIC
from edge.http1 import ResponseHeadReceived
from edge.http1.events import Headers

if TYPE_CHECKING:
    from edge.cache.entry import StoredResponse

__all__ = ["Fill"]

_NOT_FORWARDED = CONNECTION_SPECIFIC | {b"surrogate-control"}


class FillOwner(Protocol):
    """What a fill needs of its cache (:class:`edge.cache.cache.EdgeCache`,
    which imports this module: the interface is spelled out here)."""

    config: CacheConfig
    compression: CompressionConfig
    freshness: FreshnessRules
    store: CacheStore
    counters: CacheCounters
    hidden_fields: frozenset[bytes]
    status_name: bytes

    def reply(
        self, lookup: Lookup, entry: StoredResponse, *, status: bytes, extra: Any = ()
    ) -> Reply: ...
    def freshen(
        self,
        entry: StoredResponse,
        head: ResponseHeadReceived,
        request_time: float,
        response_time: float,
    ) -> StoredResponse: ...
    def keep(
        self,
        fill: Fill,
        head: ResponseHeadReceived,
        facts: ResponseFacts,
        body: bytes,
        encoded: tuple[str, bytes] | None,
    ) -> StoredResponse | None: ...
    def fill_ended(self, fill: Fill) -> None: ...
    def fill_refused(self, fill: Fill) -> None: ...
    def forget(self, entry: StoredResponse) -> None: ...


class Fill(Relay):
    """One cacheable exchange's client; see the module docstring.

    Invariants: ``parts`` is not None while the body is being kept (the
    response is storable and within ``max_object_bytes``); once ``swallow``
    is set (a stored response was served instead), nothing more of the
    upstream's response reaches the client; :meth:`exchange_finished` tells
    the cache once.
    """

    __slots__ = (
        "cache",
        "chunk",
        "client_gone",
        "encoded_parts",
        "encoder",
        "exchange",
        "facts",
        "head",
        "lookup",
        "not_stored",
        "parts",
        "released",
        "request_time",
        "response_time",
        "served_stale",
        "size",
        "stored",
        "swallow",
        "waiters",
    )

    def __init__(self, cache: FillOwner, inner: Any, lookup: Lookup) -> None:
        super().__init__(inner)
        self.cache = cache
        self.lookup = lookup
        self.request_time = time.time()
        self.response_time = 0.0
        self.head: ResponseHeadReceived | None = None
        self.facts: ResponseFacts | None = None
        self.parts: list[bytes] | None = None
        self.size = 0
        self.encoder: Encoder | None = None
        self.encoded_parts: list[bytes] | None = None
        self.chunk = False
        self.client_gone = False
        self.swallow = False
        self.served_stale = False
        self.stored: StoredResponse | None = None
        self.not_stored = "no response"
        self.waiters: list[Any] = []
        self.released = False
        """The cache sent the waiters on and marked the key hit-for-pass
        (:meth:`edge.cache.cache.EdgeCache.fill_refused`)."""

    # -- edge.exchange.ExchangeClient ----------------------------------------------------

    def response_head(self, exchange: Any, head: ResponseHeadReceived) -> None:
        if head.informational:
            self.inner.response_head(exchange, head)
            return
        self.response_time = time.time()
        lookup = self.lookup
        stale = lookup.stale
        if stale is not None and head.status == 304 and lookup.validating:
            self.swallow = True
            self.not_stored = "freshened"
            entry = self.cache.freshen(stale, head, self.request_time, self.response_time)
            cookies = [(n, v) for n, v in head.headers if n in (b"set-cookie", b"set-cookie2")]
            reply = self.cache.reply(
                lookup, entry, status=b"fwd=stale; fwd-status=304", extra=cookies
            )
            exchange.record.cache = "revalidated"
            serve(exchange, self.inner, reply, finish=False)
            return
        if stale is not None and head.status >= 500 and self._stand_in(exchange, head.status):
            return
        cache = self.cache
        fields = [(n, v) for n, v in head.headers if n not in head.nominated]
        facts = ResponseFacts.of(head.status, fields, cache.freshness)
        self.facts = facts
        self.head = head
        reason = lookup.why_not_stored or not_storable(lookup.request, facts)
        length = head.content_length
        if reason is None and length is not None and length > cache.config.max_object_bytes:
            reason = "too large"
        if reason is None:
            self.parts = []
        else:
            self.not_stored = reason
            if stale is not None:
                cache.forget(stale)  # the origin's new answer replaces it
        self.inner.response_head(exchange, self._forwarded_head(exchange, head, fields, reason))
        if reason is not None:
            cache.fill_refused(self)

    def response_data(self, exchange: Any, data: bytes) -> None:
        if self.swallow:
            return
        parts = self.parts
        if parts is not None:
            self.size += len(data)
            if self.size > self.cache.config.max_object_bytes:
                self.parts = self.encoded_parts = None
                self.not_stored = "too large"
                self.cache.fill_refused(self)
            else:
                parts.append(data)
        encoder = self.encoder
        if encoder is not None:
            data = encoder.write(data)
            if self.encoded_parts is not None and data:
                self.encoded_parts.append(data)
        if data:
            self.inner.response_data(
                exchange, b"%x\r\n%s\r\n" % (len(data), data) if self.chunk else data
            )

    def response_complete(self, exchange: Any, close: bool, trailers: Headers = ()) -> None:
        if self.swallow:
            return
        encoder = self.encoder
        if encoder is not None:
            tail = encoder.finish()
            if tail:
                if self.encoded_parts is not None:
                    self.encoded_parts.append(tail)
                self.inner.response_data(
                    exchange, b"%x\r\n%s\r\n" % (len(tail), tail) if self.chunk else tail
                )
        if self.chunk:
            lines = b"".join(name + b": " + value + b"\r\n" for name, value in trailers)
            self.inner.response_data(exchange, b"0\r\n" + lines + b"\r\n")
            trailers = ()
        self.inner.response_complete(exchange, close, trailers)
        parts, head, facts = self.parts, self.head, self.facts
        if parts is not None and head is not None and facts is not None:
            body = b"".join(parts)
            if head.content_length is not None and len(body) != head.content_length:
                self.not_stored = "incomplete"
                return
            encoded = None
            if self.encoder is not None and self.encoded_parts is not None:
                encoded = (self.encoder.coding, b"".join(self.encoded_parts))
            self.stored = self.cache.keep(self, head, facts, body, encoded)

    def answer(self, exchange: Any, status: int) -> None:
        if self.lookup.stale is not None and self._stand_in(exchange, status):
            exchange.record.outcome = "ok"
            return
        self.inner.answer(exchange, status)

    def exchange_finished(self, exchange: Any) -> None:
        self.client_gone = exchange.record.outcome == "client_closed"
        self.inner.exchange_finished(exchange)
        self.cache.fill_ended(self)

    # -- its own ---------------------------------------------------------------------------

    def _stand_in(self, exchange: Any, status: int) -> bool:
        """Serve the stale response instead of the origin's error, if it may."""
        stale = self.lookup.stale
        cache = self.cache
        if stale is None or not stale_on_error(stale, time.time(), cache.config.stale_if_error_s):
            return False
        if not cache.store.holds(stale):
            return False
        self.swallow = self.served_stale = True
        self.not_stored = "origin error"
        reply = cache.reply(
            self.lookup, stale, status=b"hit; detail=stale-if-error; fwd-status=%d" % status
        )
        exchange.record.cache = "stale-error"
        cache.counters.stale_served += 1
        serve(exchange, self.inner, reply, finish=False)
        return True

    def _forwarded_head(
        self,
        exchange: Any,
        head: ResponseHeadReceived,
        fields: list[tuple[bytes, bytes]],
        reason: str | None,
    ) -> ResponseHeadReceived:
        """The head this client gets: the origin's, with ``Cache-Status``,
        without what is meant for this cache, compressed if it may be."""
        cache = self.cache
        lookup = self.lookup
        out = [
            (n, v) for n, v in fields if n not in _NOT_FORWARDED and n not in cache.hidden_fields
        ]
        status = b"fwd=" + lookup.fwd.encode()
        if head.status != 200 or lookup.stale is not None:
            status += b"; fwd-status=%d" % head.status
        if reason is None:
            status += b"; stored"
        if cache.config.enabled:  # (compression alone: no cache to report on)
            out.append((b"cache-status", cache.status_name + b"; " + status))
        exchange.record.cache = (
            "miss" if reason is None else ("bypass" if lookup.bypass else "pass")
        )
        length = head.content_length
        coding = lookup.coding
        config = cache.compression
        compress = config.enabled and compressible(head.status, fields, config)
        if compress:
            out = with_vary(out, b"Accept-Encoding")
        if compress and coding is not None and not lookup.head_only:
            self.encoder = Encoder(coding, config)
            if self.parts is not None:
                self.encoded_parts = []
            out = encoded_fields(out, coding)
            length = None
        no_body = lookup.head_only or head.status in (204, 304)
        if no_body:
            return make_head(head.status, head.reason, out, length=length)
        self.chunk = length is None and lookup.frame_h1 and not lookup.http10
        if length is None and not lookup.frame_h1:
            return make_head(head.status, head.reason, out, length=None, chunked=True)
        return make_head(head.status, head.reason, out, length=length, chunked=self.chunk)
