"""The receive side of a :class:`~tunnel.mux.session.Session`: one handler per
frame type (PROTOCOL.md §5), and what the peer has told us.

The session owns an :class:`Inbound` and feeds it the frames its reader cut.
The handlers act on the session's other parts through their methods: streams
open and leave through the :class:`~tunnel.mux.stream_table.StreamTable`, the
peer's credit and our replies go to :class:`~tunnel.mux.outbound.Outbound`, the
credit we grant is kept by :class:`~tunnel.mux.receive_credit.ReceiveCredit`;
what happened is reported as events. Ending the connection is the session's:
a handler raises :class:`ProtocolError`, or records the peer's GOAWAY error.
"""

from __future__ import annotations

from collections.abc import Callable

from tunnel.mux import frames
from tunnel.mux.budget import Cost, ErrorBudget
from tunnel.mux.constants import (
    MAX_GOAWAY_REASON_BYTES,
    MAX_VERSION,
    MAX_WINDOW,
    MIN_VERSION,
    SETTING,
    SETTING_DEFAULTS,
    U32,
    U32_PAIR,
    ErrorCode,
    Flag,
    FrameType,
    SettingId,
)
from tunnel.mux.control import ControlMessages
from tunnel.mux.errors import (
    FlowControlError,
    FrameSizeError,
    MetadataError,
    ProtocolError,
    StreamError,
    VersionMismatchError,
)
from tunnel.mux.events import (
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
from tunnel.mux.outbound import Outbound
from tunnel.mux.pings import Pings
from tunnel.mux.reader import RawFrame
from tunnel.mux.receive_credit import ReceiveCredit
from tunnel.mux.settings import SessionConfig
from tunnel.mux.stream import Stream, StreamInput
from tunnel.mux.stream_table import StreamTable
from tunnel.mux.window import ReceiveWindow

_END = int(Flag.END_STREAM)
_DATA = int(FrameType.DATA)
_RECV_END = StreamInput.RECV_END  # not read off the class per stream
_MAX_SETTINGS_PAYLOAD = 4 + 6 * 64


class Inbound:
    """Handles each frame the peer sends; owns what the peer has told us:
    ``established`` and ``version`` (its HELLO, §3), ``last_peer_id`` (the
    highest stream id it opened, §6.3), ``goaway_received`` and
    ``closed_by_peer`` (its GOAWAY, §6.6). Updates ``peer_settings``, the
    session's dict, in place.

    Invariants: no frame but HELLO is handled before ``established``; a
    :class:`StreamError` resets its stream here and costs error budget, siblings
    carry on; any other :class:`ProtocolError` leaves :meth:`dispatch` for the
    session to end the connection with. After a GOAWAY with an error code,
    ``closed_by_peer`` holds its code and reason and :meth:`dispatch` handles no
    further frame: the session terminates (§6.6).
    """

    __slots__ = (
        "_budget",
        "_client",
        "_config",
        "_control",
        "_credit",
        "_out",
        "_pings",
        "_table",
        "closed_by_peer",
        "established",
        "goaway_received",
        "last_peer_id",
        "peer_settings",
        "version",
    )

    def __init__(
        self,
        config: SessionConfig,
        *,
        client: bool,
        peer_settings: dict[int, int],
        table: StreamTable,
        out: Outbound,
        credit: ReceiveCredit,
        pings: Pings,
        budget: ErrorBudget,
        control: ControlMessages,
    ) -> None:
        self._config = config
        self._client = client
        self._table = table
        self._out = out
        self._credit = credit
        self._pings = pings
        self._budget = budget
        self._control = control
        self.peer_settings = peer_settings
        self.established = False
        self.version: int | None = None
        self.last_peer_id = 0
        self.goaway_received = False
        self.closed_by_peer: tuple[int, str] | None = None

    def dispatch(self, raw_frames: list[RawFrame], now: float, events: list[Event]) -> None:
        """Handle ``raw_frames`` in order, appending what they caused to ``events``."""
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
                self._budget.spend(Cost.STREAM_ERROR, now)
                self._table.reset(exc.stream_id, exc.code, events, now, remote=False)
            if self.closed_by_peer is not None:
                return

    def _on_data(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        n = len(payload)
        if n > self._config.max_frame_bytes:
            # The reader admits 4 + MAX_METADATA_BYTES for OPEN, which may be more
            # than MAX_FRAME_BYTES; DATA is held to MAX_FRAME_BYTES (§4).
            raise FrameSizeError(f"DATA of {n} octets above MAX_FRAME_BYTES")
        if not n and not flags & _END:
            # Charged whatever the stream: a flood on a closed stream costs too (§8.1).
            self._budget.spend(Cost.EMPTY_DATA, now)
        credit = self._credit
        credit.window.receive(n)  # connection scope first, whatever the stream (§7.2)
        stream = self._table.streams.get(stream_id)
        if stream is None:
            self._check_not_idle(stream_id, "DATA")
            credit.return_credit(n, now)  # closed stream: credit goes back
            return
        if stream.peer_ended:
            credit.return_credit(n, now)
            raise StreamError(stream_id, "DATA after END_STREAM", ErrorCode.STREAM_CLOSED)
        stream.recv_window.receive(n)
        if n:
            stream.received_any = True
            events.append(DataReceived(stream_id, payload))
        if flags & _END:
            self._peer_end(stream, now, events)

    def _peer_end(self, stream: Stream, now: float, events: list[Event]) -> None:
        stream.transition(_RECV_END)
        events.append(StreamEnded(stream.stream_id))
        if stream.finished:
            self._table.forget(stream, now)

    def _on_hello(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        if self.established:
            raise ProtocolError("second HELLO")
        _check_connection_frame(stream_id, "HELLO")
        if len(payload) < 4 or (len(payload) - 4) % SETTING.size:
            raise FrameSizeError("malformed HELLO")
        if len(payload) > _MAX_SETTINGS_PAYLOAD:
            raise FrameSizeError("HELLO too long")
        peer_min, peer_max = frames.decode_versions(payload)
        version = min(MAX_VERSION, peer_max)
        if version < max(MIN_VERSION, peer_min):
            raise VersionMismatchError(f"no common version: peer speaks {peer_min}..{peer_max}")
        settings = frames.decode_settings(payload[4:])
        self._validate_peer_settings(settings)
        peer_settings = self.peer_settings
        peer_settings.update(settings)
        self._out.set_peer_limits(
            peer_settings[SettingId.INITIAL_CONNECTION_WINDOW],
            peer_settings[SettingId.MAX_FRAME_BYTES],
        )
        self.version = version
        self.established = True
        self._pings.send(now)  # learn the RTT before the first stream needs it
        events.append(SessionEstablished(version, dict(self.peer_settings)))

    @staticmethod
    def _validate_peer_settings(settings: dict[int, int]) -> None:
        frame = settings.get(SettingId.MAX_FRAME_BYTES)
        if frame is not None and not 1024 <= frame <= 16 * 1024 * 1024:
            raise ProtocolError("MAX_FRAME_BYTES out of range")
        for key in (SettingId.INITIAL_STREAM_WINDOW, SettingId.INITIAL_CONNECTION_WINDOW):
            value = settings.get(key)
            if value is not None and not 0 < value <= MAX_WINDOW:
                raise FlowControlError(f"{key.name} out of range")

    def _on_settings(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        _check_connection_frame(stream_id, "SETTINGS")
        if len(payload) % SETTING.size or len(payload) > _MAX_SETTINGS_PAYLOAD:
            raise FrameSizeError("malformed SETTINGS")
        self._budget.spend(Cost.SETTINGS, now)
        settings = frames.decode_settings(payload)
        self._validate_peer_settings(settings)
        for key, value in settings.items():
            if key == SettingId.INITIAL_STREAM_WINDOW:
                if value < self.peer_settings[key]:
                    raise ProtocolError("INITIAL_STREAM_WINDOW may only grow (§5.2)")
            elif key == SettingId.MAX_CONCURRENT_STREAMS:
                pass
            elif key in SETTING_DEFAULTS and value != self.peer_settings[key]:
                raise ProtocolError(f"setting {key:#x} cannot change after HELLO")
        self.peer_settings.update(settings)

    def _on_open(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        if stream_id == 0 or (stream_id % 2 == 1) != (not self._client):
            raise ProtocolError(f"OPEN with id {stream_id} of the wrong parity")
        if stream_id <= self.last_peer_id:
            raise ProtocolError(f"OPEN reuses or lowers stream id {stream_id}")
        if len(payload) < 4:
            raise FrameSizeError("OPEN shorter than its window field")
        self.last_peer_id = stream_id
        config = self._config
        table = self._table
        if self._out.goaway_sent or table.peer_open >= config.max_concurrent_streams:
            self._budget.spend(Cost.REFUSED_STREAM, now)
            # Through the bounded queue, like every reply the peer provokes (§8.2).
            self._out.queue_control(frames.encode_reset(stream_id, ErrorCode.REFUSED_STREAM))
            return
        (initial_window,) = U32.unpack_from(payload, 0)
        if initial_window > MAX_WINDOW:
            raise FlowControlError("OPEN window above 2^31-1")
        try:
            if len(payload) - 4 > config.max_metadata_bytes:
                # What we announce as MAX_METADATA_BYTES we enforce (§4, §6.2).
                raise MetadataError("metadata above our MAX_METADATA_BYTES")
            metadata = StreamMetadata.decode(memoryview(payload)[4:])
        except MetadataError:
            self._budget.spend(Cost.STREAM_ERROR, now)
            self._out.queue_control(frames.encode_reset(stream_id, ErrorCode.METADATA_ERROR))
            return
        stream = table.accept(
            stream_id,
            initial_window,
            ReceiveWindow(
                self._credit.announced_stream_window,
                config.max_stream_window_bytes,
                now,
                config.min_stream_window_bytes,
            ),
        )
        events.append(StreamOpened(stream_id, metadata))
        if flags & _END:
            self._peer_end(stream, now, events)

    def _on_window_update(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        if len(payload) != 4:
            raise FrameSizeError("WINDOW_UPDATE must carry 4 octets")
        (increment,) = U32.unpack_from(payload, 0)
        if stream_id == 0:
            self._out.credit_connection(increment, now)
            return
        stream = self._table.streams.get(stream_id)
        if stream is None:
            self._check_not_idle(stream_id, "WINDOW_UPDATE")
            return
        if increment == 0:
            raise StreamError(stream_id, "WINDOW_UPDATE of 0")
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            raise StreamError(stream_id, "stream window above 2^31-1", ErrorCode.FLOW_CONTROL_ERROR)
        if stream.stall_since is not None:
            self._out.unstall(stream, now)
        if stream.send_buffered or (stream.end_queued and not stream.end_sent):
            self._out.scheduler.push(stream_id)

    def _on_reset(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        if len(payload) != 4:
            raise FrameSizeError("RESET must carry 4 octets")
        if stream_id == 0:
            raise ProtocolError("RESET on stream 0")
        stream = self._table.streams.get(stream_id)
        if stream is None:
            self._check_not_idle(stream_id, "RESET")
            return
        if not stream.local and not stream.received_any:
            self._budget.spend(Cost.RESET_BEFORE_DATA, now)  # rapid-reset pattern (§8)
        (code,) = U32.unpack_from(payload, 0)
        self._table.forget(stream, now)
        events.append(StreamReset(stream_id, code, remote=True))

    def _on_ping(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        _check_connection_frame(stream_id, "PING")
        if len(payload) != 8:
            raise FrameSizeError("malformed PING")
        self._budget.spend(Cost.PING, now)
        self._out.queue_control(frames.encode_pong(payload))

    def _on_pong(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        _check_connection_frame(stream_id, "PONG")
        if len(payload) != 8:
            raise FrameSizeError("malformed PONG")
        rtt = self._pings.acknowledge(payload, now)
        self._credit.announce_stream_window()
        events.append(PingAcknowledged(rtt))

    def _on_goaway(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        _check_connection_frame(stream_id, "GOAWAY")
        if len(payload) < 8 or len(payload) > 8 + MAX_GOAWAY_REASON_BYTES:
            raise FrameSizeError("malformed GOAWAY")
        last_stream_id, code = U32_PAIR.unpack_from(payload, 0)
        reason = payload[8:].decode("utf-8", "replace")
        self.goaway_received = True
        events.append(GoAwayReceived(last_stream_id, code, reason))
        table = self._table
        for stream in list(table.streams.values()):
            if stream.local and stream.stream_id > last_stream_id:
                table.forget(stream, now)
                events.append(StreamReset(stream.stream_id, ErrorCode.REFUSED_STREAM, remote=True))
        if code != ErrorCode.NO_ERROR:
            # The unprocessed streams were refused first (above): REFUSED_STREAM,
            # safe to retry, even when the peer closes with an error (§6.6); the
            # session resets the rest with its code.
            self.closed_by_peer = (code, reason)

    def _on_control(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        self._control.receive(stream_id, payload, now, events)

    def _check_not_idle(self, stream_id: int, what: str) -> None:
        """A frame for an unknown stream is fine if the stream existed (it closed
        while the frame was in flight); for a never-opened one it is an error."""
        if stream_id == 0:
            raise ProtocolError(f"{what} on stream 0")
        local = (stream_id % 2 == 1) == self._client
        highest = self._table.next_local_id - 2 if local else self.last_peer_id
        if stream_id > highest:
            raise ProtocolError(f"{what} on idle stream {stream_id}")


def _check_connection_frame(stream_id: int, what: str) -> None:
    # A connection-scope frame on a stream breaks the framing rules (§5): a
    # PROTOCOL_ERROR, not a size problem.
    if stream_id != 0:
        raise ProtocolError(f"{what} on stream {stream_id}")


#: Control frame handlers by type, as plain functions of :class:`Inbound`. Not
#: bound methods kept on each instance: those would make every session a
#: reference cycle, left behind by each closed tunnel connection until a full
#: collection.
_Handler = Callable[[Inbound, int, int, bytes, float, list[Event]], None]
_HANDLERS: dict[int, _Handler] = {
    FrameType.HELLO: Inbound._on_hello,
    FrameType.SETTINGS: Inbound._on_settings,
    FrameType.OPEN: Inbound._on_open,
    FrameType.WINDOW_UPDATE: Inbound._on_window_update,
    FrameType.RESET: Inbound._on_reset,
    FrameType.PING: Inbound._on_ping,
    FrameType.PONG: Inbound._on_pong,
    FrameType.GOAWAY: Inbound._on_goaway,
    FrameType.CONTROL: Inbound._on_control,
}
