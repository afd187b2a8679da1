"""The response side of one HTTP/1.1 client connection: what goes to the client.

:class:`Http1Responses` is the :class:`edge.exchange.ExchangeClient` every
exchange of one connection calls (the connection's request side,
:class:`edge.front_h1_requests.Http1Requests`, hands it to each), and the only
part that acts on the client transport once the connection is set up: it
writes the responses, the edge's own answers (rejections, redirects), pauses
and resumes reading, and closes.

- **The client's framing.** Response heads are forwarded as the backend wrote
  them, except: ``Connection: close`` when the client asked to close (its
  request went up keep-alive) or the worker drains, the backend's ``Connection`` fields dropped
  when only the backend connection closes and the response is framed by
  length or chunks (the client's stays open: the next request takes another
  stream), and the edge's own fields (HSTS, ``X-Request-Id``).
- **One write per read.** What an exchange writes between
  :meth:`~Http1Responses.writes_begin` and :meth:`~Http1Responses.writes_end`
  (one read of its stream) goes out as one write (one TLS record).
- **The count** (:mod:`edge.ledger`): every octet written is counted where its
  response starts and ends, and a request is logged once it is out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from edge.deadlines import Phase
from edge.exchange import Exchange, RequestRecord
from edge.http1 import (
    RequestReader,
    ResponseHeadReceived,
    client_head,
    closing_head,
    error_response,
    with_field,
    with_fields,
)
from edge.http1.events import Headers
from edge.ledger import OutputLedger
from geoedge.logs import LogThrottle

if TYPE_CHECKING:
    from edge.cache.responses import PlainHit

__all__ = ["PAUSED_BY_EXCHANGE", "PAUSED_BY_HOLD", "Http1Responses", "RequestSide"]

throttled = LogThrottle(logging.getLogger("geoedge.edge"))

#: Why client reading is paused (a bit each): it resumes when no reason is left.
#: An exchange's stream is full (or it waits for a tunnel); requests are held
#: behind the exchange in progress.
PAUSED_BY_EXCHANGE, PAUSED_BY_HOLD = 1, 2


class RequestSide(Protocol):
    """What the response side asks of its connection's request side
    (:class:`edge.front_h1_requests.Http1Requests`)."""

    exchange: Exchange | None
    reader: RequestReader
    phase: Phase

    @property
    def draining(self) -> bool: ...

    def hold(self, events: list[Any]) -> None:
        """Keep ``events`` until the exchange in progress ends."""

    def exchange_ended(self, exchange: Exchange) -> None:
        """``exchange`` finished and is logged: the next request's turn, or the close."""


class Http1Responses:
    """The response side of one HTTP/1.1 client connection; see the module docstring.

    Owns the client transport's writes, its reading pauses and its close;
    ``close_after`` (close once the exchange in progress ends) and ``closing``.
    Invariants: once ``closing``, nothing more is written and reading is never
    resumed; ``close_after`` once set stays set (the connection closes);
    ``ledger.queued`` is the sum of what was handed to the transport or to the
    batch; a batch exists only between ``writes_begin`` and ``writes_end`` (or
    a close, which writes it first).

    The request side holds this part (and hands it to every exchange); this
    part reaches back to it through ``requests``, a weak proxy, or the two
    would be a reference cycle outliving the connection (see
    :mod:`edge.ledger`).
    """

    __slots__ = (
        "_batch",
        "_client_ip",
        "_hsts",
        "_paused",
        "close_after",
        "closing",
        "ledger",
        "requests",
        "transport",
    )

    def __init__(
        self,
        transport: asyncio.Transport,
        ledger: OutputLedger[RequestRecord],
        hsts: bytes | None,
        client_ip: str,
    ) -> None:
        self.transport = transport
        self.ledger = ledger
        self._hsts = hsts
        self._client_ip = client_ip
        self.requests: RequestSide  # set by the request side that owns this part
        self._batch: list[bytes] | None = None
        self._paused = 0
        self.close_after = False
        self.closing = False

    # -- edge.exchange.ExchangeClient -------------------------------------------------

    def writes_begin(self) -> None:
        if self._batch is None:
            self._batch = []

    def writes_end(self) -> None:
        batch, self._batch = self._batch, None
        if batch and not self.closing:
            self.transport.write(batch[0] if len(batch) == 1 else b"".join(batch))
        self.ledger.check()

    def response_head(self, exchange: Exchange, head: ResponseHeadReceived) -> None:
        data = head.head
        record = exchange.record
        if not head.informational:
            if exchange.websocket_key is not None:  # the backend refused the upgrade
                requests = self.requests
                requests.hold(requests.reader.upgrade_refused())
            # The backend's persistence fields speak of the origin's pooled
            # connection; the client's own goes by its request and the framing.
            first: list[bytes] = []  # the edge's fields, at the head's top, in this order
            if record.request_id and not head.forwards_request_id:
                first.append(b"X-Request-Id: " + record.request_id.encode())
            if self._hsts is not None:
                first.append(self._hsts)
            if not record.keep_alive or head.close_delimited or self.requests.draining:
                # A close-delimited body ends where the client's connection does;
                # a draining worker closes after the request in hand.
                data = with_fields(closing_head(data, head.nominated), first)
                self.close_after = True
            else:
                if record.announce_keep_alive:
                    first.append(b"Connection: keep-alive")
                data = client_head(data, head.headers, head.nominated, first)
        self.write_response(record, data)

    def response_data(self, exchange: Exchange, data: bytes) -> None:
        self.write_response(exchange.record, data)

    def response_complete(self, exchange: Exchange, close: bool, trailers: Headers = ()) -> None:
        # ``trailers`` is always empty here: a chunked body (trailers included)
        # passes through raw.
        if not exchange.request_whole:
            self.close_after = True  # the rest of the request body is unread

    def upgraded(self, exchange: Exchange) -> None:
        requests = self.requests
        requests.phase = Phase.TUNNEL
        held = requests.reader.upgrade_accepted()
        if held:
            exchange.send_tunnel(held)

    def upstream_ended(self, exchange: Exchange) -> None:
        self.close()  # TLS has no half-close: the tunnel ends here

    def answer(self, exchange: Exchange, status: int) -> None:
        record = exchange.record
        self.close_after = True
        self.write_response(record, error_response(status, request_id=record.request_id or None))

    def cut(self, exchange: Exchange) -> None:
        throttled.info("closing %s: %s", self._client_ip, exchange.record.reason)
        self.closing = True
        self.transport.abort()

    def pause_request(self, exchange: Exchange) -> None:
        self.pause_reading(PAUSED_BY_EXCHANGE)

    def resume_request(self, exchange: Exchange) -> None:
        self.resume_reading(PAUSED_BY_EXCHANGE)

    def exchange_finished(self, exchange: Exchange) -> None:
        record = exchange.record
        if record.answered:
            record.out_end = record.out_start + record.bytes_out
        self.ledger.done(record, flush_now=self._batch is None)
        self.requests.exchange_ended(exchange)

    # -- writing, answering, closing ---------------------------------------------------

    def write_response(self, record: RequestRecord, data: bytes) -> None:
        """Write ``data`` of ``record``'s response (into the batch, if one is open)."""
        if record.out_start < 0:
            record.out_start = self.ledger.queued
        record.bytes_out += len(data)
        if self.closing:
            return
        self.ledger.queued += len(data)
        if self._batch is not None:
            self._batch.append(data)
        else:
            self.transport.write(data)

    def answer_hit(self, record: RequestRecord, hit: PlainHit) -> None:
        """Write a stored response (:meth:`edge.cache.cache.EdgeCache.plain_hit`)
        as the whole answer to ``record``'s request, with the fields
        :meth:`response_head` adds to a response the connection outlives,
        and log it once sent."""
        record.status = hit.status
        record.first_byte = time.monotonic()
        added = b""
        if record.request_id:
            added = b"X-Request-Id: " + record.request_id.encode() + b"\r\n"
        if self._hsts is not None:
            added += self._hsts + b"\r\n"
        self.write_response(record, hit.raw_head(added) + hit.body)
        record.out_end = record.out_start + record.bytes_out
        self.ledger.done(record, flush_now=self._batch is None)

    def answer_own(self, record: RequestRecord) -> None:
        """Answer with the edge's own error response for ``record.status`` (a
        request that never went up), log it once sent, and close."""
        response = error_response(record.status, request_id=record.request_id or None)
        self.answer_with(
            record, response if self._hsts is None else with_field(response, self._hsts)
        )

    def answer_with(self, record: RequestRecord, data: bytes) -> None:
        """Write the edge's own answer ``data``, log it once sent, and close."""
        self.write_response(record, data)
        record.out_end = record.out_start + record.bytes_out
        self.ledger.done(record, flush_now=self._batch is None)
        self.close()

    def pause_reading(self, reason: int) -> None:
        if not self._paused:
            self.transport.pause_reading()
        self._paused |= reason

    def resume_reading(self, reason: int) -> None:
        if not self._paused & reason:
            return
        self._paused &= ~reason
        if not self._paused and not self.closing:
            self.transport.resume_reading()

    def close(self) -> None:
        """Close the connection (after what is batched): the exchange in
        progress, if any, is cancelled; idempotent."""
        if self.closing:
            return
        if self._batch:  # what one read produced goes out before the close
            self.writes_end()
        self.closing = True
        exchange = self.requests.exchange
        if exchange is not None:
            exchange.cancel("client_closed")
        self.transport.close()
