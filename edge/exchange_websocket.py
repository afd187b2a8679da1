"""The edge's own Close of a relayed WebSocket (a drain), one side at a time.

An exchange relays an accepted WebSocket's octets as they come and follows
their frames (:class:`edge.ws_frames.FrameTracker`, one per direction). When
the edge itself ends the session (a drain), each side gets a Close with the
edge's status code (masked toward the backend, as a client's, RFC 6455
§5.3), at that direction's next frame boundary so no frame is cut in half;
the peers' Close replies then end it as any close does. Sans-I/O: this part
says which octets to relay and the exchange relays them.
"""

from __future__ import annotations

from edge.request_record import RequestRecord
from edge.ws_frames import FrameTracker, close_frame

__all__ = ["WebSocketClose", "relay"]

_TO_BACKEND = 1
_TO_CLIENT = 2


class WebSocketClose:
    """The edge closing one WebSocket: its status code and the sides that had their Close.

    Invariants: each side gets exactly one Close, at a frame boundary of its
    direction; after its Close a side is relayed nothing more.
    """

    __slots__ = ("_sent", "code")

    def __init__(self, code: int) -> None:
        self.code = code
        self._sent = 0  # _TO_BACKEND | _TO_CLIENT

    def until_close(self, frames: FrameTracker, data: bytes, *, to_backend: bool) -> bytes:
        """What to relay of ``data`` (next in the direction ``frames`` follows):
        the rest of the frame in progress, then the Close once at a boundary;
        nothing once that side had its Close. What is relayed is fed to ``frames``
        up to, not including, the Close."""
        side = _TO_BACKEND if to_backend else _TO_CLIENT
        if self._sent & side:
            return b""
        keep = frames.until_boundary(data)
        relay = data[:keep]
        if keep:
            frames.feed(relay)
        if frames.at_boundary:
            self._sent |= side
            return relay + close_frame(self.code, masked=to_backend)
        return relay


def relay(
    frames: FrameTracker,
    closing: WebSocketClose | None,
    data: bytes,
    record: RequestRecord,
    *,
    to_backend: bool,
) -> bytes:
    """What to relay of ``data``, next in one direction of an accepted WebSocket
    (``frames`` follows it): all of it, its frames followed and the session's
    first Close recorded on ``record`` (its code, and who sent it); once the
    edge closes the session (``closing``), up to and including the edge's Close."""
    if closing is not None:
        return closing.until_close(frames, data, to_backend=to_backend)
    frames.feed(data)
    if frames.close_code is not None and record.ws_closed_by is None:
        record.ws_close_code = frames.close_code
        record.ws_closed_by = "client" if to_backend else "backend"
    return data
