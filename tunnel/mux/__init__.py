"""The sans-I/O multiplexer: bytes in, events out; commands in, bytes out.

Nothing in this package performs I/O, reads a clock or imports asyncio, socket
or ssl (``tests/unit/test_mux_purity.py`` enforces it). Time is an argument
(``now``) and the next deadline is state (:meth:`Session.next_deadline`), as in
aioquic.
"""

from tunnel.mux.constants import ControlKind, ControlStatus, ErrorCode, FrameType
from tunnel.mux.errors import (
    ControlError,
    FlowControlError,
    FrameSizeError,
    MuxError,
    ProtocolError,
    SessionClosedError,
    StreamClosedError,
    StreamLimitError,
)
from tunnel.mux.events import (
    ConnectionTerminated,
    ControlAcknowledged,
    ControlReceived,
    DataReceived,
    Event,
    GoAwayReceived,
    PingAcknowledged,
    SessionEstablished,
    StreamEnded,
    StreamOpened,
    StreamReset,
)
from tunnel.mux.metadata import StreamMetadata
from tunnel.mux.session import Session, SessionStatistics
from tunnel.mux.settings import SessionConfig

__all__ = [
    "ConnectionTerminated",
    "ControlAcknowledged",
    "ControlError",
    "ControlKind",
    "ControlReceived",
    "ControlStatus",
    "DataReceived",
    "ErrorCode",
    "Event",
    "FlowControlError",
    "FrameSizeError",
    "FrameType",
    "GoAwayReceived",
    "MuxError",
    "PingAcknowledged",
    "ProtocolError",
    "Session",
    "SessionClosedError",
    "SessionConfig",
    "SessionEstablished",
    "SessionStatistics",
    "StreamClosedError",
    "StreamEnded",
    "StreamLimitError",
    "StreamMetadata",
    "StreamOpened",
    "StreamReset",
]
