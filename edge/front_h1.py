"""The HTTP/1.1 front end: one client connection, its requests one exchange each.

An ``asyncio.Protocol`` on the client's (TLS) transport. The sans-I/O reader
(:class:`edge.http1.RequestReader`) validates and rewrites each request; each
request becomes an :class:`edge.exchange.Exchange` with its own tunnel stream
(PROTOCOL.md §6.7). What is left here is HTTP/1.1's own business; the
response side, the :class:`edge.exchange.ExchangeClient` every exchange calls
directly, is its own part (:class:`edge.front_h1_responses.Http1Responses`:
the client's framing, writing, reading pauses, the close):

- **Order.** One exchange at a time. A request the client pipelines behind
  one in progress is held, with reading paused, until the response before it
  is complete, so responses keep their order and nothing is buffered beyond
  one read (as nginx does).
- **Closing.** After a request that asked to close, a close-delimited
  response, a response that came before the whole request (the rest of the
  body is unread), the edge's own error answers, and on drain.
- **Deadlines** (:mod:`edge.deadlines`): this connection keeps the timestamps;
  the worker's sweep decides.
- **The access log** counts what the client was sent (:mod:`edge.ledger`).

A connection whose TLS handshake chose ``h2`` hands itself over to
:class:`edge.front_h2.Http2Connection` in :meth:`connection_made`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

from edge.deadlines import Missed, Phase, expired
from edge.exchange import Exchange, RequestRecord
from edge.front_h1_responses import PAUSED_BY_EXCHANGE, PAUSED_BY_HOLD, Http1Responses
from edge.http1 import (
    ClientClosed,
    ClientContext,
    RequestBodyReceived,
    RequestCompleted,
    RequestHeadReceived,
    RequestReader,
    RequestRejected,
    TunnelBytes,
    https_location,
    redirect_response,
)
from edge.ledger import OutputLedger
from edge.services import ClientFacts, EdgeServices
from edge.stream_metadata import connection_metadata, peer_address
from edge.ws_frames import CLOSE_GOING_AWAY
from geoedge.logs import LogThrottle

__all__ = ["Http1Connection"]

log = logging.getLogger("geoedge.edge")
throttled = LogThrottle(log)


class Http1Connection(asyncio.Protocol):
    """One HTTP/1.1 client connection (after TLS and the PROXY protocol).

    Its response side (``_responses``) exists from :meth:`connection_made` on
    and reaches back to this connection through a weak proxy (see
    :class:`edge.front_h1_responses.Http1Responses`)."""

    def __init__(
        self,
        services: EdgeServices,
        *,
        trusted: bool,
        client_address: tuple[str, int] | None = None,
        scheme: str = "https",
        redirect: bool = False,
    ) -> None:
        self.services = services
        self._trusted = trusted
        self._client_address = client_address
        self._scheme = scheme
        self._redirect = redirect
        self._hsts = services.hsts_field if scheme == "https" else None
        self._responses: Http1Responses
        self.reader: RequestReader | None = None
        self.exchange: Exchange | None = None
        self.client_ip = ""
        self._metadata = b""
        self._held: list[Any] | None = None  # events behind the exchange in progress
        self._client_eof = False
        self._release: Callable[[], None] | None = None
        self.facts = ClientFacts("https" if scheme == "https" else "http")
        self.ledger = OutputLedger(self._log)
        now = time.monotonic()
        # The clock the deadlines read (edge.deadlines.Clock).
        self.phase = Phase.IDLE
        self.phase_since = now
        self.client_active_at = now

    # -- edge.deadlines.Clock ---------------------------------------------------------

    @property
    def upstream_active_at(self) -> float:
        exchange = self.exchange
        return exchange.upstream_active_at if exchange is not None else self.client_active_at

    @property
    def response_paused(self) -> bool:
        exchange = self.exchange
        return exchange is not None and exchange.response_paused

    @property
    def awaited_path(self) -> str:
        exchange = self.exchange
        return exchange.record.path if exchange is not None else ""

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            from edge.front_h2 import Http2Connection  # only h2 connections pay for it

            h2 = Http2Connection(
                self.services, trusted=self._trusted, client_address=self._client_address
            )
            transport.set_protocol(h2)
            h2.connection_made(transport)
            return
        client: asyncio.Transport = transport  # type: ignore[assignment]
        self.ledger.attach(client)
        services = self.services
        peer = self._client_address or peer_address(transport.get_extra_info("peername"))
        local = peer_address(transport.get_extra_info("sockname"))
        self._metadata = connection_metadata(transport, peer, local, services.edge_id)
        context = ClientContext(
            client_ip=peer[0] if peer else "0.0.0.0",
            client_port=peer[1] if peer else 0,
            trusted_proxy=self._trusted,
            scheme=self._scheme,
            server_port=local[1] if local else 443,
        )
        self.client_ip = context.client_ip
        self.reader = RequestReader(services.http_limits, context, services.new_request_id)
        self._responses = responses = Http1Responses(
            client, self.ledger, self._hsts, context.client_ip
        )
        responses.requests = weakref.proxy(self)
        if self._redirect:  # plain HTTP: admitted here, TLS in its listener
            self._release = services.admit(context.client_ip)
            if self._release is None:
                responses.closing = True
                client.abort()
                return
        self.facts = ClientFacts.of(transport)
        services.connection_opened(self, self.facts)

    def data_received(self, data: bytes) -> None:
        self.client_active_at = time.monotonic()
        self._dispatch(self.reader.feed(data))  # type: ignore[union-attr]
        self.update_phase()

    def eof_received(self) -> bool:
        """The client closed its sending side (a TCP FIN, with or without
        close_notify): keep ours open while a response is on its way, as HAProxy
        does without ``abortonclose``; it closes when nothing is left to send."""
        self._dispatch(self.reader.feed_eof())  # type: ignore[union-attr]
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()
        if self.reader is None:  # handed over to HTTP/2
            return
        self._responses.closing = True
        exchange = self.exchange
        if exchange is not None:
            exchange.cancel("client_closed")
        self.ledger.settle(final=True)
        self.services.connection_closed(self)

    def pause_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.pause_response()

    def resume_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.resume_response()

    # -- client events ----------------------------------------------------------------

    def _dispatch(self, events: list[Any]) -> None:
        responses = self._responses
        for index, event in enumerate(events):
            if responses.closing:
                return
            kind = type(event)
            exchange = self.exchange
            if self._held is not None or (
                exchange is not None
                and (
                    kind is RequestHeadReceived
                    or (kind is ClientClosed and not exchange.upgraded)
                    or (kind is RequestRejected and not event.mid_request)
                )
            ):
                self.hold(events[index:])  # after the exchange in progress
                return
            if kind is RequestBodyReceived:
                if self.exchange is not None:  # (else answered early: the rest is dropped)
                    self.exchange.send_body(event.data)
            elif kind is TunnelBytes:
                if self.exchange is not None:
                    self.exchange.send_tunnel(event.data)
            elif kind is RequestCompleted:
                if self.exchange is not None:
                    self.exchange.request_complete()
            elif kind is RequestHeadReceived:
                self._on_head(event)
            elif kind is RequestRejected:
                self._on_rejected(event)
            elif kind is ClientClosed:
                self._on_client_closed()

    def hold(self, events: list[Any]) -> None:
        if self._held is None:
            self._held = list(events)
        else:
            self._held.extend(events)
        self._responses.pause_reading(PAUSED_BY_HOLD)

    def exchange_ended(self, exchange: Exchange) -> None:
        """``exchange`` finished (its record is with the ledger): close, or give
        the held events their turn."""
        if exchange is not self.exchange:
            return
        self.exchange = None
        responses = self._responses
        responses.resume_reading(PAUSED_BY_EXCHANGE)
        if (
            self.phase is Phase.TUNNEL
            or responses.close_after
            or self._client_eof
            or (self.services.draining and not self._held)
        ):
            responses.close()
            return
        held, self._held = self._held, None
        if held:
            self._dispatch(held)
        if self._held is None:
            responses.resume_reading(PAUSED_BY_HOLD)
        self.update_phase()

    def _on_head(self, head: RequestHeadReceived) -> None:
        services = self.services
        if services.draining:
            self._responses.answer_own(_own_record(503, "edge is draining", "rejected", head))
            return
        if not services.request_rate.allow(self.client_ip, self.client_active_at):
            self._responses.answer_own(_own_record(429, "request rate limit", "rejected", head))
            return
        path = head.target.decode("latin-1")
        redirect = services.redirect
        if (
            self._redirect
            and redirect is not None
            and not path.startswith(redirect.pass_through_prefixes)
        ):
            self._redirect_to_https(head, path)
            return
        record = RequestRecord(
            method=head.method.decode("latin-1"),
            path=path,
            host=head.host,
            request_id=head.request_id,
            started=time.monotonic(),
            replay=head.head if head.replayable else None,
            keep_alive=head.keep_alive,
            user_agent=_user_agent(head),
            trace_id=head.trace_id,
        )
        exchange = Exchange(services, self._responses, head, self._metadata, record)
        self.exchange = exchange
        exchange.start()

    def _on_rejected(self, event: RequestRejected) -> None:
        self.services.count_error(f"http_{event.status}")
        throttled.info(
            "rejected request from %s: %d %s", self.client_ip, event.status, event.reason
        )
        if event.mid_request and self.exchange is not None:
            self.exchange.reject(event.status, event.reason)
        else:
            self._responses.answer_own(_own_record(event.status, event.reason, "rejected"))

    def _on_client_closed(self) -> None:
        self._client_eof = True
        exchange = self.exchange
        if exchange is not None and exchange.upgraded:
            exchange.client_half_closed()  # the half-close travels through the tunnel
        elif exchange is None:
            self._responses.close()
        # else: closes when the response is written (exchange_ended)

    def _redirect_to_https(self, head: RequestHeadReceived, path: str) -> None:
        location = https_location(head.host, path, self.services.redirect.https_port)  # type: ignore[union-attr]
        if location is None:
            reason = "cannot redirect without Host and an origin-form target"
            self._responses.answer_own(_own_record(400, reason, "rejected", head))
            return
        record = _own_record(301, "redirected to HTTPS", "redirected", head)
        self._responses.answer_with(record, redirect_response(location))

    def _log(self, record: RequestRecord, sent: int) -> None:
        self.services.log_request(record, self.client_ip or None, sent, self.facts)

    # -- the worker's calls (edge.services.ClientConnection) ---------------------------------

    def sweep(self, now: float) -> None:
        missed = expired(self, self.services.deadlines, now)
        if missed is not None:
            self._time_out(missed)

    def drain(self, websocket_close_in_s: float = 0.0) -> None:
        if self.phase in (Phase.IDLE, Phase.HEAD):
            self._responses.close()
        elif self.phase is Phase.TUNNEL and self.exchange is not None:
            asyncio.get_running_loop().call_later(
                websocket_close_in_s, self.exchange.close_websocket, CLOSE_GOING_AWAY
            )

    def close_now(self, reason: str) -> None:
        log.debug("closing %s: %s", self.client_ip, reason)
        self._responses.close()

    def _time_out(self, missed: Missed) -> None:
        self.services.count_error(missed.name.lower() + "_timeout")
        if missed is Missed.HEADER:
            self._responses.answer_own(_own_record(408, missed.value, "rejected"))
        elif missed is Missed.BODY and self.exchange is not None:
            self.exchange.reject(408, missed.value)
        elif missed is Missed.RESPONSE and self.exchange is not None:
            self.exchange.time_out()
        else:
            self.close_now(missed.value)

    def update_phase(self) -> None:
        reader = self.reader
        if self.phase is Phase.TUNNEL or reader is None:
            return
        if self.exchange is not None:
            phase = Phase.SENDING if reader.in_body else Phase.WAITING
        elif reader.in_head:
            phase = Phase.HEAD
        else:
            phase = Phase.IDLE
        if phase is not self.phase:
            self.phase = phase
            self.phase_since = time.monotonic()


def _own_record(
    status: int, reason: str, outcome: str, head: RequestHeadReceived | None = None
) -> RequestRecord:
    """The record of something the edge answers itself (nothing goes up)."""
    return RequestRecord(
        method=head.method.decode("latin-1") if head is not None else "",
        path=head.target.decode("latin-1") if head is not None else "",
        host=head.host if head is not None else None,
        request_id=head.request_id if head is not None else "",
        started=time.monotonic(),
        user_agent=_user_agent(head) if head is not None else None,
        trace_id=head.trace_id if head is not None else None,
        status=status,
        outcome=outcome,
        reason=reason,
    )


def _user_agent(head: RequestHeadReceived) -> str | None:
    for name, value in head.headers:
        if name == b"user-agent":
            return value[:256].decode("latin-1")
    return None
