"""A client that stands between an exchange and its front end, forwarding all.

:class:`Relay` implements :class:`edge.exchange.ExchangeClient` by handing
every call to the front end's own client (``inner``); the cache's clients
(:class:`edge.cache.fill.Fill`, :class:`Invalidator`) override the calls
they act on. :class:`NullClient` is the client of a request nobody waits
for (a background revalidation): it takes everything and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edge.http1 import ResponseHeadReceived
from edge.http1.events import Headers

__all__ = ["Invalidator", "NullClient", "Relay"]


class NullClient:
    """The client of an exchange whose response goes nowhere but the cache."""

    __slots__ = ("finished",)

    def __init__(self) -> None:
        self.finished = False

    def writes_begin(self) -> None: ...
    def writes_end(self) -> None: ...
    def response_head(self, exchange: Any, head: ResponseHeadReceived) -> None: ...
    def response_data(self, exchange: Any, data: bytes) -> None: ...
    def response_complete(self, exchange: Any, close: bool, trailers: Headers = ()) -> None: ...
    def upgraded(self, exchange: Any) -> None: ...
    def upstream_ended(self, exchange: Any) -> None: ...
    def answer(self, exchange: Any, status: int) -> None: ...
    def cut(self, exchange: Any) -> None: ...
    def pause_request(self, exchange: Any) -> None: ...
    def resume_request(self, exchange: Any) -> None: ...

    def exchange_finished(self, exchange: Any) -> None:
        self.finished = True


class Relay:
    """Forwards every :class:`edge.exchange.ExchangeClient` call to ``inner``."""

    __slots__ = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def writes_begin(self) -> None:
        self.inner.writes_begin()

    def writes_end(self) -> None:
        self.inner.writes_end()

    def response_head(self, exchange: Any, head: ResponseHeadReceived) -> None:
        self.inner.response_head(exchange, head)

    def response_data(self, exchange: Any, data: bytes) -> None:
        self.inner.response_data(exchange, data)

    def response_complete(self, exchange: Any, close: bool, trailers: Headers = ()) -> None:
        self.inner.response_complete(exchange, close, trailers)

    def upgraded(self, exchange: Any) -> None:
        self.inner.upgraded(exchange)

    def upstream_ended(self, exchange: Any) -> None:
        self.inner.upstream_ended(exchange)

    def answer(self, exchange: Any, status: int) -> None:
        self.inner.answer(exchange, status)

    def cut(self, exchange: Any) -> None:
        self.inner.cut(exchange)

    def pause_request(self, exchange: Any) -> None:
        self.inner.pause_request(exchange)

    def resume_request(self, exchange: Any) -> None:
        self.inner.resume_request(exchange)

    def exchange_finished(self, exchange: Any) -> None:
        self.inner.exchange_finished(exchange)


class Invalidator(Relay):
    """An unsafe request's client: its answer's head invalidates what it names
    (RFC 9111 §4.4, :func:`edge.cache.policy.invalidates`); all else passes."""

    __slots__ = ("_invalidate",)

    def __init__(self, inner: Any, invalidate: Callable[[ResponseHeadReceived], None]) -> None:
        super().__init__(inner)
        self._invalidate = invalidate

    def response_head(self, exchange: Any, head: ResponseHeadReceived) -> None:
        if not head.informational:
            self._invalidate(head)
        self.inner.response_head(exchange, head)
