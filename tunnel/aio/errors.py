"""What the asyncio adapters raise: one family, each with the PROTOCOL.md §9
error code that says what happened, so a caller catches :class:`TunnelError`
and reads ``.code`` instead of catching the core's and the socket's errors
side by side.

``TunnelError`` is a :class:`ConnectionError` (hence an :class:`OSError`): code
that already treats a failed connection as such keeps doing so.
"""

from __future__ import annotations

from tunnel.mux import ErrorCode

__all__ = [
    "ControlLost",
    "ControlSendError",
    "ControlTimeout",
    "NoTunnelAvailable",
    "PeerRefused",
    "StreamOpenError",
    "StreamResetError",
    "TunnelError",
    "TunnelHandshakeError",
]


class TunnelError(ConnectionError):
    """Base of the adapters' errors; ``code`` is a PROTOCOL.md §9 error code."""

    code: int = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class StreamResetError(TunnelError):
    """The stream was reset; ``code`` is its wire error code."""

    def __init__(self, code: int, remote: bool) -> None:
        # No message until one is read (__str__): every request stream ends
        # with a reset (IDLE, PROTOCOL.md §6.5.1) whose error nobody prints.
        self.args = (code, remote)
        self.code = code
        self.remote = remote

    def __str__(self) -> str:
        who = "peer" if self.remote else "local side"
        return f"stream reset by {who}: {ErrorCode.name_of(self.code)}"


class StreamOpenError(TunnelError):
    """A stream could not be opened on a connection (it is closing, at its
    stream limit, or the metadata is too long): the core's code."""


class NoTunnelAvailable(TunnelError):
    """No connection of a pool can take a new stream right now."""

    code = ErrorCode.REFUSED_STREAM


class TunnelHandshakeError(TunnelError):
    """The connection opened but the tunnel did not come up: the peer refused us
    (TLS alert, identity not allowed) or spoke something else."""

    code = ErrorCode.PROTOCOL_ERROR


class PeerRefused(TunnelError):
    """Raised by an authorizer: the peer is not allowed (the reason is logged)."""

    code = ErrorCode.REFUSED_STREAM


class ControlTimeout(TunnelError):
    """No ACK of a CONTROL message in time (PROTOCOL.md §5.14): the peer may
    predate CONTROL (it ignores the frame), be slow, or be gone. Whether the
    message was applied is unknown."""

    code = ErrorCode.TIMEOUT


class ControlLost(TunnelError):
    """The connection ended (or was not up) before a CONTROL message's ACK
    came: whether it was applied is unknown. ``code`` is how it ended."""

    code = ErrorCode.CANCEL


class ControlSendError(TunnelError):
    """A CONTROL message cannot go on this connection: a kind out of range, or
    a body above the peer's MAX_FRAME_BYTES (less 6). Nothing was sent."""
