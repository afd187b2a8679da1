"""CONTROL messages on one tunnel connection (PROTOCOL.md §5.14,
IMPLEMENTATION.md §N11): sending one and awaiting its ACK, and answering the
peer's through a table of handlers by kind.

Sending: ``await connection.send_control(kind, body, timeout_s)`` returns the
peer's :class:`ControlReply` (APPLIED, REFUSED or UNKNOWN_KIND, and a reason),
or raises :class:`~tunnel.aio.errors.ControlTimeout` when no ACK came in time
(a peer that predates CONTROL ignores the frame: it never answers),
:class:`~tunnel.aio.errors.ControlLost` when the connection ended first, or
:class:`~tunnel.aio.errors.ControlSendError` when the message cannot go on it.
Messages are paced per connection (:data:`SEND_RATE_PER_S`, :data:`SEND_BURST`)
so that a burst queues here, not against the peer's error budget.

Answering: each connection is given a mapping of kind to
:data:`ControlHandler` at construction (``control_handlers`` of
:class:`~tunnel.aio.connection.TunnelConnection`, :func:`dial_tunnel
<tunnel.aio.transport.dial_tunnel>`, :func:`serve_tunnel
<tunnel.aio.transport.serve_tunnel>`). A handler takes the message's body and
returns a :class:`ControlReply`, or an awaitable of one. A kind with no handler
is answered UNKNOWN_KIND at once; a handler that raises, or runs longer than
:data:`HANDLER_TIMEOUT_S`, is answered REFUSED with the exception's class name
(never its text, which may hold internal detail) and logged.

The extension point, for a feature that makes the origin tell every edge
something (ACME, cache purges):

1. a kind in the feature's range of the registry (PROTOCOL.md §5.14), added to
   :class:`tunnel.mux.ControlKind` under its range's comment, with its body
   (a JSON object) described in the registry;
2. on the edge, a handler in the worker's table:
   ``worker.control_handlers.add(kind, handler)`` (:class:`ControlHandlers`,
   one per worker, shared by all its tunnel connections, so a message the
   origin sends on every connection reaches every worker);
3. on the origin, ``await daemon.broadcast_control(kind, body, timeout_s)``
   (:meth:`origin.daemon.OriginDaemon.broadcast_control`): every connection
   of every edge, across the origin's workers, and each one's outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

from tunnel.aio.connection_writer import ConnectionWriter
from tunnel.aio.errors import ControlLost, ControlSendError, ControlTimeout
from tunnel.mux import (
    ControlAcknowledged,
    ControlError,
    ControlReceived,
    ControlStatus,
    ErrorCode,
    Session,
    SessionClosedError,
)
from tunnel.mux.constants import MAX_CONTROL_REASON_BYTES
from tunnel.policy import Pacer

__all__ = [
    "HANDLER_TIMEOUT_S",
    "SEND_BURST",
    "SEND_RATE_PER_S",
    "ControlChannel",
    "ControlHandler",
    "ControlHandlers",
    "ControlReply",
    "echo",
]

log = logging.getLogger("geoedge.tunnel")

#: Our messages per second per connection, and how many may leave at once:
#: under the 50 a second PROTOCOL.md §8.1 asks of senders, and half the free
#: allowance a geoedge receiver grants (IMPLEMENTATION.md §N8.1).
SEND_RATE_PER_S = 50.0
SEND_BURST = 50
#: A handler still running after this long is cancelled and answered REFUSED.
HANDLER_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class ControlReply:
    """What an ACK says: the status, and a reason (at most 256 octets of
    UTF-8 go on the wire)."""

    status: ControlStatus
    reason: str = ""


ControlHandler = Callable[[bytes], Awaitable[ControlReply] | ControlReply]


class ControlHandlers(Mapping[int, ControlHandler]):
    """A table of handlers by kind that connections share. It is read when a
    message arrives, so a handler added after the connections came up applies
    to them too."""

    def __init__(self, handlers: Mapping[int, ControlHandler] | None = None) -> None:
        self._handlers: dict[int, ControlHandler] = {}
        for kind, handler in (handlers or {}).items():
            self.add(kind, handler)

    def add(self, kind: int, handler: ControlHandler) -> None:
        """Answer messages of ``kind`` with ``handler``; a kind has one handler."""
        if not 0 < kind <= 0xFFFF:
            raise ValueError(f"{kind:#x} is not an application kind (PROTOCOL.md §5.14)")
        if kind in self._handlers:
            raise ValueError(f"kind {kind:#06x} already has a handler")
        self._handlers[kind] = handler

    def __getitem__(self, kind: int) -> ControlHandler:
        return self._handlers[kind]

    def __iter__(self) -> Iterator[int]:
        return iter(self._handlers)

    def __len__(self) -> int:
        return len(self._handlers)


def echo(body: bytes) -> ControlReply:
    """ECHO (PROTOCOL.md §5.14): the body, unchanged, as the reason."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return ControlReply(ControlStatus.REFUSED, "ECHO body is not UTF-8")
    if len(body) > MAX_CONTROL_REASON_BYTES:
        return ControlReply(ControlStatus.REFUSED, "ECHO body above 256 octets")
    return ControlReply(ControlStatus.APPLIED, text)


class ControlChannel:
    """The CONTROL part of one :class:`~tunnel.aio.connection.TunnelConnection`.

    Owns the futures of our messages awaiting their ACK (``_waiting``, by
    message id), the tasks of the handlers still running (``_running``), the
    pacer of our messages and, once the connection ended, its code.

    Invariants: every message of ours ends its wait exactly once, with the
    reply, :class:`ControlTimeout` or :class:`ControlLost`, and leaves
    ``_waiting`` then; every message of the peer's is answered exactly once
    (the session ignores answers once it is over); when the connection ends
    the running handlers are cancelled. Holds the session and the writer,
    never the connection, so it makes no reference cycle with it.
    """

    __slots__ = (
        "_closed",
        "_handlers",
        "_loop",
        "_pacer",
        "_running",
        "_session",
        "_waiting",
        "_writer",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        session: Session,
        writer: ConnectionWriter,
        handlers: Mapping[int, ControlHandler],
    ) -> None:
        self._loop = loop
        self._session = session
        self._writer = writer
        self._handlers = handlers
        self._pacer = Pacer(SEND_RATE_PER_S, SEND_BURST)
        self._waiting: dict[int, asyncio.Future[ControlReply]] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._closed: int | None = None

    # -- sending ------------------------------------------------------------------

    async def send(self, kind: int, body: bytes, timeout_s: float) -> ControlReply:
        """Send a message and wait up to ``timeout_s`` (from when it is queued)
        for its ACK; see the module docstring for what it raises."""
        delay = self._pacer.delay(self._loop.time())
        if delay:
            await asyncio.sleep(delay)
        if self._closed is not None:
            raise ControlLost("connection closed", self._closed)
        try:
            message_id = self._session.send_control(kind, body)
        except SessionClosedError as exc:
            raise ControlLost(str(exc), exc.code) from exc
        except ControlError as exc:
            raise ControlSendError(str(exc), exc.code) from exc
        waiter: asyncio.Future[ControlReply] = self._loop.create_future()
        self._waiting[message_id] = waiter
        self._writer.schedule_flush()
        try:
            async with asyncio.timeout(timeout_s):
                return await waiter
        except TimeoutError:
            raise ControlTimeout(
                f"no ACK of CONTROL {kind:#06x} (id {message_id}) within {timeout_s}s"
            ) from None
        finally:
            self._waiting.pop(message_id, None)

    def on_acknowledged(self, event: ControlAcknowledged) -> None:
        waiter = self._waiting.pop(event.message_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(ControlReply(event.status, event.reason))

    # -- answering ----------------------------------------------------------------

    def on_received(self, event: ControlReceived, peer: str) -> None:
        """A message of the peer's: run its handler, answer with its reply."""
        handler = self._handlers.get(event.kind)
        if handler is None:
            log.debug("CONTROL kind %#06x from %s: no handler", event.kind, peer)
            self._answer(event.message_id, ControlReply(ControlStatus.UNKNOWN_KIND))
            return
        try:
            outcome = handler(event.body)
        except Exception as exc:
            self._answer(event.message_id, _refusal(exc, event.kind, peer))
            return
        if isinstance(outcome, ControlReply):
            self._answer(event.message_id, outcome)
            return
        task = self._loop.create_task(self._finish(event, outcome, peer))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _finish(
        self, event: ControlReceived, outcome: Awaitable[ControlReply], peer: str
    ) -> None:
        try:
            async with asyncio.timeout(HANDLER_TIMEOUT_S):
                reply = await outcome
            if not isinstance(reply, ControlReply):
                raise TypeError(f"handler returned {type(reply).__name__}, not a ControlReply")
        except Exception as exc:
            reply = _refusal(exc, event.kind, peer)
        self._answer(event.message_id, reply)

    def _answer(self, message_id: int, reply: ControlReply) -> None:
        self._session.acknowledge_control(message_id, reply.status, reply.reason)
        self._writer.schedule_flush()

    # -- the end ------------------------------------------------------------------

    def close(self, code: int) -> None:
        """The connection ended with ``code``: waits end with
        :class:`ControlLost`, running handlers are cancelled."""
        if self._closed is not None:
            return
        self._closed = code
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(
                    ControlLost(f"connection ended: {ErrorCode.name_of(code)}", code)
                )
        for task in list(self._running):
            task.cancel()


def _refusal(exc: Exception, kind: int, peer: str) -> ControlReply:
    log.warning(
        "CONTROL kind %#06x from %s: handler failed: %s",
        kind,
        peer,
        type(exc).__name__,
        exc_info=exc,
    )
    return ControlReply(ControlStatus.REFUSED, type(exc).__name__)
