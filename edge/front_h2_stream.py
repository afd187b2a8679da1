"""One stream of an HTTP/2 client connection: its request's reader and the
client its exchange talks to.

A :class:`ClientStream` is what :class:`edge.exchange.Exchange` gets as its
client (:class:`edge.exchange.ExchangeClient`): the exchange calls it
directly, the way an HTTP/1.1 exchange calls its connection. It owns the
stream's side of flow control both ways:

- the request: client DATA is credited back (``WINDOW_UPDATE``) only once the
  exchange took it and while the exchange has not paused the request
  (:meth:`ClientStream.pause_request`), so a slow origin stops the upload;
- the response: DATA leaves only within the client's stream and connection
  windows; the rest waits in :attr:`ClientStream.out`, and past
  :data:`RESPONSE_BUFFER` the exchange is paused until it drains.

What the streams of a connection share (the ``h2`` state machine, the
batched output, the ledger, the table of open streams) is the connection's
:class:`edge.front_h2_session.H2Session`, seen here as :class:`StreamHost`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Protocol

import h2.errors
import h2.exceptions

from edge.exchange import Exchange, RequestRecord
from edge.h2_engine import ServerConnection
from edge.h2_translate import response_fields, response_trailers
from edge.http1 import RequestReader, ResponseHeadReceived
from edge.http1.events import Headers
from edge.ledger import OutputLedger

if TYPE_CHECKING:
    from edge.cache.responses import PlainHit

__all__ = ["RESPONSE_BUFFER", "ClientStream", "StreamHost"]

log = logging.getLogger("geoedge.edge")

#: Response bytes a stream keeps here for a client window before it pauses its exchange.
RESPONSE_BUFFER = 256 * 1024

_SEND_FAILED = (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError)


class StreamHost(Protocol):
    """What a stream uses of its connection (:class:`edge.front_h2_session.H2Session`)."""

    conn: ServerConnection
    ledger: OutputLedger[RequestRecord]
    hsts: bytes | None
    batching: int
    flush_soon: bool
    write_paused: bool

    def flush(self) -> None: ...
    def flush_deferred(self) -> None: ...
    def stream_done(self, stream_id: int) -> None:
        """Take the stream out of the table (it is settled); close if that was the last."""


class ClientStream:
    """One HTTP/2 stream, its request's reader and exchange, and that exchange's client.

    Invariants:

    - ``out_bytes`` is the length of what waits in ``out``; nothing waits, is
      sent or is reset once ``closed`` (reset, ended, or found closed by h2);
    - ``end_pending``: the response is complete and END_STREAM goes out with
      the last of ``out``;
    - ``unacked`` request octets are credited back while not
      ``request_paused``, and all at once when the stream closes: h2 then
      gives them to the connection's window alone, which the other streams
      would otherwise lose for good;
    - ``body_left``: what the request's ``content-length`` still allows
      (None without one); the request side (:mod:`edge.front_h2_requests`)
      resets the stream when DATA overruns it or the stream ends short of it;
    - ``blocked_since`` is set while a response waits for the client's window
      (0 otherwise), for the connection's send-timeout sweep;
    - :meth:`settle` logs the request once, when the stream is done both here
      (closed, or all sent) and at its exchange (``exchange`` is None), and
      takes it out of the connection's table.
    """

    __slots__ = (
        "blocked_since",
        "body_left",
        "chunked",
        "client_active_at",
        "closed",
        "delivering",
        "end_pending",
        "exchange",
        "out",
        "out_bytes",
        "reader",
        "record",
        "request_paused",
        "request_trailers",
        "response_trailers",
        "session",
        "stream_id",
        "unacked",
        "websocket",
    )

    def __init__(
        self,
        session: StreamHost,
        stream_id: int,
        reader: RequestReader,
        *,
        chunked: bool,
        websocket: bool,
        now: float,
        body_left: int | None = None,
    ) -> None:
        self.session = session
        self.stream_id = stream_id
        self.reader = reader
        self.chunked = chunked  # the request's DATA is sent up chunk-framed
        self.body_left = body_left
        self.request_trailers = b""  # the request's trailer fields, as HTTP/1.1 field lines
        self.response_trailers: list[tuple[bytes, bytes]] = []  # sent after the body
        self.websocket = websocket  # an RFC 8441 extended CONNECT
        self.exchange: Exchange | None = None
        self.record: RequestRecord | None = None
        self.unacked = 0  # request octets received, not yet credited back
        self.request_paused = False
        self.out: deque[bytes] = deque()
        self.out_bytes = 0
        self.end_pending = False  # END_STREAM to send once ``out`` is sent
        self.closed = False  # reset or ended: nothing more is sent on it
        self.delivering = False  # inside the exchange's writes_begin/writes_end
        self.client_active_at = now
        self.blocked_since = 0.0  # 0: not waiting for the client's window

    # -- edge.exchange.ExchangeClient -------------------------------------------------

    def writes_begin(self) -> None:
        # Body bytes delivered from here on are sent at writes_end (or with the
        # response's end), so that the last DATA frame can carry END_STREAM.
        self.delivering = True
        self.session.batching += 1

    def writes_end(self) -> None:
        # The responses of several streams often come out of one read of the
        # tunnel, each in its own writes_begin/end: what they queued goes out
        # once this turn of the event loop is over, as one write (one TLS
        # record, one send) instead of one per stream.
        self.delivering = False
        if self.out and not self.closed:
            self.pump()
        session = self.session
        session.batching -= 1
        if not session.batching and not session.flush_soon:
            session.flush_soon = True
            asyncio.get_running_loop().call_soon(session.flush_deferred)

    def response_head(self, exchange: Exchange, head: ResponseHeadReceived) -> None:
        if self.closed:
            return
        if head.informational and head.status != 101:
            self.send_headers([(b":status", b"%d" % head.status)])
            return
        hsts = self.session.hsts if head.status != 101 or self.websocket else None
        fields = response_fields(
            head.status,
            head.headers,
            websocket=self.websocket,
            extra=hsts,
            nominated=head.nominated,
        )
        record = exchange.record
        if record.request_id and not head.forwards_request_id:
            fields.append((b"x-request-id", record.request_id.encode()))
        self.send_headers(fields)
        if self.record is not None:
            self.record.bytes_out += len(head.head)

    def response_data(self, exchange: Exchange, data: bytes) -> None:
        if self.closed or not data:
            return
        self.out.append(data)
        self.out_bytes += len(data)
        if not self.delivering:
            self.pump()

    def response_complete(self, exchange: Exchange, close: bool, trailers: Headers = ()) -> None:
        if trailers:
            self.response_trailers = response_trailers(trailers)
        self.end_pending = True
        self.pump()

    def upgraded(self, exchange: Exchange) -> None:
        """The WebSocket is open: DATA carries its frames both ways from now on."""

    def upstream_ended(self, exchange: Exchange) -> None:
        self.response_complete(exchange, True)

    def answer(self, exchange: Exchange, status: int) -> None:
        self.respond(status)

    def cut(self, exchange: Exchange) -> None:
        self.reset(h2.errors.ErrorCodes.INTERNAL_ERROR)

    def pause_request(self, exchange: Exchange) -> None:
        self.request_paused = True

    def resume_request(self, exchange: Exchange) -> None:
        self.request_paused = False
        self.credit()
        self.session.flush()

    def exchange_finished(self, exchange: Exchange) -> None:
        self.exchange = None
        if not exchange.request_whole and not self.closed and not self.end_pending:
            self.reset(h2.errors.ErrorCodes.CANCEL)
        self.settle()

    # -- the request ------------------------------------------------------------------

    def credit(self) -> None:
        """Give the client back the window its request DATA used (once the
        stream is closed, the connection's alone)."""
        if self.unacked:
            unacked, self.unacked = self.unacked, 0
            try:
                self.session.conn.acknowledge_received_data(unacked, self.stream_id)
            except h2.exceptions.StreamClosedError:
                pass

    # -- the response -----------------------------------------------------------------

    def send_headers(self, fields: list[tuple[bytes, bytes]]) -> None:
        session = self.session
        record = self.record
        if record is not None and record.out_start < 0:
            record.out_start = session.ledger.queued
        try:
            session.conn.send_headers(self.stream_id, fields, end_stream=False)
        except _SEND_FAILED as exc:
            log.debug("could not send a response head on stream %d: %s", self.stream_id, exc)
            self.closed = True
        session.flush()

    def pump(self) -> None:
        """Send what the client's windows allow; pause the exchange while its
        response waits here, resume it when it has room again."""
        session = self.session
        conn = session.conn
        stream_id = self.stream_id
        out = self.out
        ended = False  # END_STREAM went out on the last DATA frame
        while out and not self.closed:
            try:
                window = conn.local_flow_control_window(stream_id)
            except _SEND_FAILED:
                self.closed = True
                break
            size = min(window, conn.max_outbound_frame_size)
            if size <= 0:
                break
            chunk = out[0]
            if len(chunk) > size:
                out[0] = chunk[size:]
                chunk = chunk[:size]
            else:
                out.popleft()
            self.out_bytes -= len(chunk)
            ended = not out and self.end_pending and not self.response_trailers
            conn.send_data(stream_id, chunk, end_stream=ended)
            if self.record is not None:
                self.record.bytes_out += len(chunk)
        exchange = self.exchange
        if out and not self.closed:
            self.blocked_since = self.blocked_since or time.monotonic()
            if exchange is not None and self.out_bytes >= RESPONSE_BUFFER:
                exchange.pause_response()
        else:
            self.blocked_since = 0.0
            if exchange is not None and exchange.response_paused and not session.write_paused:
                exchange.resume_response()  # may deliver, queue and pump again, here
            if self.end_pending and not self.closed and not out:
                self.end_pending = False
                if not ended:
                    try:
                        if self.response_trailers:  # HEADERS with END_STREAM
                            conn.send_headers(stream_id, self.response_trailers, end_stream=True)
                        else:
                            conn.end_stream(stream_id)
                    except _SEND_FAILED:
                        pass
                self.closed = True
                self.settle()
        session.flush()

    def respond(self, status: int) -> None:
        """The edge's own answer on this stream (nothing of a response went out)."""
        record = self.record
        body = f"{status} {_phrase(status)}\n".encode()
        fields = [
            (b":status", b"%d" % status),
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", b"%d" % len(body)),
            (b"cache-control", b"no-store"),
        ]
        if record is not None:
            record.status = status
            if record.request_id:
                fields.append((b"x-request-id", record.request_id.encode()))
        hsts = self.session.hsts
        if hsts is not None:
            name, _, value = hsts.partition(b":")
            fields.append((name.strip().lower(), value.strip()))
        self.send_headers(fields)
        self.out.append(body)
        self.out_bytes += len(body)
        self.end_pending = True
        self.pump()
        if self.exchange is None:
            self.settle()

    def answer_hit(self, hit: PlainHit) -> None:
        """Answer with a stored response (:meth:`edge.cache.cache.EdgeCache.plain_hit`),
        with the fields :meth:`response_head` adds; no exchange."""
        record = self.record
        assert record is not None  # set by the request side before it asks the cache
        record.status = hit.status
        record.first_byte = time.monotonic()
        fields = response_fields(hit.status, hit.fields, websocket=False, extra=self.session.hsts)
        if record.request_id:
            fields.append((b"x-request-id", record.request_id.encode()))
        self.send_headers(fields)
        record.bytes_out += len(hit.raw_head())  # as response_head counts a head
        if hit.body:
            self.out.append(hit.body)
            self.out_bytes += len(hit.body)
        self.end_pending = True
        self.pump()
        self.settle()

    # -- endings ----------------------------------------------------------------------

    def reset(self, code: int) -> None:
        """RST_STREAM with ``code``, dropping what waits to be sent."""
        if not self.closed:
            self.closed = True
            self.out.clear()
            self.out_bytes = 0
            session = self.session
            try:
                session.conn.reset_stream(self.stream_id, code)
            except _SEND_FAILED:
                pass
            self.credit()
            session.flush()

    def forget(self, outcome: str, reason: str = "") -> None:
        """The stream is reset (by the client, or by us for ``reason``): nothing
        more goes out on it. A response its exchange had finished but that was
        not all sent here (``end_pending``) is logged with ``outcome``, as the
        exchange logs one it cuts."""
        self.closed = True
        self.out.clear()
        self.out_bytes = 0
        self.credit()
        if self.exchange is not None:
            self.exchange.cancel(outcome, reason)
            return
        record = self.record
        if self.end_pending and record is not None and record.outcome == "ok":
            record.outcome, record.reason = outcome, reason
        self.settle()

    def settle(self) -> None:
        """Log the stream's request once it is done both here and at its exchange."""
        if self.exchange is not None or not (self.closed or not self.out):
            return
        if not self.closed and self.end_pending:
            return
        session = self.session
        record, self.record = self.record, None
        if record is not None:
            if record.out_start >= 0:
                record.out_end = session.ledger.queued
            session.ledger.done(record, flush_now=not session.batching)
        session.stream_done(self.stream_id)


def _phrase(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
