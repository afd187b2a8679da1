"""An exchange's tunnel stream and the response read from it: the upstream side.

An exchange (:mod:`edge.exchange`) opens a tunnel stream for its request
(PROTOCOL.md §6.7: a stream is one request); an :class:`Upstream` is that
stream's protocol. It reads the response (:class:`edge.http1.ResponseReader`),
hands each part of it to the front end, follows the backend's WebSocket
frames once upgraded, and ends the stream when the response is complete,
RESET IDLE when the backend connection may serve another request (§6.5.1,
:func:`edge.exchange_rules.end_code`). A stream that breaks is a fault of the
exchange's to weigh (:meth:`UpstreamOwner.fail`).

Only :mod:`edge.exchange` imports this module, so what an upstream needs of
its exchange is spelled out here (:class:`UpstreamOwner`) rather than
imported (no import circle).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

from edge.exchange_rules import Fault, end_code
from edge.exchange_websocket import WebSocketClose, relay
from edge.http1 import (
    BackendClosed,
    ResponseBodyReceived,
    ResponseCompleted,
    ResponseHeadReceived,
    ResponseInvalid,
    ResponseReader,
    TunnelBytes,
    WebSocketAccepted,
    WebSocketRefused,
)
from edge.request_record import RequestRecord
from edge.ws_frames import FrameTracker
from tunnel.aio.errors import StreamResetError
from tunnel.mux import ErrorCode

if TYPE_CHECKING:
    from tunnel.aio.stream import TunnelStream

__all__ = ["Upstream", "UpstreamOwner"]


class UpstreamOwner(Protocol):
    """What an upstream needs of its exchange (edge.exchange.Exchange)."""

    client: Any
    """The front end, an :class:`edge.exchange.ExchangeClient`: its calls
    take the exchange, which this module does not import."""
    record: RequestRecord
    upstream: Upstream | None
    """The exchange's current upstream; it lets go of one by setting another or None."""
    upgraded: bool
    request_whole: bool
    upstream_active_at: float
    ws_closing: WebSocketClose | None

    def fail(self, fault: Fault, *, code: int | None = None, reason: str) -> None: ...
    def finish(self) -> None: ...
    def websocket_opened(self) -> None: ...


class Upstream(asyncio.Protocol):
    """One tunnel stream of an exchange and the response read from it.

    Owns the stream (its transport, set before the tunnel's ``open_stream``
    returns), the response's framing (a reader of its own: a replay reads its
    response afresh on a new upstream), the backend's WebSocket frames from
    the 101 on, and the response's entries in the record (first byte, status,
    protocol, a backend's Close).

    Invariants: only the exchange's current upstream is heard; what reaches
    one it let go of (ended, dropped, replaced by a replay) is ignored. The
    events of one read reach the front end in order, between
    :meth:`edge.exchange.ExchangeClient.writes_begin` and ``writes_end``, and
    stop as soon as the exchange lets go (the read's batch is still closed).
    A complete response lets go of the stream, ends it with
    :func:`edge.exchange_rules.end_code` and finishes the exchange, in that
    order.
    """

    __slots__ = ("client", "exchange", "reader", "record", "response_done", "stream", "ws_down")

    stream: TunnelStream
    """Set by :meth:`connection_made`, which the tunnel calls before its
    ``open_stream`` returns: an exchange never holds an upstream without it."""

    def __init__(self, exchange: UpstreamOwner, reader: ResponseReader) -> None:
        self.exchange = exchange
        self.client = exchange.client
        self.record = exchange.record
        self.reader = reader
        self.response_done = False
        self.ws_down: FrameTracker | None = None  # the backend's frames, once upgraded

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.stream = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange.upstream is not self:
            return
        exchange.upstream_active_at = time.monotonic()
        client = self.client
        client.writes_begin()
        try:
            for event in self.reader.feed(data):
                if exchange.upstream is not self:
                    return
                self._on_event(event)
        finally:
            client.writes_end()

    def eof_received(self) -> bool:
        exchange = self.exchange
        if exchange.upstream is not self:
            return True
        if exchange.upgraded:
            self.client.upstream_ended(exchange)
            return True
        for event in self.reader.feed_eof():
            if exchange.upstream is not self:
                break
            self._on_event(event)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        exchange = self.exchange
        if exchange.upstream is not self:
            return
        exchange.upstream = None
        if exc is None:  # ended both ways: an upgraded stream, or a close-delimited body
            if not self.response_done and not exchange.upgraded:
                exchange.fail(Fault.BACKEND_CLOSED, reason="stream ended without a response")
                return
            exchange.finish()
            return
        code = exc.code if isinstance(exc, StreamResetError) else ErrorCode.INTERNAL_ERROR
        exchange.fail(Fault.RESET, code=code, reason=f"stream reset: {ErrorCode.name_of(code)}")

    def pause_writing(self) -> None:
        if self.exchange.upstream is self:
            self.client.pause_request(self.exchange)

    def resume_writing(self) -> None:
        if self.exchange.upstream is self:
            self.client.resume_request(self.exchange)

    def _on_event(self, event: object) -> None:
        kind = type(event)
        client = self.client
        exchange = self.exchange
        if kind is ResponseBodyReceived or kind is TunnelBytes:
            data = event.data  # type: ignore[attr-defined]
            frames = self.ws_down
            if frames is not None:
                data = relay(frames, exchange.ws_closing, data, self.record, to_backend=False)
            if data:
                client.response_data(exchange, data)
        elif kind is ResponseHeadReceived:
            record = self.record
            if not record.first_byte:
                record.first_byte = time.monotonic()
            if event.status >= 200:  # type: ignore[attr-defined]
                record.status = event.status  # type: ignore[attr-defined]
            client.response_head(exchange, event)
        elif kind is ResponseCompleted:
            self.response_done = True
            client.response_complete(exchange, event.close_after, event.trailers)  # type: ignore[attr-defined]
            if exchange.upstream is self:
                exchange.upstream = None
                stream = self.stream
                stream.abort(
                    end_code(
                        request_whole=exchange.request_whole,
                        at_boundary=self.reader.at_boundary,
                        queued_up=stream.get_write_buffer_size(),
                    )
                )
            exchange.finish()
        elif kind is WebSocketAccepted:
            exchange.upgraded = True
            self.ws_down = FrameTracker()
            record = self.record
            record.protocol = "ws"
            record.status = 101
            client.upgraded(exchange)
            exchange.websocket_opened()
        elif kind is WebSocketRefused:
            exchange.fail(Fault.INVALID, reason="backend answered the upgrade with a bad handshake")
        elif kind is ResponseInvalid:
            exchange.fail(Fault.INVALID, reason=f"invalid response: {event.reason}")  # type: ignore[attr-defined]
        elif kind is BackendClosed and (event.before_response or event.mid_response):  # type: ignore[attr-defined]
            exchange.fail(Fault.BACKEND_CLOSED, reason="backend closed its connection")
