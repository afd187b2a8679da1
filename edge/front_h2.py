"""The HTTP/2 front end: one client connection, each of its streams one exchange.

The ``h2`` library (python-hyper) owns the HTTP/2 state machine, HPACK and
flow-control arithmetic; this module is the adapter between it, the client's
transport and the exchanges (:mod:`edge.exchange`), which carry each request
on its own tunnel stream (PROTOCOL.md §6.7). Requests are translated to
HTTP/1.1 and go through the same reader, rules and rewriting as HTTP/1.1
clients' (:mod:`edge.h2_translate`); responses come back as HTTP/2 fields and
DATA.

Flow control end to end:

- request bodies: a client's DATA is acknowledged (``WINDOW_UPDATE``) only
  once its exchange took it, and not while the exchange's tunnel stream is
  above its high-water mark, so a slow origin stops the browser's upload;
- responses: DATA is sent only within the client's stream and connection
  windows; what does not fit waits here (at most what the tunnel stream
  delivered before the exchange paused it) and the exchange stops reading
  its tunnel stream, so a background tab that stops reading stops the origin.

What the known HTTP/2 attacks cost, bounded (counted per connection over
:data:`FLOOD_WINDOW_S`; past a bound the connection gets GOAWAY
ENHANCE_YOUR_CALM and closes):

- rapid reset (CVE-2023-44487): streams the client resets;
- SETTINGS, PING and PRIORITY floods, and empty DATA frames;
- CONTINUATION floods (CVE-2024-27316) and HPACK bombs: ``h2`` keeps at most
  64 CONTINUATION frames and enforces our ``max_header_list_size``
  (``http.limits.max_header_bytes``);
- too many streams: ``max_concurrent_streams`` (``http.h2_max_concurrent_streams``);
- zero-window stalls: a stream whose response cannot move for
  ``send_timeout_s`` is reset, and the TLS transport cuts a connection that
  takes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack
import hyperframe.frame

from edge.deadlines import Deadlines
from edge.exchange import Exchange, RequestRecord
from edge.h2_translate import response_fields, translate_request
from edge.http1 import (
    ClientContext,
    RequestBodyReceived,
    RequestCompleted,
    RequestHeadReceived,
    RequestReader,
    RequestRejected,
    ResponseHeadReceived,
)
from edge.ledger import OutputLedger
from edge.services import ClientFacts, EdgeServices
from edge.stream_metadata import connection_metadata, peer_address
from edge.ws_frames import CLOSE_GOING_AWAY
from geoedge.logs import LogThrottle

__all__ = ["Http2Connection"]

log = logging.getLogger("geoedge.edge")
throttled = LogThrottle(log)

#: Flood counters are per connection over this many seconds.
FLOOD_WINDOW_S = 10.0
#: Per window: streams the client resets, SETTINGS, PINGs, PRIORITY frames,
#: empty DATA frames. Generous for browsers (a tab closing resets its
#: streams), far below what the attacks need.
MAX_CLIENT_RESETS = 400
MAX_SETTINGS = 100
MAX_PINGS = 100
MAX_PRIORITY = 2000
MAX_EMPTY_DATA = 1000
#: The window a request body may use on a stream, and on the connection.
STREAM_WINDOW = 1024 * 1024
CONNECTION_WINDOW = 4 * 1024 * 1024
#: Response bytes a stream keeps here for a client window before it pauses its exchange.
RESPONSE_BUFFER = 256 * 1024

_ENHANCE_YOUR_CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


def _release_h2(conn: h2.connection.H2Connection) -> None:
    """Break the reference cycle every ``H2Connection`` is: its frame handlers
    are its own bound methods, kept in a dict it owns. The daemons almost never
    run a full collection (:mod:`geoedge.memory`), so without this each
    closed connection, its streams and HPACK tables would live until restart
    (~100 objects per connection, found by ``tests/integration/test_memory.py``).
    Only the receive path uses the table, and a lost connection receives nothing."""
    table = getattr(conn, "_frame_dispatch_table", None)
    if isinstance(table, dict):
        table.clear()


class _LiteralEncoder(hpack.Encoder):
    """HPACK without Huffman coding of literals. hpack's Huffman coder is pure
    Python: a response head with a request id and a date took 32 us to encode
    with it and 11 without (timeit, this machine), for ~25 octets saved per
    response; the dynamic table still indexes repeated fields."""

    def encode(self, headers: object, huffman: bool = False) -> bytes:
        return super().encode(headers, huffman=False)  # type: ignore[arg-type]


@dataclass(slots=True, eq=False)
class _Stream:
    """One HTTP/2 stream of the connection and its exchange."""

    stream_id: int
    reader: RequestReader
    chunked: bool = False
    websocket: bool = False
    exchange: Exchange | None = None
    record: RequestRecord | None = None
    unacked: int = 0  # request octets received, not yet credited back
    request_paused: bool = False
    out: deque[bytes] = field(default_factory=deque)
    out_bytes: int = 0
    end_pending: bool = False  # END_STREAM to send once ``out`` is sent
    closed: bool = False  # reset or ended: nothing more is sent on it
    client_active_at: float = 0.0
    blocked_since: float = 0.0  # 0: not waiting for the client's window


class Http2Connection(asyncio.Protocol):
    """One HTTP/2 client connection; see the module docstring."""

    def __init__(
        self,
        services: EdgeServices,
        *,
        trusted: bool,
        client_address: tuple[str, int] | None = None,
    ) -> None:
        self.services = services
        self._trusted = trusted
        self._client_address = client_address
        self._hsts = services.hsts_field
        self.facts = ClientFacts("https")
        self.transport: asyncio.Transport | None = None
        self.client_ip = ""
        self._metadata = b""
        self._context: ClientContext | None = None
        limits = services.http_limits
        config = h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_inbound_headers=True
        )
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.encoder = _LiteralEncoder()
        codes = h2.settings.SettingCodes
        self.conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                codes.MAX_CONCURRENT_STREAMS: services.http.h2_max_concurrent_streams,
                codes.MAX_HEADER_LIST_SIZE: limits.max_header_bytes,
                codes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                codes.ENABLE_CONNECT_PROTOCOL: 1,
            },
        )
        self.conn.decoder.max_header_list_size = limits.max_header_bytes
        self._streams: dict[int, _Stream] = {}
        self.ledger = OutputLedger(self._log)
        self._closing = False
        self._going_away = False
        self._batching = 0
        self._flush_soon = False
        self._write_paused = False
        self._opened_at = time.monotonic()
        self._last_stream_at = self._opened_at
        self._streams_seen = 0
        self._window_start = self._opened_at
        self._counts = {"resets": 0, "settings": 0, "pings": 0, "priority": 0, "empty": 0}

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.ledger.attach(self.transport)  # type: ignore[arg-type]
        services = self.services
        peer = self._client_address or peer_address(transport.get_extra_info("peername"))
        local = peer_address(transport.get_extra_info("sockname"))
        self._metadata = connection_metadata(transport, peer, local, services.edge_id, alpn="h2")
        self._context = ClientContext(
            client_ip=peer[0] if peer else "0.0.0.0",
            client_port=peer[1] if peer else 0,
            trusted_proxy=self._trusted,
            scheme="https",
            server_port=local[1] if local else 443,
        )
        self.client_ip = self._context.client_ip
        self.facts = ClientFacts.of(transport, alpn="h2")
        services.connection_opened(self, self.facts)
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:  # h2 queued its GOAWAY
            throttled.info("HTTP/2 protocol error from %s: %s", self.client_ip, exc)
            self.services.count_error("h2_protocol_error")
            self._flush()
            self._close()
            return
        if self._closing:
            return
        self._batching += 1
        try:
            for event in events:
                self._on_event(event)
                if self._closing:
                    return
        finally:
            self._batching -= 1
            self._flush()

    def eof_received(self) -> bool:
        self._close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        for stream in list(self._streams.values()):
            if stream.exchange is not None:
                stream.exchange.cancel("client_closed")
        self._streams.clear()
        self.ledger.settle(final=True)
        self.services.connection_closed(self)
        _release_h2(self.conn)

    def pause_writing(self) -> None:
        self._write_paused = True
        for stream in self._streams.values():
            if stream.exchange is not None:
                stream.exchange.pause_response()

    def resume_writing(self) -> None:
        self._write_paused = False
        for stream in list(self._streams.values()):
            if stream.exchange is not None and stream.out_bytes < RESPONSE_BUFFER:
                stream.exchange.resume_response()

    # -- client events ----------------------------------------------------------------

    def _on_event(self, event: object) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._on_request(event)
        elif isinstance(event, h2.events.DataReceived):
            self._on_data(event)
        elif isinstance(event, h2.events.StreamEnded):
            self._on_stream_ended(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self._count("resets", MAX_CLIENT_RESETS)
            self._forget(event.stream_id, "client_closed")
        elif isinstance(event, h2.events.WindowUpdated):
            self._on_window(event.stream_id)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._count("settings", MAX_SETTINGS)
        elif isinstance(event, h2.events.PingReceived):
            self._count("pings", MAX_PINGS)
        elif isinstance(event, h2.events.PriorityUpdated):
            self._count("priority", MAX_PRIORITY)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._going_away = True  # the client's GOAWAY: finish what is open
            self._close_if_done()

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        services = self.services
        self._streams_seen += 1
        self._last_stream_at = time.monotonic()
        if self._going_away or services.draining:
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        translated = translate_request(
            list(event.headers), ends_stream=event.stream_ended is not None
        )
        reader = RequestReader(services.http_limits, self._context, services.new_request_id)  # type: ignore[arg-type]
        stream = _Stream(stream_id, reader, translated.chunked, translated.websocket)
        stream.client_active_at = self._last_stream_at
        self._streams[stream_id] = stream
        self._dispatch(stream, reader.feed(translated.head))
        if event.stream_ended is not None and stream_id in self._streams:
            self._on_stream_ended(stream_id)

    def _dispatch(self, stream: _Stream, events: list[object]) -> None:
        for event in events:
            kind = type(event)
            if kind is RequestBodyReceived:
                if stream.exchange is not None:
                    stream.exchange.send_body(event.data)  # type: ignore[attr-defined]
            elif kind is RequestCompleted:
                if stream.exchange is not None:
                    stream.exchange.request_complete()
            elif kind is RequestHeadReceived:
                self._start(stream, event)  # type: ignore[arg-type]
            elif kind is RequestRejected:
                self._reject(stream, event)  # type: ignore[arg-type]

    def _start(self, stream: _Stream, head: RequestHeadReceived) -> None:
        services = self.services
        record = RequestRecord(
            method="CONNECT" if stream.websocket else head.method.decode("latin-1"),
            path=head.target.decode("latin-1"),
            host=head.host,
            request_id=head.request_id,
            started=time.monotonic(),
            protocol="h2",
            replay=head.head if head.replayable else None,
            user_agent=next(
                (v[:256].decode("latin-1") for n, v in head.headers if n == b"user-agent"), None
            ),
            trace_id=head.trace_id,
        )
        stream.record = record
        if not services.request_rate.allow(self.client_ip, record.started):
            record.outcome, record.reason = "rejected", "request rate limit"
            self._answer(stream, 429)
            return
        exchange = Exchange(services, self, head, self._metadata, record, decode_chunked=True)
        exchange.tag = stream
        stream.exchange = exchange
        exchange.start()

    def _reject(self, stream: _Stream, event: RequestRejected) -> None:
        self.services.count_error(f"http_{event.status}")
        throttled.info(
            "rejected request from %s: %d %s", self.client_ip, event.status, event.reason
        )
        if stream.exchange is not None:
            stream.exchange.reject(event.status, event.reason)
            return
        stream.record = RequestRecord(
            method="", path="", host=None, request_id="", started=time.monotonic(),
            protocol="h2", outcome="rejected", reason=event.reason,
        )  # fmt: skip
        self._answer(stream, event.status)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream = self._streams.get(event.stream_id)
        length = event.flow_controlled_length
        if not event.data and event.stream_ended is None:
            self._count("empty", MAX_EMPTY_DATA)
        if stream is None or stream.exchange is None:
            self.conn.acknowledge_received_data(length, event.stream_id)
            return
        stream.client_active_at = time.monotonic()
        exchange = stream.exchange
        if exchange.upgraded:
            exchange.send_tunnel(event.data)
        elif event.data:
            data = event.data
            if stream.chunked:
                data = b"%x\r\n" % len(data) + data + b"\r\n"
            self._dispatch(stream, stream.reader.feed(data))
        stream.unacked += length
        if not stream.request_paused:
            self._credit(stream)

    def _on_stream_ended(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is None or stream.exchange is None:
            return
        if stream.exchange.upgraded:
            stream.exchange.client_half_closed()
        elif stream.chunked:
            self._dispatch(stream, stream.reader.feed(b"0\r\n\r\n"))
        elif not stream.exchange.request_whole:  # shorter than its content-length
            self._dispatch(stream, stream.reader.feed_eof())

    def _credit(self, stream: _Stream) -> None:
        if stream.unacked and not stream.closed:
            try:
                self.conn.acknowledge_received_data(stream.unacked, stream.stream_id)
            except h2.exceptions.StreamClosedError:
                pass
            stream.unacked = 0

    def _on_window(self, stream_id: int) -> None:
        streams = self._streams.values() if stream_id == 0 else [self._streams.get(stream_id)]
        for stream in list(streams):
            if stream is not None and stream.out:
                self._pump(stream)

    # -- edge.exchange.ExchangeClient ------------------------------------------------------

    def writes_begin(self) -> None:
        self._batching += 1

    def writes_end(self) -> None:
        # The responses of several streams often come out of one read of the
        # tunnel, each in its own writes_begin/end: what they queued goes out
        # once this turn of the event loop is over, as one write (one TLS
        # record, one send) instead of one per stream.
        self._batching -= 1
        if not self._batching and not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush_deferred)

    def _flush_deferred(self) -> None:
        self._flush_soon = False
        self._flush()

    def response_head(self, exchange: Exchange, head: ResponseHeadReceived) -> None:
        stream: _Stream = exchange.tag  # type: ignore[assignment]
        if stream.closed:
            return
        if head.informational and head.status != 101:
            fields = [(b":status", b"%d" % head.status)]
            self._send_headers(stream, fields, end=False)
            return
        hsts = self._hsts if head.status != 101 or stream.websocket else None
        fields = response_fields(head.status, head.headers, websocket=stream.websocket, extra=hsts)
        record = exchange.record
        if record.request_id and not any(n == b"x-request-id" for n, _ in head.headers):
            # Unique per response: indexing it would only churn the HPACK table.
            fields.append(
                hpack.NeverIndexedHeaderTuple(b"x-request-id", record.request_id.encode())
            )
        self._send_headers(stream, fields, end=False)
        if stream.record is not None:
            stream.record.bytes_out += len(head.head)

    def response_data(self, exchange: Exchange, data: bytes) -> None:
        stream: _Stream = exchange.tag  # type: ignore[assignment]
        if stream.closed or not data:
            return
        stream.out.append(data)
        stream.out_bytes += len(data)
        self._pump(stream)

    def response_complete(self, exchange: Exchange, close: bool) -> None:
        stream: _Stream = exchange.tag  # type: ignore[assignment]
        stream.end_pending = True
        self._pump(stream)

    def upgraded(self, exchange: Exchange) -> None:
        """The WebSocket is open: DATA carries its frames both ways from now on."""

    def upstream_ended(self, exchange: Exchange) -> None:
        self.response_complete(exchange, True)

    def answer(self, exchange: Exchange, status: int) -> None:
        self._answer(exchange.tag, status)  # type: ignore[arg-type]

    def cut(self, exchange: Exchange) -> None:
        stream: _Stream = exchange.tag  # type: ignore[assignment]
        self._reset(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)

    def pause_request(self, exchange: Exchange) -> None:
        stream: _Stream = exchange.tag  # type: ignore[assignment]
        stream.request_paused = True

    def resume_request(self, exchange: Exchange) -> None:
        stream: _Stream = exchange.tag  # type: ignore[assignment]
        stream.request_paused = False
        self._credit(stream)
        self._flush()

    def exchange_finished(self, exchange: Exchange) -> None:
        stream: _Stream = exchange.tag  # type: ignore[assignment]
        stream.exchange = None
        if not exchange.request_whole and not stream.closed and not stream.end_pending:
            self._reset(stream, h2.errors.ErrorCodes.CANCEL)
        self._settle_stream(stream)

    # -- sending ------------------------------------------------------------------------

    def _send_headers(self, stream: _Stream, fields: list[tuple[bytes, bytes]], end: bool) -> None:
        record = stream.record
        if record is not None and record.out_start < 0:
            record.out_start = self.ledger.queued
        try:
            self.conn.send_headers(stream.stream_id, fields, end_stream=end)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
            log.debug("could not send a response head on stream %d: %s", stream.stream_id, exc)
            stream.closed = True
        self._flush()

    def _pump(self, stream: _Stream) -> None:
        """Send what the client's windows allow; pause the exchange while its
        response waits here, resume it when it has room again."""
        conn = self.conn
        out = stream.out
        while out and not stream.closed:
            try:
                window = conn.local_flow_control_window(stream.stream_id)
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                stream.closed = True
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
            stream.out_bytes -= len(chunk)
            conn.send_data(stream.stream_id, chunk)
            if stream.record is not None:
                stream.record.bytes_out += len(chunk)
        exchange = stream.exchange
        if out and not stream.closed:
            stream.blocked_since = stream.blocked_since or time.monotonic()
            if exchange is not None and stream.out_bytes >= RESPONSE_BUFFER:
                exchange.pause_response()
        else:
            stream.blocked_since = 0.0
            if exchange is not None and exchange.response_paused and not self._write_paused:
                exchange.resume_response()  # may deliver, queue and pump again, here
            if stream.end_pending and not stream.closed and not out:
                stream.end_pending = False
                try:
                    conn.end_stream(stream.stream_id)
                except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                    pass
                stream.closed = True
                self._settle_stream(stream)
        self._flush()

    def _answer(self, stream: _Stream, status: int) -> None:
        """The edge's own answer on ``stream`` (nothing of a response went out)."""
        record = stream.record
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
        if self._hsts is not None:
            name, _, value = self._hsts.partition(b":")
            fields.append((name.strip().lower(), value.strip()))
        self._send_headers(stream, fields, end=False)
        stream.out.append(body)
        stream.out_bytes += len(body)
        stream.end_pending = True
        self._pump(stream)
        if stream.exchange is None:
            self._settle_stream(stream)

    def _reset(self, stream: _Stream, code: int) -> None:
        if not stream.closed:
            stream.closed = True
            stream.out.clear()
            stream.out_bytes = 0
            try:
                self.conn.reset_stream(stream.stream_id, code)
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                pass
            self._flush()

    def _settle_stream(self, stream: _Stream) -> None:
        """Log the stream's request once it is done both here and at its exchange."""
        if stream.exchange is not None or not (stream.closed or not stream.out):
            return
        if not stream.closed and stream.end_pending:
            return
        self._streams.pop(stream.stream_id, None)
        record, stream.record = stream.record, None
        if record is not None:
            if record.out_start >= 0:
                record.out_end = self.ledger.queued
            self.ledger.done(record, flush_now=not self._batching)
        self._close_if_done()

    def _forget(self, stream_id: int, outcome: str) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        stream.closed = True
        stream.out.clear()
        if stream.exchange is not None:
            stream.exchange.cancel(outcome)
        else:
            self._settle_stream(stream)

    def _flush(self) -> None:
        if self._batching:
            return
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.ledger.queued += len(data)
            self.transport.write(data)
        self.ledger.check()

    def _log(self, record: RequestRecord, sent: int) -> None:
        self.services.log_request(record, self.client_ip or None, sent, self.facts)

    # -- floods, deadlines, closing ----------------------------------------------------

    def _count(self, what: str, limit: int) -> None:
        counts = self._counts
        counts[what] += 1
        if counts[what] > limit:
            self.services.count_error(f"h2_flood_{what}")
            throttled.warning("HTTP/2 %s flood from %s: closing", what, self.client_ip)
            self._go_away(_ENHANCE_YOUR_CALM)

    def _go_away(self, code: int) -> None:
        """A connection error: GOAWAY with ``code``, then close at once."""
        try:
            self.conn.close_connection(error_code=code)
        except h2.exceptions.ProtocolError:
            pass
        self._close()

    def _close_if_done(self) -> None:
        if (self._going_away or self.services.draining) and not self._streams:
            self._close()

    def _close(self) -> None:
        if self._closing:
            return
        data = self.conn.data_to_send()  # the last frames go out first, batched or not
        if data and self.transport is not None and not self.transport.is_closing():
            self.ledger.queued += len(data)
            self.transport.write(data)
        self._closing = True
        for stream in list(self._streams.values()):
            if stream.exchange is not None:
                stream.exchange.cancel("client_closed")
        if self.transport is not None:
            self.transport.close()

    def sweep(self, now: float) -> None:
        deadlines: Deadlines = self.services.deadlines
        if now - self._window_start >= FLOOD_WINDOW_S:
            self._window_start = now
            self._counts = dict.fromkeys(self._counts, 0)
        if not self._streams:
            idle_since = self._last_stream_at
            limit = deadlines.header_s if not self._streams_seen else deadlines.keepalive_s
            if now - idle_since > limit:
                self._go_away(h2.errors.ErrorCodes.NO_ERROR)
            return
        send_timeout = self.services.http.send_timeout_s
        for stream in list(self._streams.values()):
            exchange = stream.exchange
            if stream.blocked_since and now - stream.blocked_since > send_timeout:
                self.services.count_error("h2_window_stall")
                if exchange is not None:
                    exchange.cancel("client_stalled", "no window for the response")
                self._reset(stream, h2.errors.ErrorCodes.CANCEL)
                self._settle_stream(stream)
                continue
            if exchange is None or exchange.finished:
                continue
            if exchange.upgraded:
                active = max(stream.client_active_at, exchange.upstream_active_at)
                if now - active > deadlines.tunnel_idle_s:
                    exchange.cancel("ok")
                    self._reset(stream, h2.errors.ErrorCodes.NO_ERROR)
            elif not exchange.request_whole:
                if now - stream.client_active_at > deadlines.body_s:
                    exchange.reject(408, "request body timeout")
            elif not exchange.response_paused:
                limit = deadlines.response_s
                if deadlines.long_poll_prefixes and exchange.record.path.startswith(
                    deadlines.long_poll_prefixes
                ):
                    limit = deadlines.tunnel_idle_s
                if now - exchange.upstream_active_at > limit:
                    exchange.time_out()

    def drain(self, websocket_close_in_s: float = 0.0) -> None:
        """GOAWAY(NO_ERROR): the streams open finish, new ones are refused
        (REFUSED_STREAM, safe to retry: RFC 9113 §6.8); closes when done. Its
        WebSockets (RFC 8441 streams) get the edge's Close after
        ``websocket_close_in_s``.

        The frame is written here, not with ``H2Connection.close_connection``:
        h2's state machine treats a sent GOAWAY as the end of the connection
        and would refuse the responses of the streams still open."""
        loop = asyncio.get_running_loop()
        for stream in self._streams.values():
            exchange = stream.exchange
            if exchange is not None and exchange.upgraded:
                loop.call_later(websocket_close_in_s, exchange.close_websocket, CLOSE_GOING_AWAY)
        if not self._going_away:
            self._going_away = True
            self._flush()
            frame = hyperframe.frame.GoAwayFrame(0)
            frame.last_stream_id = self.conn.highest_inbound_stream_id
            frame.error_code = h2.errors.ErrorCodes.NO_ERROR
            data = frame.serialize()
            if self.transport is not None and not self.transport.is_closing():
                self.ledger.queued += len(data)
                self.transport.write(data)
        self._close_if_done()

    def close_now(self, reason: str) -> None:
        log.debug("closing %s: %s", self.client_ip, reason)
        self._close()


def _phrase(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
