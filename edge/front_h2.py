"""The HTTP/2 front end: one client connection, each of its streams one exchange.

The ``h2`` library (python-hyper) owns the HTTP/2 state machine, HPACK's
state and flow-control arithmetic (its hot HPACK paths and the field checks
of RFC 9113 §8.2 are ours: :mod:`edge.h2_encoder`, :mod:`edge.h2_decoder`,
:mod:`edge.h2_fields`); this module is the adapter between it, the client's
transport and the exchanges (:mod:`edge.exchange`), which carry each request
on its own tunnel stream (PROTOCOL.md §6.7). A request whose fields HTTP/2
forbids is reset alone (RST_STREAM(PROTOCOL_ERROR), RFC 9113 §8.1.1). Requests
are translated to HTTP/1.1 and go through the same reader, rules and
rewriting as HTTP/1.1 clients' (:mod:`edge.h2_translate`); responses come
back as HTTP/2 fields and DATA.

The parts, each owning its share (as ``h2`` composes its ``H2Connection`` of
``H2Stream`` objects and a ``WindowManager``):

- :class:`Http2Connection` (here): the ``asyncio.Protocol``; it reads the
  client, routes ``h2``'s events, turns each request into a stream and an
  exchange, bounds the attacks below, and applies deadlines and drains;
- :class:`edge.front_h2_stream.ClientStream`: one stream; its exchange's
  client (the exchange calls it directly), its response queue and END_STREAM,
  its request credit, its reset and its access-log line;
- :class:`edge.front_h2_session.H2Session`: what the streams share: the ``h2``
  machine, the table of open streams, the batched, counted output, GOAWAY and
  the connection's end.

Flow control end to end:

- request bodies: a client's DATA is acknowledged (``WINDOW_UPDATE``) only
  once its exchange took it, and not while the exchange's tunnel stream is
  above its high-water mark, so a slow origin stops the browser's upload;
- responses: DATA is sent only within the client's stream and connection
  windows; what does not fit waits here (at most what the tunnel stream
  delivered before the exchange paused it) and the exchange stops reading
  its tunnel stream, so a background tab that stops reading stops the origin.

What the known HTTP/2 attacks cost, bounded:

- rapid reset (CVE-2023-44487), SETTINGS, PING and PRIORITY floods, and
  empty DATA frames: counted per connection (:mod:`edge.h2_floods`); past a
  bound the connection gets GOAWAY ENHANCE_YOUR_CALM and closes;
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
from collections.abc import Sequence

import h2.errors
import h2.events
import h2.exceptions

from edge.deadlines import Deadlines
from edge.exchange import Exchange, RequestRecord
from edge.front_h2_session import H2Session
from edge.front_h2_stream import RESPONSE_BUFFER, ClientStream
from edge.h2_fields import MalformedFields, check_request, check_trailers
from edge.h2_floods import FloodCounters
from edge.h2_translate import translate_request
from edge.http1 import (
    ClientContext,
    RequestBodyReceived,
    RequestCompleted,
    RequestHeadReceived,
    RequestReader,
    RequestRejected,
)
from edge.ledger import OutputLedger
from edge.services import ClientFacts, EdgeServices
from edge.stream_metadata import connection_metadata, peer_address
from edge.ws_frames import CLOSE_GOING_AWAY
from geoedge.logs import LogThrottle

__all__ = ["Http2Connection"]

log = logging.getLogger("geoedge.edge")
throttled = LogThrottle(log)

_ENHANCE_YOUR_CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


class Http2Connection(asyncio.Protocol):
    """One HTTP/2 client connection: the client's side of it; see the module docstring.

    Owns the client's address and facts, the request side of its streams (a
    request's fields become a :class:`ClientStream` whose reader is fed its
    DATA, and an :class:`Exchange` once its head is whole), the flood
    counters and the deadlines. What it sends goes through its
    :class:`H2Session`, which it shares with its streams.

    Invariants: a stream is in the session's table from its request until it
    settles (:meth:`ClientStream.settle`); no stream is taken once the session
    is ``going_away`` or the edge drains; no event is handled once the
    session is ``closing``.
    """

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
        self.facts = ClientFacts("https")
        self.transport: asyncio.Transport | None = None
        self.client_ip = ""
        self._metadata = b""
        self._context: ClientContext | None = None
        self.ledger = OutputLedger(self._log)
        self._session = H2Session(services, self.ledger)
        self._last_stream_at = time.monotonic()
        self._streams_seen = 0
        self._floods = FloodCounters(self._last_stream_at)

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
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
        self._session.start(self.transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        session = self._session
        try:
            events = session.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:  # h2 queued its GOAWAY
            throttled.info("HTTP/2 protocol error from %s: %s", self.client_ip, exc)
            self.services.count_error("h2_protocol_error")
            session.flush()
            session.close()
            return
        if session.closing:
            return
        session.batching += 1
        try:
            for event in events:
                self._on_event(event)
                if session.closing:
                    return
        finally:
            session.batching -= 1
            session.flush()

    def eof_received(self) -> bool:
        self._session.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._session.release()
        self.services.connection_closed(self)

    def pause_writing(self) -> None:
        session = self._session
        session.write_paused = True
        for stream in session.streams.values():
            if stream.exchange is not None:
                stream.exchange.pause_response()

    def resume_writing(self) -> None:
        session = self._session
        session.write_paused = False
        for stream in list(session.streams.values()):
            if stream.exchange is not None and stream.out_bytes < RESPONSE_BUFFER:
                stream.exchange.resume_response()

    # -- client events ----------------------------------------------------------------

    def _on_event(self, event: object) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._on_request(event)
        elif isinstance(event, h2.events.DataReceived):
            self._on_data(event)
        elif isinstance(event, h2.events.TrailersReceived):
            # They go up in the last chunk of a chunk-framed body, through the
            # reader's trailer rules; after a body framed by its content-length
            # HTTP/1.1 has nowhere to put them: dropped (RFC 9110 §6.5.1).
            stream = self._session.streams.get(event.stream_id)
            try:
                check_trailers(event.headers)
            except MalformedFields as exc:
                self._refuse_malformed(event.stream_id, exc, head=False)
                if stream is not None:
                    stream.forget("rejected", exc.reason)
                return
            if stream is not None and stream.chunked:
                stream.request_trailers = b"".join(
                    n + b": " + v + b"\r\n" for n, v in event.headers
                )
        elif isinstance(event, h2.events.StreamEnded):
            self._on_stream_ended(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self._count("resets")
            stream = self._session.streams.get(event.stream_id)
            if stream is not None:
                stream.forget("client_closed")
        elif isinstance(event, h2.events.WindowUpdated):
            self._on_window(event.stream_id)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._count("settings")
        elif isinstance(event, h2.events.PingReceived):
            self._count("pings")
        elif isinstance(event, h2.events.PriorityUpdated):
            self._count("priority")
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._session.going_away = True  # the client's GOAWAY: finish what is open
            self._session.close_if_done()

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        services = self.services
        session = self._session
        self._streams_seen += 1
        self._last_stream_at = time.monotonic()
        if session.going_away or services.draining:
            session.conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        fields = event.headers
        try:
            declared_length = check_request(fields)
        except MalformedFields as exc:
            self._refuse_malformed(stream_id, exc, head=True)
            return
        translated = translate_request(fields, ends_stream=event.stream_ended is not None)
        reader = RequestReader(services.http_limits, self._context, services.new_request_id)  # type: ignore[arg-type]
        stream = ClientStream(
            session,
            stream_id,
            reader,
            chunked=translated.chunked,
            websocket=translated.websocket,
            now=self._last_stream_at,
            body_left=declared_length,
        )
        session.streams[stream_id] = stream
        self._dispatch(stream, reader.feed(translated.head))
        if event.stream_ended is not None and stream_id in session.streams:
            self._on_stream_ended(stream_id)

    def _dispatch(self, stream: ClientStream, events: Sequence[object]) -> None:
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

    def _start(self, stream: ClientStream, head: RequestHeadReceived) -> None:
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
            stream.respond(429)
            return
        exchange = Exchange(services, stream, head, self._metadata, record, decode_chunked=True)
        stream.exchange = exchange
        exchange.start()

    def _reject(self, stream: ClientStream, event: RequestRejected) -> None:
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
        stream.respond(event.status)

    def _refuse_malformed(self, stream_id: int, exc: MalformedFields, *, head: bool) -> None:
        """A stream error (RFC 9113 §8.1.1): RST_STREAM(PROTOCOL_ERROR) ends
        that request and no other; each counts as a reset the client caused.
        A malformed head gets its access-log line here (a request refused in
        its trailers has one already, from its exchange)."""
        self.services.count_error("h2_malformed")
        throttled.info("malformed HTTP/2 request from %s: %s", self.client_ip, exc.reason)
        try:
            self._session.conn.reset_stream(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
        except h2.exceptions.ProtocolError:
            pass  # trailers that ended a stream whose response had ended too
        if head:
            record = RequestRecord(
                method="", path="", host=None, request_id="", started=time.monotonic(),
                protocol="h2", outcome="rejected", reason=exc.reason,
            )  # fmt: skip
            self._log(record, 0)
        self._count("resets")

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream = self._session.streams.get(event.stream_id)
        length = event.flow_controlled_length
        if not event.data and event.stream_ended is None:
            self._count("empty")
        if stream is None or stream.exchange is None:
            self._session.conn.acknowledge_received_data(length, event.stream_id)
            return
        stream.client_active_at = time.monotonic()
        stream.unacked += length
        data = event.data
        if stream.body_left is not None:
            if len(data) > stream.body_left:  # not one octet of it goes up
                self._refuse_body(stream, "body longer than its content-length")
                return
            stream.body_left -= len(data)
        exchange = stream.exchange
        if exchange.upgraded:
            exchange.send_tunnel(data)
        elif data:
            if stream.chunked:
                data = b"%x\r\n" % len(data) + data + b"\r\n"
            self._dispatch(stream, stream.reader.feed(data))
        if not stream.request_paused:
            stream.credit()

    def _on_stream_ended(self, stream_id: int) -> None:
        stream = self._session.streams.get(stream_id)
        if stream is None or stream.exchange is None:
            return
        if stream.body_left:
            self._refuse_body(stream, "body shorter than its content-length")
        elif stream.exchange.upgraded:
            stream.exchange.client_half_closed()
        elif stream.chunked:
            self._dispatch(stream, stream.reader.feed(b"0\r\n" + stream.request_trailers + b"\r\n"))

    def _refuse_body(self, stream: ClientStream, reason: str) -> None:
        """A body that disagrees with its ``content-length`` is malformed
        (RFC 9113 §8.1.1): the stream is reset and its tunnel stream cancelled,
        so the backend never takes a request framed otherwise than it was sent."""
        self._refuse_malformed(stream.stream_id, MalformedFields(reason), head=False)
        stream.forget("rejected", reason)

    def _on_window(self, stream_id: int) -> None:
        streams = self._session.streams
        waiting = streams.values() if stream_id == 0 else [streams.get(stream_id)]
        for stream in list(waiting):
            if stream is not None and stream.out:
                stream.pump()

    def _log(self, record: RequestRecord, sent: int) -> None:
        self.services.log_request(record, self.client_ip or None, sent, self.facts)

    # -- floods, deadlines, closing ----------------------------------------------------

    def _count(self, what: str) -> None:
        if self._floods.over(what):
            self.services.count_error(f"h2_flood_{what}")
            throttled.warning("HTTP/2 %s flood from %s: closing", what, self.client_ip)
            self._session.go_away(_ENHANCE_YOUR_CALM)

    def sweep(self, now: float) -> None:
        deadlines: Deadlines = self.services.deadlines
        self._floods.roll(now)
        session = self._session
        if not session.streams:
            idle_since = self._last_stream_at
            limit = deadlines.header_s if not self._streams_seen else deadlines.keepalive_s
            if now - idle_since > limit:
                session.go_away(h2.errors.ErrorCodes.NO_ERROR)
            return
        send_timeout = self.services.http.send_timeout_s
        for stream in list(session.streams.values()):
            exchange = stream.exchange
            if stream.blocked_since and now - stream.blocked_since > send_timeout:
                self.services.count_error("h2_window_stall")
                if exchange is not None:
                    exchange.cancel("client_stalled", "no window for the response")
                stream.reset(h2.errors.ErrorCodes.CANCEL)
                stream.settle()
                continue
            if exchange is None or exchange.finished:
                continue
            if exchange.upgraded:
                active = max(stream.client_active_at, exchange.upstream_active_at)
                if now - active > deadlines.tunnel_idle_s:
                    exchange.cancel("ok")
                    stream.reset(h2.errors.ErrorCodes.NO_ERROR)
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
        """GOAWAY(NO_ERROR) (:meth:`H2Session.announce_going_away`): the streams
        open finish, new ones are refused; closes when done. Its WebSockets
        (RFC 8441 streams) get the edge's Close after ``websocket_close_in_s``."""
        loop = asyncio.get_running_loop()
        for stream in self._session.streams.values():
            exchange = stream.exchange
            if exchange is not None and exchange.upgraded:
                loop.call_later(websocket_close_in_s, exchange.close_websocket, CLOSE_GOING_AWAY)
        self._session.announce_going_away()

    def close_now(self, reason: str) -> None:
        log.debug("closing %s: %s", self.client_ip, reason)
        self._session.close()
