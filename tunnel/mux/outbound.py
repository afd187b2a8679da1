"""The send side of a session: what goes on the wire, in what order, within what
credit (PROTOCOL.md §7.1, §7.4).

Control frames go first, in the order they were queued; then DATA frames,
chosen fairly by the scheduler (:mod:`tunnel.mux.scheduler`), each within the
stream's and the connection's send window and the peer's MAX_FRAME_BYTES.
"""

from __future__ import annotations

from collections.abc import Callable

from tunnel.mux import frames
from tunnel.mux.constants import (
    HEADER,
    HEADER_SIZE,
    MAX_WINDOW,
    SETTING_DEFAULTS,
    Flag,
    FrameType,
    SettingId,
)
from tunnel.mux.errors import CalmError, FlowControlError, ProtocolError
from tunnel.mux.scheduler import RoundRobin
from tunnel.mux.stream import Stream

_END = int(Flag.END_STREAM)
_DATA = int(FrameType.DATA)
_pack_header = HEADER.pack


class Outbound:
    """Everything this end has to send, and the peer's credit for it.

    Owns ``control`` (frames to write before any DATA, in order), ``window``
    (the connection send window: octets of DATA the peer accepts), ``max_frame``
    (the peer's MAX_FRAME_BYTES), ``scheduler`` (streams that may have DATA or a
    bare END_STREAM ready), ``stalled`` (streams whose queued data waits for
    stream window, and since when), ``goaway_sent``, ``bytes_sent`` and the
    credit-wait counters (``stalls``, ``stalled_s``: how often and how long
    streams waited for stream window; ``window_blocked_s``: how long DATA
    waited for the connection window), which only ever grow.

    Invariants: ``window`` never goes below 0, nor a stream's ``send_window``:
    a DATA frame takes at most both, and at most ``max_frame`` octets. A stream
    is in ``stalled`` exactly while its ``stall_since`` is set. Whoever makes a
    stream ready pushes it on ``scheduler``; :meth:`take` skips those forgotten
    since and those with nothing to send. Replies the peer provokes go through
    :meth:`queue_control`, bounded by ``max_pending_control_frames`` (§8.2);
    frames of our own commands are appended to ``control`` directly. At most one
    GOAWAY is sent.
    """

    __slots__ = (
        "_blocked_since",
        "_max_pending_control",
        "bytes_sent",
        "control",
        "goaway_sent",
        "max_frame",
        "scheduler",
        "stalled",
        "stalled_s",
        "stalls",
        "window",
        "window_blocked_s",
    )

    def __init__(self, hello: bytes, max_pending_control: int) -> None:
        self.control: list[bytes | memoryview] = [hello]
        self.scheduler = RoundRobin()
        self.window = 0  # until the peer's HELLO grants INITIAL_CONNECTION_WINDOW
        self.max_frame = SETTING_DEFAULTS[SettingId.MAX_FRAME_BYTES]
        self.stalled: dict[int, float] = {}
        self.goaway_sent = False
        self.bytes_sent = 0
        self._max_pending_control = max_pending_control
        self.stalls = 0
        self.stalled_s = 0.0
        self.window_blocked_s = 0.0
        self._blocked_since: float | None = None

    def queue_control(self, frame: bytes) -> None:
        """Queue a reply the peer provoked; a peer that does not read them is
        cut off before they fill our memory (§8.2)."""
        if len(self.control) >= self._max_pending_control:
            raise CalmError("peer does not read its control replies")
        self.control.append(frame)

    def go_away(self, last_stream_id: int, code: int, reason: str) -> None:
        """Queue GOAWAY, once (§6.6)."""
        if not self.goaway_sent:
            self.goaway_sent = True
            self.control.append(frames.encode_goaway(last_stream_id, code, reason))

    def set_peer_limits(self, window: int, max_frame: int) -> None:
        """The peer's HELLO: its INITIAL_CONNECTION_WINDOW and MAX_FRAME_BYTES."""
        self.window = window
        self.max_frame = max_frame

    def credit_connection(self, increment: int, now: float) -> None:
        """A WINDOW_UPDATE on stream 0 (§5.7, §7.1)."""
        if increment == 0:
            raise ProtocolError("WINDOW_UPDATE of 0 on the connection")
        self.window += increment
        if self._blocked_since is not None:
            self.window_blocked_s += max(0.0, now - self._blocked_since)
            self._blocked_since = None
        if self.window > MAX_WINDOW:
            raise FlowControlError("connection window above 2^31-1")

    def mark_stalled(self, stream: Stream, since: float) -> None:
        """``stream`` has data queued and no stream window to send it."""
        if stream.stall_since is None:
            stream.stall_since = since
            self.stalled[stream.stream_id] = since
            self.stalls += 1

    def unstall(self, stream: Stream, now: float) -> None:
        """``stream`` got window, or left the session."""
        if stream.stall_since is not None:
            self.stalled_s += max(0.0, now - stream.stall_since)
            stream.stall_since = None
            self.stalled.pop(stream.stream_id, None)

    def expired_stalls(self, now: float, timeout: float) -> list[int]:
        """Streams stalled for ``timeout`` seconds or more (§8.3)."""
        return [stream_id for stream_id, since in self.stalled.items() if now - since >= timeout]

    def take_control(self) -> list[bytes | memoryview]:
        """The queued control frames alone (before HELLO completes, or after the end)."""
        out = self.control
        self.control = []
        self.bytes_sent += sum(map(len, out))
        return out

    def take(
        self,
        max_data_bytes: int,
        streams: dict[int, Stream],
        forget: Callable[[Stream, float], None],
        now: float,
    ) -> list[bytes | memoryview]:
        """Frames to write: all control frames, then DATA frames round-robin
        across ready ``streams`` up to ``max_data_bytes``. A stream whose
        END_STREAM goes out after the peer's is finished: ``forget`` it; one
        that runs out of window is stalled from ``now``."""
        out = self.control
        self.control = []
        budget = max_data_bytes
        scheduler = self.scheduler
        max_frame = self.max_frame
        while budget > 0 and self.window > 0:
            stream_id = scheduler.pop()
            if stream_id is None:
                break
            stream = streams.get(stream_id)
            if stream is None:
                continue
            n = min(stream.send_buffered, stream.send_window, self.window, max_frame)
            # END_STREAM goes out once (§6.4), whether it was sent on OPEN or in
            # DATA: an empty send_data() after it sends nothing.
            end = stream.end_queued and not stream.end_sent and n == stream.send_buffered
            if n == 0 and not end:
                if stream.send_buffered:  # nothing to send is not a stall
                    self.mark_stalled(stream, now)
                continue
            chunks = stream.take(n)
            stream.send_window -= n
            self.window -= n
            budget -= n + HEADER_SIZE
            out.append(_pack_header(_DATA, _END if end else 0, stream_id, n))
            out.extend(chunks)
            if end:
                stream.end_sent = True
                if stream.finished:
                    forget(stream, now)
            elif stream.send_buffered:
                if stream.send_window > 0:
                    scheduler.push(stream_id)
                else:
                    self.mark_stalled(stream, now)
        if self.window <= 0 and scheduler and self._blocked_since is None:
            self._blocked_since = now  # DATA waits for connection credit
        self.bytes_sent += sum(map(len, out))
        return out
