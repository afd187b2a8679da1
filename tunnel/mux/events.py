"""Events the session reports, named in the past tense (STYLE.md §5).

Slotted dataclasses, immutable by convention rather than ``frozen=True``
(which sets each field through ``object.__setattr__``: 0.27 us against 0.11 us
for a two-field event); one or more are made per frame on the hot path.
Nothing mutates an event after creation.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunnel.mux.constants import ControlStatus
from tunnel.mux.metadata import StreamMetadata


@dataclass(slots=True)
class SessionEstablished:
    """The peer's HELLO arrived and the version was agreed: streams may open."""

    version: int
    peer_settings: dict[int, int]


@dataclass(slots=True)
class StreamOpened:
    """The peer opened a stream (PROTOCOL.md §6.1)."""

    stream_id: int
    metadata: StreamMetadata


@dataclass(slots=True)
class DataReceived:
    """Stream bytes arrived. Credit returns only when the application calls
    :meth:`Session.acknowledge_received_data` (PROTOCOL.md §7)."""

    stream_id: int
    data: bytes


@dataclass(slots=True)
class StreamEnded:
    """The peer half-closed its side of the stream (END_STREAM)."""

    stream_id: int


@dataclass(slots=True)
class StreamReset:
    """The stream is gone. ``remote`` tells whether the peer reset it or the
    session did (a stream-scoped error, a stall, a GOAWAY, a dead connection)."""

    stream_id: int
    error_code: int
    remote: bool


@dataclass(slots=True)
class PingAcknowledged:
    """A PONG answered one of our PINGs; ``rtt_s`` is that round trip."""

    rtt_s: float


@dataclass(slots=True)
class GoAwayReceived:
    """The peer is draining: streams above ``last_stream_id`` that we opened
    were not processed (they are reset with REFUSED_STREAM and may be retried)."""

    last_stream_id: int
    error_code: int
    reason: str


@dataclass(slots=True)
class ControlReceived:
    """The peer sent an application CONTROL message (PROTOCOL.md §5.14). The
    application answers it with :meth:`Session.acknowledge_control`, once."""

    kind: int
    message_id: int
    body: bytes


@dataclass(slots=True)
class ControlAcknowledged:
    """The peer answered our CONTROL message ``message_id`` (§5.14)."""

    message_id: int
    status: ControlStatus
    reason: str


@dataclass(slots=True)
class ConnectionTerminated:
    """The session is over; the adapter sends what is queued, then closes."""

    error_code: int
    reason: str
    remote: bool


Event = (
    SessionEstablished
    | StreamOpened
    | DataReceived
    | StreamEnded
    | StreamReset
    | PingAcknowledged
    | GoAwayReceived
    | ControlReceived
    | ControlAcknowledged
    | ConnectionTerminated
)
