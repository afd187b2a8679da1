"""The multiplexer session: one tunnel connection's state machine.

``receive_data(data, now) -> list[Event]`` takes bytes from the peer; the
commands (:meth:`open_stream`, :meth:`send_data`, :meth:`end_stream`,
:meth:`reset_stream`, :meth:`acknowledge_received_data`, :meth:`ping`,
:meth:`go_away`, :meth:`send_control`, :meth:`acknowledge_control`) change
state; :meth:`data_to_send` returns what to write, control frames first, then
DATA frames chosen fairly by the scheduler. Time is a parameter;
:meth:`next_deadline` / :meth:`handle_timer` drive keepalive, dead-peer detection
and stall detection.

Error scopes follow PROTOCOL.md §9: a :class:`StreamError` resets one stream and
costs error budget; any other :class:`ProtocolError` terminates the session with
GOAWAY. Only the codes travel; exception text stays in our logs.

The session is composed of parts, each owning one concern (as h2 composes
``WindowManager`` and ``H2Stream``): the :class:`StreamTable` (streams by id,
ids, counts), :class:`Outbound` (what is queued to send, the connection send
window, the scheduler, stalls), :class:`ReceiveCredit` (the connection receive
window, the window new streams start from), :class:`Pings` (PINGs in flight,
RTT samples), :class:`ControlMessages` (CONTROL messages both ways, §5.14),
:class:`Inbound` (the frame handlers, what the peer told us) and the
:class:`ErrorBudget`. The session runs the commands and the timers on them,
and ends the connection.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunnel.mux import frames
from tunnel.mux.budget import Cost, ErrorBudget
from tunnel.mux.constants import (
    MAX_STREAM_ID,
    MAX_VERSION,
    MIN_VERSION,
    SETTING_DEFAULTS,
    ControlStatus,
    ErrorCode,
    SettingId,
)
from tunnel.mux.control import ControlMessages
from tunnel.mux.errors import (
    MetadataError,
    MuxError,
    ProtocolError,
    SessionClosedError,
    StreamClosedError,
    StreamLimitError,
)
from tunnel.mux.events import ConnectionTerminated, Event, StreamReset
from tunnel.mux.inbound import Inbound
from tunnel.mux.metadata import StreamMetadata
from tunnel.mux.outbound import Outbound
from tunnel.mux.pings import Pings
from tunnel.mux.reader import FrameReader, RawFrame
from tunnel.mux.receive_credit import ReceiveCredit
from tunnel.mux.settings import SessionConfig
from tunnel.mux.stream import StreamInput
from tunnel.mux.stream_table import StreamTable
from tunnel.mux.window import ReceiveWindow, RttEstimator

#: RTT measurement PINGs while data flows: at most 20 a second, well inside the
#: peer's error budget refill (PROTOCOL.md §8).
_MEASURE_PING_INTERVAL_S = 0.05

# Enum members as module names: one read off its class goes through
# ``EnumType.__getattr__``'s slot (~1,000 instructions in 3.11), several a request.
_MAX_CONCURRENT_STREAMS = SettingId.MAX_CONCURRENT_STREAMS
_MAX_METADATA_BYTES = SettingId.MAX_METADATA_BYTES
_INITIAL_STREAM_WINDOW = SettingId.INITIAL_STREAM_WINDOW
_SEND_DATA = StreamInput.SEND_DATA
_SEND_END = StreamInput.SEND_END


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
    stream_credit_stalls: int = 0
    """Times one of our streams ran out of stream window with data queued."""
    stream_credit_wait_s: float = 0.0
    """Seconds our streams spent waiting for stream window, summed."""
    connection_window_wait_s: float = 0.0
    """Seconds DATA waited for the connection window."""
    connection_credit_sent: int = 0
    """Connection credit we granted the peer (octets of WINDOW_UPDATE on stream 0)."""
    stream_credit_sent: int = 0
    """Stream credit we granted the peer (octets of stream WINDOW_UPDATEs)."""
    stream_window_estimate: int = 0
    """The receive window a new stream starts with now (IMPLEMENTATION.md §N7.4)."""


class Session:
    """One end of a tunnel connection (PROTOCOL.md). ``client`` is the side that
    dialed: it allocates odd stream ids, the listener even ones (§6.3).

    Owns its parts (see the module docstring), ``peer_settings`` (filled by the
    peer's HELLO and SETTINGS), ``rtt`` (fed by PONGs, read by window tuning),
    the keepalive clock (when the peer was last heard, the next PING) and
    ``terminated``. ``_streams`` is the stream table's dict itself, not a copy:
    the commands look streams up in it on every call.

    Invariants: every stream open when the session ends is reported reset, in
    the same call as :class:`ConnectionTerminated`; once ``terminated``, no
    command changes a stream and no event follows: only what was queued to send
    (the GOAWAY) still comes out of :meth:`data_to_send`.
    """

    __slots__ = (
        "_budget",
        "_bytes_received",
        "_control",
        "_credit",
        "_inbound",
        "_last_measure_ping",
        "_last_received",
        "_next_ping_at",
        "_out",
        "_pings",
        "_reader",
        "_stream_credit_sent",
        "_streams",
        "_table",
        "client",
        "config",
        "peer_settings",
        "rtt",
        "terminated",
    )

    def __init__(
        self, config: SessionConfig, *, client: bool, now: float, learned_window_hint: int = 0
    ) -> None:
        self.config = config
        self.client = client
        self.peer_settings: dict[int, int] = dict(SETTING_DEFAULTS)
        self.rtt = RttEstimator()
        self.terminated = False
        self._out = Outbound(
            frames.encode_hello(MIN_VERSION, MAX_VERSION, config.announced_settings()),
            config.max_pending_control_frames,
        )
        self._credit = ReceiveCredit(config, self.rtt, self._out, now, learned_window_hint)
        self._table = StreamTable(client=client, out=self._out, credit=self._credit)
        self._streams = self._table.streams
        self._pings = Pings(self._out, self.rtt)
        self._budget = ErrorBudget(config.error_budget, config.error_budget_refill_per_s, now)
        self._control = ControlMessages(self._out, self._budget, config.max_frame_bytes, now)
        self._inbound = Inbound(
            config,
            client=client,
            peer_settings=self.peer_settings,
            table=self._table,
            out=self._out,
            credit=self._credit,
            pings=self._pings,
            budget=self._budget,
            control=self._control,
        )
        self._reader = FrameReader(max(config.max_frame_bytes, 4 + config.max_metadata_bytes))
        self._bytes_received = 0
        self._last_received = now
        self._next_ping_at = now + config.ping_interval_s
        self._last_measure_ping = now
        self._stream_credit_sent = 0

    # ------------------------------------------------------------------ receive

    def receive_data(self, data: bytes, now: float) -> list[Event]:
        """Feed bytes from the peer; returns the events they caused."""
        if self.terminated:
            return []
        events: list[Event] = []
        self._last_received = now
        self._bytes_received += len(data)
        inbound = self._inbound
        error: ProtocolError | None = None
        try:
            inbound.dispatch(self._reader.feed(data), now, events)
        except ProtocolError as exc:
            error = exc
            # Whole frames before a framing fault in the same read are processed
            # first: the first error in byte order wins however the bytes were
            # split (§2.3).
            earlier: list[RawFrame] = getattr(exc, "frames_before", [])
            if earlier:
                try:
                    inbound.dispatch(earlier, now, events)
                except ProtocolError as first:
                    error = first
        closed = inbound.closed_by_peer
        if closed is not None:  # the peer's GOAWAY error came first (§6.6)
            self._terminate(closed[0], closed[1], events, remote=True, send_goaway=False)
        elif error is not None:
            self._terminate(error.code, _public_reason(error.code), events)
        return events

    # ----------------------------------------------------------------- commands

    def open_stream(self, metadata: StreamMetadata | bytes, *, end_stream: bool = False) -> int:
        """Open a stream; DATA may follow at once (0-RTT, PROTOCOL.md §6.1)."""
        if self.terminated or self._out.goaway_sent or self._inbound.goaway_received:
            raise SessionClosedError("session is closing")
        if not self._inbound.established:
            raise SessionClosedError("session not established yet")
        peer_settings = self.peer_settings
        table = self._table
        if table.local_open >= peer_settings[_MAX_CONCURRENT_STREAMS]:
            raise StreamLimitError("peer's MAX_CONCURRENT_STREAMS reached")
        if table.next_local_id > MAX_STREAM_ID:
            self.go_away(ErrorCode.NO_ERROR, "stream ids exhausted")
            raise SessionClosedError("stream ids exhausted")
        encoded = metadata if isinstance(metadata, bytes) else metadata.encode()
        if len(encoded) > peer_settings[_MAX_METADATA_BYTES]:
            raise MetadataError("metadata larger than the peer's MAX_METADATA_BYTES")
        window = self._credit.stream_window_estimate()
        config = self.config
        stream = table.open_local(
            peer_settings[_INITIAL_STREAM_WINDOW],
            ReceiveWindow(
                window,
                config.max_stream_window_bytes,
                self._last_received,
                config.min_stream_window_bytes,
            ),
        )
        stream_id = stream.stream_id
        self._out.control.append(frames.encode_open(stream_id, window, encoded, end_stream))
        if end_stream:
            stream.transition(_SEND_END)
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
            if not stream.transition(_SEND_DATA):
                raise StreamClosedError(f"stream {stream_id} already ended locally")
            stream.queue_data(data)
        if end_stream and not stream.transition(_SEND_END):
            raise StreamClosedError(f"stream {stream_id} already ended locally")
        if stream.send_window > 0 or (end_stream and not stream.send_buffered):
            self._out.scheduler.push(stream_id)
        elif stream.stall_since is None and stream.send_buffered:  # only data waits: a stall
            self._out.mark_stalled(stream, self._last_received)

    def end_stream(self, stream_id: int) -> None:
        """Half-close our side once the queued data is sent."""
        self.send_data(stream_id, b"", end_stream=True)

    def reset_stream(self, stream_id: int, error_code: int = ErrorCode.CANCEL) -> None:
        """Abort a stream both ways; queued data is dropped. Resetting a stream
        that is already gone is a no-op (it may have closed meanwhile)."""
        stream = self._streams.get(stream_id)
        if stream is None or self.terminated:
            return
        self._table.forget(stream, self._last_received)
        self._out.control.append(frames.encode_reset(stream_id, error_code))

    def acknowledge_received_data(self, stream_id: int, n: int, now: float) -> None:
        """The application consumed ``n`` octets of ``stream_id``: return the
        credit (PROTOCOL.md §7.3), possibly growing the windows."""
        stream = self._streams.get(stream_id)
        if stream is None or self.terminated:
            return  # a forgotten stream's credit went back when it closed
        window = stream.recv_window
        # Never more than was received (.unconsumed, without its call): an
        # over-ack would grant the peer credit for memory we do not have (§7.3).
        n = min(n, window.received - window.consumed)
        if n <= 0:
            return
        credit = self._credit
        credit.return_credit(n, now)
        increment = window.consume(n, now, self.rtt)
        if increment and not stream.peer_ended:
            self._stream_credit_sent += increment
            self._out.control.append(frames.encode_window_update(stream_id, increment))
            if now - self._last_measure_ping >= _MEASURE_PING_INTERVAL_S:
                self._last_measure_ping = now  # keep the delay signal fresh (window.py)
                self._pings.send(now)
            if window.size > credit.learned_window:
                credit.learn(window.size)

    def stream_window_estimate(self) -> int:
        """The receive window a new stream starts with (IMPLEMENTATION.md §N7.4); see
        :meth:`ReceiveCredit.stream_window_estimate`."""
        return self._credit.stream_window_estimate()

    def ping(self, now: float) -> None:
        """Send a PING; its PONG yields :class:`PingAcknowledged` with the RTT."""
        if not self.terminated:
            self._pings.send(now)

    def go_away(self, error_code: int = ErrorCode.NO_ERROR, reason: str = "") -> None:
        """Refuse new streams from the peer; streams up to the last one we saw
        may finish (PROTOCOL.md §6.6). Idempotent."""
        if not self.terminated:
            self._out.go_away(self._inbound.last_peer_id, error_code, reason)

    def send_control(self, kind: int, body: bytes) -> int:
        """Queue a CONTROL message (PROTOCOL.md §5.14); its message id, which
        the peer's ACK names (:class:`ControlAcknowledged`). Allowed from the
        peer's HELLO until the session ends, GOAWAY or not. A body above the
        peer's MAX_FRAME_BYTES (less 6) raises :class:`ControlError`."""
        if self.terminated:
            raise SessionClosedError("session is over")
        if not self._inbound.established:
            raise SessionClosedError("session not established yet")
        return self._control.send(kind, body)

    def acknowledge_control(self, message_id: int, status: ControlStatus, reason: str = "") -> None:
        """Answer the peer's CONTROL message ``message_id`` (a
        :class:`ControlReceived`), exactly once; ``reason`` is cut to 256
        octets. After the session ended, a no-op."""
        if not self.terminated:
            self._control.acknowledge(message_id, status, reason)

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
        if self.terminated or not self._inbound.established:
            return self._out.take_control()
        return self._out.take(
            max_data_bytes, self._streams, self._table.forget, self._last_received
        )

    def send_buffered(self, stream_id: int) -> int:
        """Octets the application queued on ``stream_id`` not yet sent."""
        stream = self._streams.get(stream_id)
        return stream.send_buffered if stream is not None else 0

    @property
    def wants_to_send(self) -> bool:
        out = self._out
        return bool(out.control) or (bool(out.scheduler) and out.window > 0)

    # -------------------------------------------------------------------- timers

    def next_deadline(self) -> float:
        """When :meth:`handle_timer` next has work: the next keepalive PING or
        the moment the peer would be declared dead, whichever is first."""
        return min(self._next_ping_at, self._last_received + self.config.ping_timeout_s)

    def handle_timer(self, now: float) -> list[Event]:
        events: list[Event] = []
        if self.terminated:
            return events
        config = self.config
        if now - self._last_received >= config.ping_timeout_s:
            self._terminate(ErrorCode.TIMEOUT, "ping timeout", events, send_goaway=True)
            return events
        if now >= self._next_ping_at:
            if self._inbound.established:
                self._pings.send(now)
            self._next_ping_at = now + config.ping_interval_s
            try:
                for stream_id in self._out.expired_stalls(now, config.stall_timeout_s):
                    self._table.reset(stream_id, ErrorCode.STALLED, events, now, remote=False)
                    self._budget.spend(Cost.STALLED_STREAM, now)
            except ProtocolError as exc:
                self._terminate(exc.code, _public_reason(exc.code), events)
        return events

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
        if send_goaway:
            self._out.go_away(self._inbound.last_peer_id, code, reason)
        for stream_id in self._streams:
            events.append(StreamReset(stream_id, code, remote=remote))
        self._table.clear()
        self.terminated = True
        events.append(ConnectionTerminated(code, reason, remote=remote))

    # --------------------------------------------------------------- inspection

    @property
    def established(self) -> bool:
        """The peer's HELLO has arrived (PROTOCOL.md §3)."""
        return self._inbound.established

    @property
    def version(self) -> int | None:
        """The protocol version agreed in the HELLO exchange, once established."""
        return self._inbound.version

    @property
    def closing(self) -> bool:
        return self._out.goaway_sent or self._inbound.goaway_received or self.terminated

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def can_open_stream(self) -> bool:
        return (
            self._inbound.established
            and not self.closing
            and self._table.local_open < self.peer_settings[_MAX_CONCURRENT_STREAMS]
        )

    @property
    def learned_stream_window(self) -> int:
        return self._credit.learned_window

    def statistics(self) -> SessionStatistics:
        table = self._table
        out = self._out
        return SessionStatistics(
            streams_open=len(self._streams),
            streams_opened_total=table.opened_total,
            bytes_sent=out.bytes_sent,
            bytes_received=self._bytes_received,
            srtt_s=self.rtt.smoothed,
            min_rtt_s=self.rtt.min,
            learned_stream_window=self._credit.learned_window,
            connection_send_window=out.window,
            connection_receive_unconsumed=self._credit.window.unconsumed,
            send_buffered=sum(s.send_buffered for s in self._streams.values()),
            pending_control_frames=len(out.control),
            error_budget_left=self._budget.tokens,
            established=self._inbound.established,
            closing=self.closing,
            stream_credit_stalls=out.stalls,
            stream_credit_wait_s=out.stalled_s,
            connection_window_wait_s=out.window_blocked_s,
            connection_credit_sent=self._credit.credit_sent,
            stream_credit_sent=self._stream_credit_sent,
            stream_window_estimate=self._credit.stream_window_estimate(),
        )


def _public_reason(code: int) -> str:
    """The fixed text sent in GOAWAY: never the exception's own message."""
    return ErrorCode.name_of(code).lower().replace("_", " ")


__all__ = ["MuxError", "Session", "SessionStatistics"]
