"""CONTROL messages of a session (PROTOCOL.md §5.14): the ones we sent and await
an ACK for, the ones the peer sent and we have not answered yet, and the rate
at which the peer may send them (§8.1, IMPLEMENTATION.md §N8.1).

A part of the :class:`~tunnel.mux.session.Session`, as :class:`Pings` is: the
session's commands :meth:`Session.send_control` and
:meth:`Session.acknowledge_control` land here, and the receive path hands
every CONTROL frame to :meth:`ControlMessages.receive`.
"""

from __future__ import annotations

from tunnel.mux import frames
from tunnel.mux.budget import Cost, ErrorBudget
from tunnel.mux.constants import (
    CONTROL_HEADER_SIZE,
    MAX_CONTROL_MESSAGE_ID,
    ControlKind,
    ControlStatus,
)
from tunnel.mux.errors import (
    ControlError,
    FrameSizeError,
    ProtocolError,
    SessionClosedError,
)
from tunnel.mux.events import ControlAcknowledged, ControlReceived, Event
from tunnel.mux.outbound import Outbound

#: Application messages a peer may send per second (and at once) without
#: charge; each one beyond costs the error budget a point (§N8.1).
FREE_CONTROL_PER_S = 100
#: Messages of the peer we hold unanswered at most; one more is answered
#: REFUSED by the session itself, as a stream over MAX_CONCURRENT_STREAMS is
#: refused (§N8.4). Bounded in octets too: a body can be MAX_FRAME_BYTES long.
MAX_UNANSWERED = 128
MAX_UNANSWERED_BYTES = 4 * 1024 * 1024
#: Our messages whose ACK we still accept; past this the oldest is forgotten
#: (its ACK, if it ever comes, is then ignored). An older peer never ACKs.
MAX_OUTSTANDING = 1024
#: The reason of the session's own refusal.
BUSY_REASON = "too many control messages unanswered"


class ControlMessages:
    """Owns the message ids of both directions (``last_sent_id``,
    ``last_peer_id``), ``outstanding`` (ours, awaiting an ACK, oldest first),
    ``unanswered`` (the peer's, id → body size, awaiting our ACK) and the
    peer's free allowance.

    Invariants: ids we send increase from 1 and are never 0 (§5.14); a
    ControlAcknowledged event is reported at most once per message, and only
    for a message of ``outstanding``; a ControlReceived event is reported only
    for a message entered in ``unanswered``, which the application answers
    exactly once; at most :data:`MAX_UNANSWERED` messages and
    :data:`MAX_UNANSWERED_BYTES` octets of bodies are unanswered, and
    :data:`MAX_OUTSTANDING` outstanding.
    """

    __slots__ = (
        "_allowance",
        "_budget",
        "_max_frame_bytes",
        "_out",
        "last_peer_id",
        "last_sent_id",
        "outstanding",
        "unanswered",
        "unanswered_bytes",
    )

    def __init__(
        self, out: Outbound, budget: ErrorBudget, max_frame_bytes: int, now: float
    ) -> None:
        self._out = out
        self._budget = budget
        self._max_frame_bytes = max_frame_bytes
        self._allowance = ErrorBudget(FREE_CONTROL_PER_S, FREE_CONTROL_PER_S, now)
        self.last_sent_id = 0
        self.last_peer_id = 0
        self.outstanding: dict[int, None] = {}
        self.unanswered: dict[int, int] = {}
        self.unanswered_bytes = 0

    # -- commands -------------------------------------------------------------------

    def send(self, kind: int, body: bytes) -> int:
        """Queue an application message; its id. The session checked it may send."""
        if not 0 < kind <= 0xFFFF:
            raise ControlError(f"CONTROL kind {kind:#x} is not an application kind")
        if CONTROL_HEADER_SIZE + len(body) > self._out.max_frame:
            raise ControlError(
                f"CONTROL body of {len(body)} octets above the peer's MAX_FRAME_BYTES"
            )
        if self.last_sent_id >= MAX_CONTROL_MESSAGE_ID:
            raise SessionClosedError("CONTROL message ids exhausted")
        self.last_sent_id += 1
        message_id = self.last_sent_id
        self._out.control.append(frames.encode_control(kind, message_id, body))
        outstanding = self.outstanding
        outstanding[message_id] = None
        if len(outstanding) > MAX_OUTSTANDING:
            del outstanding[next(iter(outstanding))]
        return message_id

    def acknowledge(self, message_id: int, status: ControlStatus, reason: str) -> None:
        """Answer the peer's message ``message_id``, once."""
        size = self.unanswered.pop(message_id, None)
        if size is None:
            raise ControlError(f"CONTROL message {message_id} is not awaiting an answer")
        self.unanswered_bytes -= size
        self._out.control.append(frames.encode_control_ack(message_id, status, reason))

    # -- receiving ------------------------------------------------------------------

    def receive(self, stream_id: int, payload: bytes, now: float, events: list[Event]) -> None:
        """A CONTROL frame from the peer (§5.14)."""
        if stream_id != 0:
            raise ProtocolError(f"CONTROL on stream {stream_id}")
        if len(payload) > self._max_frame_bytes:
            # The reader admits 4 + MAX_METADATA_BYTES for OPEN, which may be
            # more than MAX_FRAME_BYTES; CONTROL is held to MAX_FRAME_BYTES (§4).
            raise FrameSizeError(f"CONTROL of {len(payload)} octets above MAX_FRAME_BYTES")
        kind, message_id, body = frames.decode_control(payload)
        if kind == ControlKind.ACK:
            self._receive_ack(message_id, body, now, events)
            return
        if message_id <= self.last_peer_id:  # 0 included
            raise ProtocolError(f"CONTROL message id {message_id} does not increase")
        self.last_peer_id = message_id
        if not self._allowance.take(1, now):
            self._budget.spend(Cost.CONTROL, now)
        size = len(body)
        if (
            len(self.unanswered) >= MAX_UNANSWERED
            or self.unanswered_bytes + size > MAX_UNANSWERED_BYTES
        ):
            # Through the bounded queue, like every reply the peer provokes (§8.2).
            self._out.queue_control(
                frames.encode_control_ack(message_id, ControlStatus.REFUSED, BUSY_REASON)
            )
            return
        self.unanswered[message_id] = size
        self.unanswered_bytes += size
        events.append(ControlReceived(kind, message_id, body))

    def _receive_ack(self, message_id: int, body: bytes, now: float, events: list[Event]) -> None:
        status, reason = frames.decode_control_ack(body)
        if message_id == 0 or message_id > self.last_sent_id:
            raise ProtocolError(f"CONTROL ACK of message {message_id}, never sent")
        if message_id in self.outstanding:
            del self.outstanding[message_id]
            events.append(ControlAcknowledged(message_id, status, reason))
        else:  # a second ACK, or one we stopped waiting for: nothing to report
            self._budget.spend(Cost.CONTROL, now)
