"""The request side of one HTTP/1.1 client connection: its requests, in order.

:class:`Http1Requests` takes the events the sans-I/O reader
(:class:`edge.http1.RequestReader`) makes of what the client sent, and turns
each request into an :class:`edge.exchange.Exchange` with its own tunnel
stream (PROTOCOL.md §6.7), or into an answer of the edge's own (draining, the
request rate, a plain-HTTP redirect, a request the reader rejected).

- **Order.** One exchange at a time. A request the client pipelines behind
  one in progress is held, with reading paused, until the response before it
  is complete, so responses keep their order and nothing is buffered beyond
  one read (as nginx does).
- **Closing.** After a request that asked to close, a close-delimited
  response, a response that came before the whole request (the rest of the
  body is unread), the edge's own answers, on drain, and when the client
  closed its side with nothing in progress.
- **Deadlines** (:mod:`edge.deadlines`): this part is the connection's
  :class:`edge.deadlines.Clock`; the worker's sweep decides.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

from edge.deadlines import Phase
from edge.exchange import Exchange, RequestRecord
from edge.front_h1_responses import PAUSED_BY_EXCHANGE, PAUSED_BY_HOLD, Http1Responses
from edge.http1 import (
    ClientClosed,
    RequestBodyReceived,
    RequestCompleted,
    RequestHeadReceived,
    RequestReader,
    RequestRejected,
    TunnelBytes,
    https_location,
    readiness_response,
    redirect_response,
    text_response,
)
from edge.request_record import is_readiness_check, own_record, user_agent_of
from edge.services import EdgeServices
from geoedge.logs import LogThrottle

__all__ = ["Http1Requests"]

# Phases as module names: a member read off its class goes through
# ``EnumType.__getattr__``'s slot (~1,000 instructions in 3.11), a few a request.
_HEAD = Phase.HEAD
_SENDING = Phase.SENDING
_WAITING = Phase.WAITING
_IDLE = Phase.IDLE
_TUNNEL = Phase.TUNNEL

throttled = LogThrottle(logging.getLogger("geoedge.edge"))


class Http1Requests:
    """The request side of one HTTP/1.1 client connection; see the module docstring.

    Owns the connection's request reader, the exchange in progress
    (``exchange``), the events held behind it, whether the client closed its
    side, and the deadline clock (``phase``, ``phase_since``,
    ``client_active_at``). It owns its response side (``responses``), the
    :class:`edge.exchange.ExchangeClient` of every exchange it starts.

    Invariants: at most one exchange is in progress; while events are held
    (``_held`` is not None, even empty) every new event is held behind them and
    reading is paused; a request head, or the client's close or a rejection
    between requests, is held while an exchange is in progress; ``phase`` is
    ``TUNNEL`` from an accepted upgrade on, for good.
    """

    __slots__ = (
        "__weakref__",
        "_client_eof",
        "_held",
        "_metadata",
        "_redirect",
        "_services",
        "client_active_at",
        "client_ip",
        "exchange",
        "phase",
        "phase_since",
        "reader",
        "requests_seen",
        "responses",
    )

    def __init__(
        self,
        services: EdgeServices,
        reader: RequestReader,
        responses: Http1Responses,
        metadata: bytes,
        client_ip: str,
        *,
        redirect: bool,
        opened_at: float,
    ) -> None:
        self._services = services
        self.reader = reader
        self.responses = responses
        responses.requests = weakref.proxy(self)  # weakly: see Http1Responses
        self._metadata = metadata
        self.client_ip = client_ip
        self._redirect = redirect  # a plain-HTTP listener's: redirect to HTTPS
        self.exchange: Exchange | None = None
        self._held: list[Any] | None = None  # events behind the exchange in progress
        self._client_eof = False
        self.phase = Phase.IDLE
        #: Request heads read on this connection (0: a fresh one, whose first
        #: request a drain waits for: edge.worker.DRAIN_FIRST_REQUEST_S).
        self.requests_seen = 0
        self.phase_since = opened_at  # the connection's first request is awaited from then
        self.client_active_at = opened_at

    @property
    def draining(self) -> bool:
        """The worker drains: each response says ``Connection: close``."""
        return self._services.draining

    # -- edge.deadlines.Clock ---------------------------------------------------------

    @property
    def upstream_active_at(self) -> float:
        exchange = self.exchange
        return exchange.upstream_active_at if exchange is not None else self.client_active_at

    @property
    def response_started(self) -> bool:
        exchange = self.exchange
        return exchange is not None and exchange.record.first_byte > 0

    @property
    def response_paused(self) -> bool:
        exchange = self.exchange
        return exchange is not None and exchange.response_paused

    @property
    def awaited_path(self) -> str:
        exchange = self.exchange
        return exchange.record.path if exchange is not None else ""

    # -- the client's events -----------------------------------------------------------

    def dispatch(self, events: list[Any]) -> None:
        """Act on the reader's ``events`` in order, holding what must wait."""
        responses = self.responses
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
                if exchange is not None:  # (else answered early: the rest is dropped)
                    exchange.send_body(event.data)
            elif kind is TunnelBytes:
                if exchange is not None:
                    exchange.send_tunnel(event.data)
            elif kind is RequestCompleted:
                if exchange is not None:
                    exchange.request_complete()
            elif kind is RequestHeadReceived:
                self._start(event)
            elif kind is RequestRejected:
                self._on_rejected(event)
            elif kind is ClientClosed:
                self._on_client_closed()

    def hold(self, events: list[Any]) -> None:
        """Keep ``events`` (with reading paused) until the exchange in progress ends."""
        if self._held is None:
            self._held = list(events)
        else:
            self._held.extend(events)
        self.responses.pause_reading(PAUSED_BY_HOLD)

    def exchange_ended(self, exchange: Exchange) -> None:
        """``exchange`` finished (its record is with the ledger): close, or give
        the held events their turn."""
        if exchange is not self.exchange:
            return
        self.exchange = None
        responses = self.responses
        responses.resume_reading(PAUSED_BY_EXCHANGE)
        if (
            self.phase is _TUNNEL
            or responses.close_after
            or self._client_eof
            or (self._services.draining and not self._held)
        ):
            responses.close()
            return
        held, self._held = self._held, None
        if held:
            self.dispatch(held)
        if self._held is None:
            responses.resume_reading(PAUSED_BY_HOLD)
        self.update_phase()

    def update_phase(self) -> None:
        """Move the clock's phase to what the reader and the exchange say."""
        if self.phase is _TUNNEL:
            return
        reader = self.reader
        if self.exchange is not None:
            phase = _SENDING if reader.in_body else _WAITING
        elif reader.in_head:
            phase = _HEAD
        else:
            phase = _IDLE
        if phase is not self.phase:
            self.phase = phase
            self.phase_since = time.monotonic()

    def _start(self, head: RequestHeadReceived) -> None:
        services = self._services
        self.requests_seen += 1
        path = head.target.decode("latin-1")
        method = head.method.decode("latin-1")
        if is_readiness_check(method, path, services.http.readiness_path):
            # Before the rate limit and the redirect: health checkers reach
            # every listener, often from few addresses.
            ready = services.ready()
            status, reason = (200, "ready") if ready else (503, "not ready")
            record = own_record(status, reason, "readiness", head)
            self.responses.answer_with(
                record, readiness_response(ready, head_only=method == "HEAD")
            )
            return
        if not services.request_rate.allow(self.client_ip, self.client_active_at):
            self.responses.answer_own(own_record(429, "request rate limit", "rejected", head))
            return
        if self._redirect:  # plain HTTP: an ACME HTTP-01 challenge the edge holds?
            key_authorization = services.acme_http01(head.host, path)
            if key_authorization is not None:
                record = own_record(200, "ACME HTTP-01 challenge", "ok", head)
                self.responses.answer_with(record, text_response(key_authorization))
                return
        redirect = services.redirect
        if (
            self._redirect
            and redirect is not None
            and not path.startswith(redirect.pass_through_prefixes)
        ):
            self._redirect_to_https(head, path, redirect.https_port)
            return
        cache = services.cache
        hit = None
        if (
            cache is not None
            and head.keep_alive
            and head.http_version == b"1.1"
            and not services.draining
        ):
            hit = cache.plain_hit(head)  # the common hit, answered here (no exchange)
        record = RequestRecord(
            method=method,
            path=path,
            host=head.host,
            request_id=head.request_id,
            started=time.monotonic(),
            keep_alive=head.keep_alive,
            announce_keep_alive=head.keep_alive and head.http_version == b"1.0",
            user_agent=user_agent_of(head),
            trace_id=head.trace_id,
        )
        if hit is not None:
            record.cache = "hit"
            self.responses.answer_hit(record, hit)
            return
        exchange = Exchange(services, self.responses, head, self._metadata, record)
        self.exchange = exchange
        exchange.start()

    def _redirect_to_https(self, head: RequestHeadReceived, path: str, https_port: int) -> None:
        location = https_location(head.host, path, https_port)
        if location is None:
            reason = "cannot redirect without Host and an origin-form target"
            self.responses.answer_own(own_record(400, reason, "rejected", head))
            return
        record = own_record(301, "redirected to HTTPS", "redirected", head)
        self.responses.answer_with(record, redirect_response(location))

    def _on_rejected(self, event: RequestRejected) -> None:
        self._services.count_error(f"http_{event.status}")
        throttled.info(
            "rejected request from %s: %d %s", self.client_ip, event.status, event.reason
        )
        if event.mid_request and self.exchange is not None:
            self.exchange.reject(event.status, event.reason)
        else:
            self.responses.answer_own(own_record(event.status, event.reason, "rejected"))

    def _on_client_closed(self) -> None:
        self._client_eof = True
        exchange = self.exchange
        if exchange is not None and exchange.upgraded:
            exchange.client_half_closed()  # the half-close travels through the tunnel
        elif exchange is None:
            self.responses.close()
        # else: closes when the response is written (exchange_ended)
