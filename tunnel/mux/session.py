"""The multiplexer session: one tunnel connection's state machine.

``receive_data(data, now) -> list[Event]`` takes bytes from the peer; the
commands (:meth:`open_stream`, :meth:`send_data`, :meth:`end_stream`,
:meth:`reset_stream`, :meth:`acknowledge_received_data`, :meth:`ping`,
:meth:`go_away`) change state; :meth:`data_to_send` returns what to write, control
frames first, then DATA frames chosen fairly by the scheduler. Time is a
parameter; :meth:`next_deadline` / :meth:`handle_timer` drive keepalive, dead-peer
detection and stall detection.

Error scopes follow PROTOCOL.md §9: a :class:`StreamError` resets one stream and
costs error budget; any other :class:`ProtocolError` terminates the session with
GOAWAY. Only the codes travel; exception text stays in our logs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from tunnel.mux import frames
from tunnel.mux.budget import Cost, ErrorBudget
from tunnel.mux.constants import (
    HEADER,
    HEADER_SIZE,
    MAX_STREAM_ID,
    MAX_VERSION,
    MIN_VERSION,
    SETTING_DEFAULTS,
    ErrorCode,
    Flag,
    FrameType,
    SettingId,
)
from tunnel.mux.errors import (
    CalmError,
    MetadataError,
    MuxError,
    ProtocolError,
    SessionClosedError,
    StreamClosedError,
    StreamError,
    StreamLimitError,
)
from tunnel.mux.events import (
    ConnectionTerminated,
    Event,
    StreamReset,
)
from tunnel.mux.inbound import InboundFrames
from tunnel.mux.metadata import StreamMetadata
from tunnel.mux.reader import FrameReader, RawFrame
from tunnel.mux.scheduler import RoundRobin
from tunnel.mux.settings import SessionConfig
from tunnel.mux.stream import Stream, StreamInput, StreamState
from tunnel.mux.window import ReceiveWindow, RttEstimator

_END = int(Flag.END_STREAM)
_DATA = int(FrameType.DATA)
_pack_header = HEADER.pack
_MAX_OUTSTANDING_PINGS = 8
#: RTT measurement PINGs while data flows: at most 20 a second, well inside the
#: peer's error budget refill (PROTOCOL.md §8).
_MEASURE_PING_INTERVAL_S = 0.05


@dataclass(frozen=True, slots=True)
class SessionStatistics:
    """A snapshot (trio's ``statistics()``): cheap to take, safe to keep."""

    streams_open: int
    streams_opened_total: int
    bytes_sent: int
    bytes_received: int
    srtt_s: float | None
    min_rtt_s: float | None
    learned_stream_window: int
    connection_send_window: int
    connection_receive_unconsumed: int
    send_buffered: int
    pending_control_frames: int
    error_budget_left: float
    established: bool
    closing: bool


class Session(InboundFrames):
    """One end of a tunnel connection (PROTOCOL.md). ``client`` is the side that
    dialed: it allocates odd stream ids, the listener even ones (§6.3)."""

    def __init__(
        self, config: SessionConfig, *, client: bool, now: float, learned_window_hint: int = 0
    ) -> None:
        self.config = config
        self.client = client
        self._streams: dict[int, Stream] = {}
        self._next_stream_id = 1 if client else 2
        self._last_peer_stream_id = 0
        self._local_open = 0
        self._peer_open = 0
        self._opened_total = 0
        self._control: list[bytes | memoryview] = [
            frames.encode_hello(MIN_VERSION, MAX_VERSION, config.announced_settings())
        ]
        self._scheduler = RoundRobin()
        self._reader = FrameReader(max(config.max_frame_bytes, 4 + config.max_metadata_bytes))
        self.established = False
        self.version: int | None = None
        self.peer_settings: dict[int, int] = dict(SETTING_DEFAULTS)
        self._peer_max_frame = SETTING_DEFAULTS[SettingId.MAX_FRAME_BYTES]
        self._send_window = 0
        self._recv_window = ReceiveWindow(
            config.initial_connection_window_bytes, config.max_connection_window_bytes, now
        )
        self._announced_stream_window = config.initial_stream_window_bytes
        self._learned_window = min(learned_window_hint, config.max_stream_window_bytes)
        self._budget = ErrorBudget(config.error_budget, config.error_budget_refill_per_s, now)
        self.rtt = RttEstimator()
        self._pings: dict[bytes, float] = {}
        self._ping_counter = itertools.count(1)
        self._last_received = now
        self._next_ping_at = now + config.ping_interval_s
        self._last_measure_ping = now
        self._stalled: dict[int, float] = {}
        self._goaway_sent = False
        self._goaway_received = False
        self.terminated = False
        self._bytes_sent = 0
        self._bytes_received = 0

    # ------------------------------------------------------------------ receive

    def receive_data(self, data: bytes, now: float) -> list[Event]:
        """Feed bytes from the peer; returns the events they caused."""
        if self.terminated:
            return []
        events: list[Event] = []
        self._last_received = now
        self._bytes_received += len(data)
        try:
            self._dispatch_frames(self._reader.feed(data), now, events)
        except ProtocolError as exc:
            # Whole frames before a framing fault in the same read are processed
            # first: the first error in byte order wins however the bytes were
            # split (§2.3).
            earlier: list[RawFrame] = getattr(exc, "frames_before", [])
            if earlier and not self.terminated:
                try:
                    self._dispatch_frames(earlier, now, events)
                except ProtocolError as first:
                    exc = first
            self._terminate(exc.code, _public_reason(exc.code), events)
        return events

    def _dispatch_frames(self, raw_frames: list[RawFrame], now: float, events: list[Event]) -> None:
        handlers = _HANDLERS
        for frame_type, flags, stream_id, payload in raw_frames:
            if not self.established and frame_type != FrameType.HELLO:
                raise ProtocolError("first frame is not HELLO")
            try:
                if frame_type == _DATA:
                    self._on_data(stream_id, flags, payload, now, events)
                else:
                    handler = handlers.get(frame_type)
                    if handler is not None:  # unknown types are ignored (§5)
                        handler(self, stream_id, flags, payload, now, events)
            except StreamError as exc:
                self._charge(Cost.STREAM_ERROR, now)
                self._reset_and_report(exc.stream_id, exc.code, events, remote=False)
            if self.terminated:
                return

    # ----------------------------------------------------------------- commands

    def open_stream(self, metadata: StreamMetadata | bytes, *, end_stream: bool = False) -> int:
        """Open a stream; DATA may follow at once (0-RTT, PROTOCOL.md §6.1)."""
        if self.terminated or self._goaway_sent or self._goaway_received:
            raise SessionClosedError("session is closing")
        if not self.established:
            raise SessionClosedError("session not established yet")
        if self._local_open >= self.peer_settings[SettingId.MAX_CONCURRENT_STREAMS]:
            raise StreamLimitError("peer's MAX_CONCURRENT_STREAMS reached")
        stream_id = self._next_stream_id
        if stream_id > MAX_STREAM_ID:
            self.go_away(ErrorCode.NO_ERROR, "stream ids exhausted")
            raise SessionClosedError("stream ids exhausted")
        encoded = metadata if isinstance(metadata, bytes) else metadata.encode()
        if len(encoded) > self.peer_settings[SettingId.MAX_METADATA_BYTES]:
            raise MetadataError("metadata larger than the peer's MAX_METADATA_BYTES")
        self._next_stream_id += 2
        window = self.stream_window_estimate()
        stream = Stream(
            stream_id,
            local=True,
            send_window=self.peer_settings[SettingId.INITIAL_STREAM_WINDOW],
            recv_window=ReceiveWindow(
                window,
                self.config.max_stream_window_bytes,
                self._last_received,
                self.config.min_stream_window_bytes,
            ),
        )
        self._streams[stream_id] = stream
        self._local_open += 1
        self._opened_total += 1
        self._control.append(frames.encode_open(stream_id, window, encoded, end_stream))
        if end_stream:
            stream.transition(StreamInput.SEND_END)
            stream.end_sent = True
        return stream_id

    def send_data(self, stream_id: int, data: bytes, *, end_stream: bool = False) -> None:
        """Queue ``data`` (not copied: pass immutable bytes). Never blocks and
        never refuses for lack of window: the caller watches :meth:`send_buffered`
        and pauses its source above its high-water mark."""
        stream = self._streams.get(stream_id)
        if stream is None or self.terminated:
            raise StreamClosedError(f"stream {stream_id} is not open")
        if data:
            if not stream.transition(StreamInput.SEND_DATA):
                raise StreamClosedError(f"stream {stream_id} already ended locally")
            stream.send_queue.append(data)
            stream.send_buffered += len(data)
        if end_stream and not stream.transition(StreamInput.SEND_END):
            raise StreamClosedError(f"stream {stream_id} already ended locally")
        if stream.send_window > 0 or (end_stream and not stream.send_buffered):
            self._scheduler.push(stream_id)
        elif stream.stall_since is None and stream.send_buffered:  # only data waits: a stall
            stream.stall_since = self._last_received
            self._stalled[stream_id] = self._last_received

    def end_stream(self, stream_id: int) -> None:
        """Half-close our side once the queued data is sent."""
        self.send_data(stream_id, b"", end_stream=True)

    def reset_stream(self, stream_id: int, error_code: int = ErrorCode.CANCEL) -> None:
        """Abort a stream both ways; queued data is dropped. Resetting a stream
        that is already gone is a no-op (it may have closed meanwhile)."""
        stream = self._streams.get(stream_id)
        if stream is None or self.terminated:
            return
        self._forget(stream)
        self._control.append(frames.encode_reset(stream_id, error_code))

    def acknowledge_received_data(self, stream_id: int, n: int, now: float) -> None:
        """The application consumed ``n`` octets of ``stream_id``: return the
        credit (PROTOCOL.md §7.3), possibly growing the windows."""
        stream = self._streams.get(stream_id)
        if stream is None or self.terminated:
            return  # a forgotten stream's credit went back when it closed
        # Never more than was received: an over-ack would grant the peer credit
        # for memory we do not have (§7.3).
        n = min(n, stream.recv_window.unconsumed)
        if n <= 0:
            return
        rtt = self.rtt
        # The connection window is a memory bound, not a rate control: it is
        # sized from the stream estimate (_announce_stream_window), not tuned.
        increment = self._recv_window.consume(n, now)
        if increment:
            self._control.append(frames.encode_window_update(0, increment))
        increment = stream.recv_window.consume(n, now, rtt)
        if increment and not stream.peer_ended:
            self._control.append(frames.encode_window_update(stream_id, increment))
            if now - self._last_measure_ping >= _MEASURE_PING_INTERVAL_S:
                self._last_measure_ping = now  # keep the delay signal fresh (window.py)
                self._send_ping(now)
            if stream.recv_window.size > self._learned_window:
                self._learn_window(stream.recv_window.size, now)

    def _learn_window(self, size: int, now: float) -> None:
        """A stream proved the path needs a bigger window: seed new streams with it."""
        self._learned_window = size
        self._announce_stream_window()

    def stream_window_estimate(self) -> int:
        """The receive window a new stream starts with (IMPLEMENTATION.md §N7.4): the
        connection's bandwidth-delay estimate, i.e. the larger of the measured
        minimum RTT times ``initial_rate_bytes_per_s`` and the largest window a
        stream has auto-tuned to; before any RTT sample, the configured
        ``initial_stream_window_bytes``. Clamped to the configured bounds."""
        config = self.config
        rtt = self.rtt.min
        if rtt is None:
            estimate = config.initial_stream_window_bytes
        else:
            estimate = int(rtt * config.initial_rate_bytes_per_s)
        estimate = max(estimate, self._learned_window, config.min_stream_window_bytes)
        return min(estimate, config.max_stream_window_bytes)

    def _announce_stream_window(self) -> None:
        """Streams the peer opens start from our announced INITIAL_STREAM_WINDOW;
        raise it (it may only grow, §5.2) when the estimate has doubled, and make
        sure the connection window can carry such streams."""
        target = self.stream_window_estimate()
        if target >= 2 * self._announced_stream_window:
            self._announced_stream_window = target
            self._control.append(frames.encode_settings({SettingId.INITIAL_STREAM_WINDOW: target}))
        increment = self._recv_window.raise_size(2 * target)
        if increment:
            self._control.append(frames.encode_window_update(0, increment))

    def _return_connection_credit(self, n: int, now: float) -> None:
        if n:
            increment = self._recv_window.consume(n, now)
            if increment:
                self._control.append(frames.encode_window_update(0, increment))

    def ping(self, now: float) -> None:
        """Send a PING; its PONG yields :class:`PingAcknowledged` with the RTT."""
        if not self.terminated:
            self._send_ping(now)

    def _send_ping(self, now: float) -> None:
        if len(self._pings) >= _MAX_OUTSTANDING_PINGS:
            return
        opaque = next(self._ping_counter).to_bytes(8, "big")
        self._pings[opaque] = now
        self._control.append(frames.encode_ping(opaque))

    def go_away(self, error_code: int = ErrorCode.NO_ERROR, reason: str = "") -> None:
        """Refuse new streams from the peer; streams up to the last one we saw
        may finish (PROTOCOL.md §6.6). Idempotent."""
        if self.terminated or self._goaway_sent:
            return
        self._goaway_sent = True
        self._control.append(frames.encode_goaway(self._last_peer_stream_id, error_code, reason))

    def connection_lost(self, reason: str = "transport closed") -> list[Event]:
        """The transport is gone: every stream is reset, the session is over."""
        events: list[Event] = []
        if not self.terminated:
            self._terminate(ErrorCode.CANCEL, reason, events, remote=True, send_goaway=False)
        return events

    # ------------------------------------------------------------------- output

    def data_to_send(self, max_data_bytes: int = 256 * 1024) -> list[bytes | memoryview]:
        """Frames to write, for ``writelines``: all control frames, then DATA
        frames round-robin across ready streams up to ``max_data_bytes``."""
        out: list[bytes | memoryview] = self._control
        self._control = []
        if self.terminated or not self.established:
            self._count_sent(out)
            return out
        budget = max_data_bytes
        scheduler = self._scheduler
        streams = self._streams
        max_frame = self._peer_max_frame
        while budget > 0 and self._send_window > 0:
            stream_id = scheduler.pop()
            if stream_id is None:
                break
            stream = streams.get(stream_id)
            if stream is None:
                continue
            n = min(stream.send_buffered, stream.send_window, self._send_window, max_frame)
            # END_STREAM goes out once (§6.4), whether it was sent on OPEN or in
            # DATA: an empty send_data() after it sends nothing.
            end = stream.end_queued and not stream.end_sent and n == stream.send_buffered
            if n == 0 and not end:
                if stream.send_buffered:  # nothing to send is not a stall
                    self._mark_stalled(stream)
                continue
            chunks = stream.take(n)
            stream.send_window -= n
            self._send_window -= n
            budget -= n + HEADER_SIZE
            out.append(_pack_header(_DATA, _END if end else 0, stream_id, n))
            out.extend(chunks)
            if end:
                stream.end_sent = True
                if stream.finished:
                    self._forget(stream)
            elif stream.send_buffered:
                if stream.send_window > 0:
                    scheduler.push(stream_id)
                else:
                    self._mark_stalled(stream)
        self._count_sent(out)
        return out

    def _count_sent(self, out: list[bytes | memoryview]) -> None:
        self._bytes_sent += sum(map(len, out))

    def _mark_stalled(self, stream: Stream) -> None:
        if stream.stall_since is None:
            stream.stall_since = self._last_received
            self._stalled[stream.stream_id] = self._last_received

    def send_buffered(self, stream_id: int) -> int:
        """Octets the application queued on ``stream_id`` not yet sent."""
        stream = self._streams.get(stream_id)
        return stream.send_buffered if stream is not None else 0

    @property
    def wants_to_send(self) -> bool:
        return bool(self._control) or (bool(self._scheduler) and self._send_window > 0)

    # -------------------------------------------------------------------- timers

    def next_deadline(self) -> float:
        """When :meth:`handle_timer` next has work: the next keepalive PING or
        the moment the peer would be declared dead, whichever is first."""
        return min(self._next_ping_at, self._last_received + self.config.ping_timeout_s)

    def handle_timer(self, now: float) -> list[Event]:
        events: list[Event] = []
        if self.terminated:
            return events
        if now - self._last_received >= self.config.ping_timeout_s:
            self._terminate(ErrorCode.TIMEOUT, "ping timeout", events, send_goaway=True)
            return events
        if now >= self._next_ping_at:
            if self.established:
                self._send_ping(now)
            self._next_ping_at = now + self.config.ping_interval_s
            try:
                self._reset_stalled(now, events)
            except ProtocolError as exc:
                self._terminate(exc.code, _public_reason(exc.code), events)
        return events

    def _reset_stalled(self, now: float, events: list[Event]) -> None:
        timeout = self.config.stall_timeout_s
        for stream_id, since in list(self._stalled.items()):
            if now - since >= timeout:
                self._reset_and_report(stream_id, ErrorCode.STALLED, events, remote=False)
                self._charge(Cost.STALLED_STREAM, now)

    # ---------------------------------------------------------------- internals

    def _queue_control(self, frame: bytes) -> None:
        if len(self._control) >= self.config.max_pending_control_frames:
            raise CalmError("peer does not read its control replies")
        self._control.append(frame)

    def _charge(self, cost: float, now: float) -> None:
        if not self._budget.charge(cost, now):
            raise CalmError("error budget exhausted")

    def _reset_and_report(
        self, stream_id: int, code: int, events: list[Event], *, remote: bool
    ) -> None:
        stream = self._streams.get(stream_id)
        self._queue_control(frames.encode_reset(stream_id, code))
        if stream is not None:
            self._forget(stream)
            events.append(StreamReset(stream_id, code, remote=remote))

    def _forget(self, stream: Stream) -> None:
        """Drop a stream; its unconsumed octets go back to the connection window
        so a stream that ends unread never leaks connection credit."""
        stream_id = stream.stream_id
        if self._streams.pop(stream_id, None) is None:
            return
        stream.state = StreamState.CLOSED
        if stream.local:
            self._local_open -= 1
        else:
            self._peer_open -= 1
        if stream.stall_since is not None:
            self._stalled.pop(stream_id, None)
        unconsumed = stream.recv_window.unconsumed
        if unconsumed:
            self._return_connection_credit(unconsumed, self._last_received)

    def _terminate(
        self,
        code: int,
        reason: str,
        events: list[Event],
        *,
        remote: bool = False,
        send_goaway: bool = True,
    ) -> None:
        if self.terminated:
            return
        if send_goaway and not self._goaway_sent:
            self._goaway_sent = True
            self._control.append(frames.encode_goaway(self._last_peer_stream_id, code, reason))
        for stream_id in list(self._streams):
            events.append(StreamReset(stream_id, code, remote=remote))
        self._streams.clear()
        self._local_open = self._peer_open = 0
        self.terminated = True
        events.append(ConnectionTerminated(code, reason, remote=remote))

    # --------------------------------------------------------------- inspection

    @property
    def closing(self) -> bool:
        return self._goaway_sent or self._goaway_received or self.terminated

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def can_open_stream(self) -> bool:
        return (
            self.established
            and not self.closing
            and self._local_open < self.peer_settings[SettingId.MAX_CONCURRENT_STREAMS]
        )

    @property
    def learned_stream_window(self) -> int:
        return self._learned_window

    def statistics(self) -> SessionStatistics:
        return SessionStatistics(
            streams_open=len(self._streams),
            streams_opened_total=self._opened_total,
            bytes_sent=self._bytes_sent,
            bytes_received=self._bytes_received,
            srtt_s=self.rtt.smoothed,
            min_rtt_s=self.rtt.min,
            learned_stream_window=self._learned_window,
            connection_send_window=self._send_window,
            connection_receive_unconsumed=self._recv_window.unconsumed,
            send_buffered=sum(s.send_buffered for s in self._streams.values()),
            pending_control_frames=len(self._control),
            error_budget_left=self._budget.tokens,
            established=self.established,
            closing=self.closing,
        )


#: Control frame handlers by type, as plain functions of the session. Not bound
#: methods kept on each session: those would make every session a reference
#: cycle, left behind by each closed tunnel connection until a full collection.
_Handler = Callable[["Session", int, int, bytes, float, list[Event]], None]
_HANDLERS: dict[int, _Handler] = {
    FrameType.HELLO: Session._on_hello,
    FrameType.SETTINGS: Session._on_settings,
    FrameType.OPEN: Session._on_open,
    FrameType.WINDOW_UPDATE: Session._on_window_update,
    FrameType.RESET: Session._on_reset,
    FrameType.PING: Session._on_ping,
    FrameType.PONG: Session._on_pong,
    FrameType.GOAWAY: Session._on_goaway,
}


def _public_reason(code: int) -> str:
    """The fixed text sent in GOAWAY: never the exception's own message."""
    return ErrorCode.name_of(code).lower().replace("_", " ")


__all__ = ["MuxError", "Session", "SessionStatistics"]
