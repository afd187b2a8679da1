"""The narrow interface a client connection gets from its worker.

The front ends (:mod:`edge.front_h1`, :mod:`edge.front_h2`) and the exchanges
(:mod:`edge.exchange`) see the worker only through this protocol, so they do
not import it (no import circle) and tests can hand in a small stand-in. The
worker (:class:`edge.worker.EdgeWorker`) implements it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from edge.admission import RequestRate
from edge.config import HttpConfig, RedirectListenerConfig
from edge.deadlines import Deadlines
from edge.exchange import Exchange, ExchangeServices, RequestRecord
from edge.http1 import HttpLimits

__all__ = ["ClientConnection", "ClientFacts", "EdgeServices"]


@dataclass(frozen=True, slots=True)
class ClientFacts:
    """What every access-log line of one client connection repeats."""

    protocol_family: str  # "https" or "http"
    tls_version: str | None = None
    server_name: str | None = None
    alpn: str | None = None
    tls_handshake_s: float | None = None
    tls_resumed: bool = False

    @classmethod
    def of(cls, transport: object, alpn: str | None = None) -> ClientFacts:
        ssl_object = transport.get_extra_info("ssl_object")  # type: ignore[attr-defined]
        if ssl_object is None:
            return cls("http")
        handshake = getattr(transport, "handshake_seconds", None)
        return cls(
            "https",
            ssl_object.version(),
            getattr(ssl_object, "geoedge_server_name", None),
            alpn or ssl_object.selected_alpn_protocol(),
            handshake,
            bool(ssl_object.session_reused),
        )


class ClientConnection(Protocol):
    """What the worker asks of every client connection (both front ends)."""

    def sweep(self, now: float) -> None:
        """Apply the deadlines (once a second, edge.deadlines)."""

    def drain(self, websocket_close_in_s: float = 0.0, first_request_s: float = 0.0) -> None:
        """The edge is draining: finish what is in flight, take nothing new; its
        WebSockets get the edge's Close (1001) after ``websocket_close_in_s``; a
        connection with no request yet gets ``first_request_s`` to send one."""

    def close_now(self, reason: str) -> None: ...

    def websockets(self) -> list[Exchange]:
        """The accepted WebSockets this connection carries, not yet finished."""


class EdgeServices(ExchangeServices, Protocol):
    edge_id: str
    http: HttpConfig
    http_limits: HttpLimits
    request_rate: RequestRate
    hsts_field: bytes | None
    redirect: RedirectListenerConfig | None
    deadlines: Deadlines

    def new_request_id(self) -> str: ...
    def acme_http01(self, host: str | None, path: str) -> str | None:
        """The key authorization answering an ACME HTTP-01 request, or None."""

    def ready(self) -> bool:
        """This worker has a usable tunnel and is not draining (readiness)."""

    def admit(self, client_ip: str) -> Callable[[], None] | None: ...
    def connection_opened(self, connection: ClientConnection, facts: ClientFacts) -> None: ...
    def connection_closed(self, connection: ClientConnection) -> None: ...
    def log_request(
        self, record: RequestRecord, client_ip: str | None, sent: int, facts: ClientFacts
    ) -> None: ...
