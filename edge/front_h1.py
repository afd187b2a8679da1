"""The HTTP/1.1 front end: one client connection, its requests one exchange each.

An ``asyncio.Protocol`` on the client's (TLS) transport. The sans-I/O reader
(:class:`edge.http1.RequestReader`) validates and rewrites each request; each
request becomes an :class:`edge.exchange.Exchange` with its own tunnel stream
(PROTOCOL.md §6.7). HTTP/1.1's own business is in two parts, each in its
module:

- the **request side** (:class:`edge.front_h1_requests.Http1Requests`): the
  reader's events, one exchange at a time with pipelined requests held behind
  it, the edge's refusals and redirects, and the deadline clock;
- the **response side** (:class:`edge.front_h1_responses.Http1Responses`): the
  :class:`edge.exchange.ExchangeClient` every exchange calls directly, which
  frames and writes the responses, pauses reading and closes.

:class:`Http1Connection` is the adapter around them: it sets them up once the
connection is made, feeds them what the transport reports, and answers the
worker (:class:`edge.services.ClientConnection`: the sweep of the deadlines,
drain, close). The access log counts what the client was sent
(:mod:`edge.ledger`).

A connection whose TLS handshake chose ``h2`` hands itself over to
:class:`edge.front_h2.Http2Connection` in :meth:`connection_made`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from edge.deadlines import Missed, Phase, expired
from edge.exchange import Exchange, RequestRecord
from edge.front_h1_requests import Http1Requests
from edge.front_h1_responses import Http1Responses
from edge.http1 import ClientContext, RequestReader
from edge.ledger import OutputLedger
from edge.request_record import own_record
from edge.services import ClientFacts, EdgeServices
from edge.stream_metadata import connection_metadata, peer_address
from edge.ws_frames import CLOSE_GOING_AWAY

__all__ = ["Http1Connection"]

log = logging.getLogger("geoedge.edge")


class Http1Connection(asyncio.Protocol):
    """One HTTP/1.1 client connection (after TLS and the PROXY protocol).

    Owns the connection's facts (its client, its access-log fields, its
    admission) and its two parts, which exist from :meth:`connection_made` on
    (asyncio calls nothing else before it, and nothing at all on a connection
    handed over to HTTP/2): the request side holds the response side, which
    holds the client transport.
    """

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
        self._requests: Http1Requests
        self._responses: Http1Responses
        self.client_ip = ""
        self._release: Callable[[], None] | None = None
        self.facts = ClientFacts("https" if scheme == "https" else "http")
        self.ledger = OutputLedger(self._log)
        self._opened_at = time.monotonic()  # accepted (its TLS handshake follows)

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        alpn = None if ssl_object is None else ssl_object.selected_alpn_protocol()
        if alpn == "acme-tls/1":
            # RFC 8737 §3: the handshake (its challenge certificate) was the answer.
            transport.set_protocol(asyncio.Protocol())
            transport.close()
            return
        if alpn == "h2":
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
        context = ClientContext(
            client_ip=peer[0] if peer else "0.0.0.0",
            client_port=peer[1] if peer else 0,
            trusted_proxy=self._trusted,
            scheme=self._scheme,
            server_port=local[1] if local else 443,
        )
        self.client_ip = client_ip = context.client_ip
        self._responses = responses = Http1Responses(client, self.ledger, self._hsts, client_ip)
        self._requests = Http1Requests(
            services,
            RequestReader(services.http_limits, context, services.new_request_id),
            responses,
            connection_metadata(transport, peer, local, services.edge_id),
            client_ip,
            redirect=self._redirect,
            opened_at=self._opened_at,
        )
        if self._redirect:  # plain HTTP: admitted here, TLS in its listener
            self._release = services.admit(client_ip)
            if self._release is None:
                responses.closing = True
                client.abort()
                return
        self.facts = ClientFacts.of(transport)
        services.connection_opened(self, self.facts)

    def data_received(self, data: bytes) -> None:
        requests = self._requests
        requests.client_active_at = time.monotonic()
        requests.dispatch(requests.reader.feed(data))
        requests.update_phase()

    def eof_received(self) -> bool:
        """The client closed its sending side (a TCP FIN, with or without
        close_notify): keep ours open while a response is on its way, as HAProxy
        does without ``abortonclose``; it closes when nothing is left to send."""
        requests = self._requests
        requests.dispatch(requests.reader.feed_eof())
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()
        self._responses.closing = True
        exchange = self._requests.exchange
        if exchange is not None:
            exchange.cancel("client_closed")
        self.ledger.settle(final=True)
        self.services.connection_closed(self)

    def pause_writing(self) -> None:
        exchange = self._requests.exchange
        if exchange is not None:
            exchange.pause_response()

    def resume_writing(self) -> None:
        exchange = self._requests.exchange
        if exchange is not None:
            exchange.resume_response()

    # -- the worker's calls (edge.services.ClientConnection) ---------------------------------

    def sweep(self, now: float) -> None:
        missed = expired(self._requests, self.services.deadlines, now)
        if missed is not None:
            self._time_out(missed)

    def drain(self, websocket_close_in_s: float = 0.0, first_request_s: float = 0.0) -> None:
        """Close after the request in hand (``Connection: close``); an idle
        keep-alive connection now (a request the client sent meanwhile is one
        it may retry, RFC 9112 §9.3.1); a fresh one (no request yet: its first
        is on its way) once it is answered, or after ``first_request_s``
        without one; a request head half read once it is answered."""
        requests = self._requests
        if requests.phase is Phase.IDLE:
            if requests.requests_seen:
                self._responses.close()
            else:
                asyncio.get_running_loop().call_later(first_request_s, self._close_if_unused)
        elif requests.phase is Phase.TUNNEL and requests.exchange is not None:
            asyncio.get_running_loop().call_later(
                websocket_close_in_s, requests.exchange.close_websocket, CLOSE_GOING_AWAY
            )

    def websockets(self) -> list[Exchange]:
        requests = self._requests
        exchange = requests.exchange
        if requests.phase is Phase.TUNNEL and exchange is not None and exchange.upgraded:
            return [exchange]
        return []

    def _close_if_unused(self) -> None:
        requests = self._requests
        if requests.phase is Phase.IDLE and not requests.requests_seen:
            self._responses.close()

    def close_now(self, reason: str) -> None:
        log.debug("closing %s: %s", self.client_ip, reason)
        self._responses.close()

    def _time_out(self, missed: Missed) -> None:
        self.services.count_error(missed.name.lower() + "_timeout")
        exchange = self._requests.exchange
        if missed is Missed.HEADER:
            self._responses.answer_own(own_record(408, missed.value, "rejected"))
        elif missed is Missed.BODY and exchange is not None:
            exchange.reject(408, missed.value)
        elif missed is Missed.RESPONSE and exchange is not None:
            exchange.time_out()
        else:
            self.close_now(missed.value)

    def _log(self, record: RequestRecord, sent: int) -> None:
        self.services.log_request(record, self.client_ip or None, sent, self.facts)
