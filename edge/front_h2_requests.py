"""The request side of one HTTP/2 client connection: each request a stream and an exchange.

:class:`Http2Requests` takes the request events ``h2`` makes of what the
client sent (a request's fields, its DATA, trailers and end) and turns each
request into a :class:`edge.front_h2_stream.ClientStream` in the session's
table and an :class:`edge.exchange.Exchange` with its own tunnel stream
(PROTOCOL.md §6.7), or into an answer of the edge's own (the request rate, a
request the HTTP/1.1 reader rejected, a stream refused while going away).

- **Translation.** A request's fields are checked (:mod:`edge.h2_fields`),
  translated to an HTTP/1.1 head (:mod:`edge.h2_translate`) and fed to the
  same reader as an HTTP/1.1 client's, then its DATA: chunk-framed without a
  ``content-length``, as is with one.
- **Malformed requests** (RFC 9113 §8.1.1) are stream errors: fields HTTP/2
  forbids, trailers that break the rules, and a body longer or shorter than
  its ``content-length`` get RST_STREAM(PROTOCOL_ERROR); not one octet past
  the length goes up, the tunnel stream is cancelled, and the request is
  logged as rejected and counted as a reset the client caused.
- **Credit.** DATA is credited back once its exchange took it (and not while
  the exchange's tunnel stream is paused): :meth:`ClientStream.credit`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import h2.errors
import h2.events
import h2.exceptions

from edge.exchange import Exchange, RequestRecord
from edge.front_h2_session import H2Session
from edge.front_h2_stream import ClientStream
from edge.h2_fields import MalformedFields, check_request, check_trailers
from edge.h2_translate import translate_request
from edge.http1 import (
    ClientContext,
    RequestBodyReceived,
    RequestCompleted,
    RequestHeadReceived,
    RequestReader,
    RequestRejected,
)
from edge.http1.request_head import ForwardingIdentity
from edge.request_record import is_readiness_check, own_record, user_agent_of
from edge.services import ClientFacts, EdgeServices
from geoedge.logs import LogThrottle

__all__ = ["Http2Requests"]

throttled = LogThrottle(logging.getLogger("geoedge.edge"))


class Http2Requests:
    """The request side of one HTTP/2 client connection; see the module docstring.

    Owns what every request of the connection starts from (the client's
    context for the reader, the tunnel stream's connection metadata) and when
    the last one came (``streams_seen``, ``last_stream_at``: the connection's
    idle deadline). Its streams are the session's (``session.streams``).

    Invariants: a stream is in the session's table from its request until it
    settles (:meth:`ClientStream.settle`); no stream is taken once the session
    is ``going_away`` or the edge drains.
    """

    __slots__ = (
        "_context",
        "_facts",
        "_identity",
        "_metadata",
        "_services",
        "_session",
        "client_ip",
        "last_stream_at",
        "streams_seen",
    )

    def __init__(
        self,
        services: EdgeServices,
        session: H2Session,
        context: ClientContext,
        metadata: bytes,
        facts: ClientFacts,
        *,
        opened_at: float,
    ) -> None:
        self._services = services
        self._session = session
        self._context = context
        self._identity = ForwardingIdentity(context)  # the same client for every stream
        self._metadata = metadata
        self._facts = facts
        self.client_ip = context.client_ip
        self.streams_seen = 0
        self.last_stream_at = opened_at

    # -- the client's events -----------------------------------------------------------

    def on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        services = self._services
        session = self._session
        self.streams_seen += 1
        self.last_stream_at = time.monotonic()
        if session.going_away:
            session.conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        fields = event.headers
        try:
            declared_length = check_request(fields)
        except MalformedFields as exc:
            self._refuse_malformed(stream_id, exc, head=True)
            return
        translated = translate_request(fields, ends_stream=event.stream_ended is not None)
        reader = RequestReader(
            services.http_limits, self._context, services.new_request_id, self._identity
        )
        stream = ClientStream(
            session,
            stream_id,
            reader,
            chunked=translated.chunked,
            websocket=translated.websocket,
            now=self.last_stream_at,
            body_left=declared_length,
        )
        session.streams[stream_id] = stream
        self._dispatch(stream, reader.feed(translated.head))
        if event.stream_ended is not None and stream_id in session.streams:
            self.on_stream_ended(stream_id)

    def on_data(self, event: h2.events.DataReceived) -> None:
        session = self._session
        stream = session.streams.get(event.stream_id)
        length = event.flow_controlled_length
        if not event.data and event.stream_ended is None:
            session.count("empty")
        if stream is None or stream.exchange is None:
            session.conn.acknowledge_received_data(length, event.stream_id)
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

    def on_trailers(self, event: h2.events.TrailersReceived) -> None:
        """They go up in the last chunk of a chunk-framed body, through the
        reader's trailer rules; after a body framed by its content-length
        HTTP/1.1 has nowhere to put them: dropped (RFC 9110 §6.5.1)."""
        stream = self._session.streams.get(event.stream_id)
        try:
            check_trailers(event.headers)
        except MalformedFields as exc:
            self._refuse_malformed(event.stream_id, exc, head=False)
            if stream is not None:
                stream.forget("rejected", exc.reason)
            return
        if stream is not None and stream.chunked:
            stream.request_trailers = b"".join(n + b": " + v + b"\r\n" for n, v in event.headers)

    def on_stream_ended(self, stream_id: int) -> None:
        stream = self._session.streams.get(stream_id)
        if stream is None or stream.exchange is None:
            return
        if stream.body_left:
            self._refuse_body(stream, "body shorter than its content-length")
        elif stream.exchange.upgraded:
            stream.exchange.client_half_closed()
        elif stream.chunked:
            self._dispatch(stream, stream.reader.feed(b"0\r\n" + stream.request_trailers + b"\r\n"))

    # -- the reader's events -----------------------------------------------------------

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
        services = self._services
        record = RequestRecord(
            method="CONNECT" if stream.websocket else head.method.decode("latin-1"),
            path=head.target.decode("latin-1"),
            host=head.host,
            request_id=head.request_id,
            started=time.monotonic(),
            protocol="h2",
            user_agent=user_agent_of(head),
            trace_id=head.trace_id,
        )
        stream.record = record
        if not stream.websocket and is_readiness_check(
            record.method, record.path, services.http.readiness_path
        ):
            ready = services.ready()
            record.outcome, record.reason = "readiness", "ready" if ready else "not ready"
            stream.respond(200 if ready else 503)
            return
        if not services.request_rate.allow(self.client_ip, record.started):
            record.outcome, record.reason = "rejected", "request rate limit"
            stream.respond(429)
            return
        cache = services.cache
        if cache is not None and not stream.websocket:
            hit = cache.plain_hit(head)  # the common hit, answered here (no exchange)
            if hit is not None:
                record.cache = "hit"
                stream.answer_hit(hit)
                return
        exchange = Exchange(services, stream, head, self._metadata, record, decode_chunked=True)
        stream.exchange = exchange
        exchange.start()

    def _reject(self, stream: ClientStream, event: RequestRejected) -> None:
        self._services.count_error(f"http_{event.status}")
        throttled.info(
            "rejected request from %s: %d %s", self.client_ip, event.status, event.reason
        )
        if stream.exchange is not None:
            stream.exchange.reject(event.status, event.reason)
            return
        stream.record = own_record(event.status, event.reason, "rejected", protocol="h2")
        stream.respond(event.status)

    # -- malformed requests ------------------------------------------------------------

    def _refuse_malformed(self, stream_id: int, exc: MalformedFields, *, head: bool) -> None:
        """A stream error (RFC 9113 §8.1.1): RST_STREAM(PROTOCOL_ERROR) ends
        that request and no other; each counts as a reset the client caused.
        A malformed head gets its access-log line here (a request refused
        later has one already, from its exchange)."""
        self._services.count_error("h2_malformed")
        throttled.info("malformed HTTP/2 request from %s: %s", self.client_ip, exc.reason)
        try:
            self._session.conn.reset_stream(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
        except h2.exceptions.ProtocolError:
            pass  # trailers that ended a stream whose response had ended too
        if head:
            record = own_record(0, exc.reason, "rejected", protocol="h2")
            self._services.log_request(record, self.client_ip or None, 0, self._facts)
        self._session.count("resets")

    def _refuse_body(self, stream: ClientStream, reason: str) -> None:
        """A body that disagrees with its ``content-length``: the stream is
        reset and its tunnel stream cancelled, so the backend never takes a
        request framed otherwise than it was sent."""
        self._refuse_malformed(stream.stream_id, MalformedFields(reason), head=False)
        stream.forget("rejected", reason)
