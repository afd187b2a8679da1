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
  client, routes ``h2``'s events, and applies deadlines and drains;
- :class:`edge.front_h2_requests.Http2Requests`: the request side; it turns
  each request into a stream and an exchange, feeds it its DATA, and resets
  malformed requests alone;
- :class:`edge.front_h2_stream.ClientStream`: one stream; its exchange's
  client (the exchange calls it directly), its response queue and END_STREAM,
  its request credit, its reset and its access-log line;
- :class:`edge.front_h2_session.H2Session`: what the streams share: the ``h2``
  machine, the table of open streams, the flood counts, the batched, counted
  output, GOAWAY and the connection's end.

Flow control end to end:

- request bodies: a client's DATA is acknowledged (``WINDOW_UPDATE``) only
  once its exchange took it, and not while the exchange's tunnel stream is
  above its high-water mark, so a slow origin stops the browser's upload;
- responses: DATA is sent only within the client's stream and connection
  windows; what does not fit waits here (at most what the tunnel stream
  delivered before the exchange paused it) and the exchange stops reading
  its tunnel stream, so a background tab that stops reading stops the origin.

What the known HTTP/2 attacks cost, bounded:

- rapid reset (CVE-2023-44487) and MadeYouReset (CVE-2025-8671: frames
  that make us reset the stream), SETTINGS, PING and PRIORITY floods, and
  empty DATA frames: counted per connection (:mod:`edge.h2_floods`); past a
  bound the connection gets GOAWAY ENHANCE_YOUR_CALM and closes. Every reset
  stream's exchange is cancelled, so no backend works on for it;
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

import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from edge.deadlines import Deadlines, response_limit
from edge.exchange import Exchange, RequestRecord
from edge.front_h2_requests import Http2Requests
from edge.front_h2_session import H2Session
from edge.front_h2_stream import RESPONSE_BUFFER
from edge.h2_connection import StreamRefused
from edge.http1 import ClientContext
from edge.ledger import OutputLedger
from edge.services import ClientFacts, EdgeServices
from edge.stream_metadata import connection_metadata, peer_address
from edge.ws_frames import CLOSE_GOING_AWAY
from geoedge.logs import LogThrottle

__all__ = ["Http2Connection"]

log = logging.getLogger("geoedge.edge")
throttled = LogThrottle(log)

_INITIAL_WINDOW_SIZE = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE


class Http2Connection(asyncio.Protocol):
    """One HTTP/2 client connection: the client's side of it; see the module docstring.

    Owns the client's address and facts, its request side
    (:class:`Http2Requests`, from the moment the connection is made) and the
    deadlines. What it sends goes through its :class:`H2Session`, which it
    shares with its request side and its streams.

    Invariant: no event is handled once the session is ``closing``.
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
        self.ledger = OutputLedger(self._log)
        self._session = H2Session(services, self.ledger)
        self._opened_at = time.monotonic()
        self._requests: Http2Requests  # once the connection is made

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        services = self.services
        peer = self._client_address or peer_address(transport.get_extra_info("peername"))
        local = peer_address(transport.get_extra_info("sockname"))
        context = ClientContext(
            client_ip=peer[0] if peer else "0.0.0.0",
            client_port=peer[1] if peer else 0,
            trusted_proxy=self._trusted,
            scheme="https",
            server_port=local[1] if local else 443,
        )
        self.client_ip = self._session.client_ip = context.client_ip
        self.facts = ClientFacts.of(transport, alpn="h2")
        self._requests = Http2Requests(
            services,
            self._session,
            context,
            connection_metadata(transport, peer, local, services.edge_id, alpn="h2"),
            self.facts,
            opened_at=self._opened_at,
        )
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
        requests = self._requests
        session = self._session
        if isinstance(event, h2.events.RequestReceived):
            requests.on_request(event)
        elif isinstance(event, h2.events.DataReceived):
            requests.on_data(event)
        elif isinstance(event, h2.events.TrailersReceived):
            requests.on_trailers(event)
        elif isinstance(event, h2.events.StreamEnded):
            requests.on_stream_ended(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            session.count("resets")
            stream = session.streams.get(event.stream_id)
            if stream is not None:
                stream.forget("client_closed")
        elif isinstance(event, StreamRefused):
            self.services.count_error("h2_refused_stream")
            session.count("resets")
        elif isinstance(event, h2.events.WindowUpdated):
            self._on_window(event.stream_id)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            session.count("settings")
            if _INITIAL_WINDOW_SIZE in event.changed_settings:
                self._on_window(0)  # every stream's window moved (RFC 9113 §6.9.2)
        elif isinstance(event, h2.events.PingReceived):
            session.count("pings")
        elif isinstance(event, h2.events.PriorityUpdated):
            session.count("priority")
        elif isinstance(event, h2.events.ConnectionTerminated):
            session.going_away = True  # the client's GOAWAY: finish what is open
            session.close_if_done()

    def _on_window(self, stream_id: int) -> None:
        streams = self._session.streams
        waiting = streams.values() if stream_id == 0 else [streams.get(stream_id)]
        for stream in list(waiting):
            if stream is not None and stream.out:
                stream.pump()

    def _log(self, record: RequestRecord, sent: int) -> None:
        self.services.log_request(record, self.client_ip or None, sent, self.facts)

    # -- floods, deadlines, closing ----------------------------------------------------

    def sweep(self, now: float) -> None:
        deadlines: Deadlines = self.services.deadlines
        session = self._session
        session.floods.roll(now)
        if not session.streams:
            requests = self._requests
            idle_since = requests.last_stream_at
            limit = deadlines.header_s if not requests.streams_seen else deadlines.keepalive_s
            if now - idle_since > limit:
                session.go_away(h2.errors.ErrorCodes.NO_ERROR)
            return
        send_timeout = self.services.http.send_timeout_s
        for stream in list(session.streams.values()):
            exchange = stream.exchange
            if stream.blocked_since and now - stream.blocked_since > send_timeout:
                self.services.count_error("h2_window_stall")
                stream.reset(h2.errors.ErrorCodes.CANCEL)
                stream.forget("client_stalled", "no window for the response")
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
                record = exchange.record
                limit = response_limit(deadlines, record.first_byte > 0, record.path)
                if now - exchange.upstream_active_at > limit:
                    exchange.time_out()

    def drain(self, websocket_close_in_s: float = 0.0, first_request_s: float = 0.0) -> None:
        """GOAWAY(NO_ERROR) (:meth:`H2Session.announce_going_away`): the streams
        open finish, new ones are refused; closes when done. A fresh connection
        (no stream yet: its first requests are on their way) gets its GOAWAY
        after ``first_request_s``, so they are served, not refused. Its
        WebSockets (RFC 8441 streams) get the edge's Close after
        ``websocket_close_in_s``."""
        loop = asyncio.get_running_loop()
        for stream in self._session.streams.values():
            exchange = stream.exchange
            if exchange is not None and exchange.upgraded:
                loop.call_later(websocket_close_in_s, exchange.close_websocket, CLOSE_GOING_AWAY)
        if self._requests.streams_seen:
            self._session.announce_going_away()
        else:
            loop.call_later(first_request_s, self._session.announce_going_away)

    def close_now(self, reason: str) -> None:
        log.debug("closing %s: %s", self.client_ip, reason)
        self._session.close()

    def websockets(self) -> list[Exchange]:
        return [
            stream.exchange
            for stream in self._session.streams.values()
            if stream.exchange is not None and stream.exchange.upgraded
        ]
