"""Typed errors of the multiplexer, each carrying its wire error code.

Two scopes, as in h2 (PROTOCOL.md §9):

- a *connection* error breaks the framing or the session's invariants: the
  session sends GOAWAY with the code and reports :class:`ConnectionTerminated`;
- a *stream* error (:class:`StreamError`) resets one stream; siblings carry on.

Exception text is for our logs only; the wire carries the code (and for GOAWAY
a fixed reason string chosen by the session, never ``str(exc)``).
"""

from __future__ import annotations

from tunnel.mux.constants import ErrorCode


class MuxError(Exception):
    """Base of every error the multiplexer raises."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ProtocolError(MuxError):
    """The peer broke PROTOCOL.md at connection scope."""

    code = ErrorCode.PROTOCOL_ERROR


class FrameSizeError(ProtocolError):
    code = ErrorCode.FRAME_SIZE_ERROR


class FlowControlError(ProtocolError):
    code = ErrorCode.FLOW_CONTROL_ERROR


class VersionMismatchError(ProtocolError):
    code = ErrorCode.VERSION_MISMATCH


class CalmError(ProtocolError):
    """The peer spent its error budget or flooded us (PROTOCOL.md §8)."""

    code = ErrorCode.ENHANCE_YOUR_CALM


class StreamError(MuxError):
    """The peer broke the protocol on one stream: reset it, keep the rest."""

    code = ErrorCode.PROTOCOL_ERROR

    def __init__(self, stream_id: int, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message, code)
        self.stream_id = stream_id


# Errors of *local* misuse: raised to the caller of a command, nothing is sent.


class StreamClosedError(MuxError):
    """A command named a stream that is closed (or never existed) locally."""

    code = ErrorCode.STREAM_CLOSED


class StreamLimitError(MuxError):
    """Opening one more stream would exceed the peer's MAX_CONCURRENT_STREAMS."""

    code = ErrorCode.REFUSED_STREAM


class SessionClosedError(MuxError):
    """The session is terminated or going away: no new streams, no new data."""

    code = ErrorCode.REFUSED_STREAM


class MetadataError(MuxError):
    """Stream metadata is malformed or too large."""

    code = ErrorCode.METADATA_ERROR


class ControlError(MuxError):
    """A CONTROL command the session cannot carry out (PROTOCOL.md §5.14): a
    kind out of range, a body above the peer's MAX_FRAME_BYTES, an ACK for a
    message not received or already answered. Nothing is sent."""
