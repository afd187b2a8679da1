"""The receive side of a :class:`~tunnel.mux.session.Session`: one handler per
frame type (PROTOCOL.md §5), split from the session so that each module owns
one thing (the session: commands, output, timers; this: what the peer sent).

A mixin, because the handlers change the session's state directly: the
attributes they use are declared below for the reader and the type checker,
and initialised by ``Session.__init__``.
"""

from __future__ import annotations

from tunnel.mux import frames
from tunnel.mux.budget import Cost
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
    SettingId,
)
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
from tunnel.mux.scheduler import RoundRobin
from tunnel.mux.settings import SessionConfig
from tunnel.mux.stream import Stream, StreamInput
from tunnel.mux.window import ReceiveWindow, RttEstimator

_END = int(Flag.END_STREAM)
_MAX_SETTINGS_PAYLOAD = 4 + 6 * 64


class InboundFrames:
    """Frame handlers; each takes ``(stream_id, flags, payload, now, events)``."""

    config: SessionConfig
    client: bool
    established: bool
    version: int | None
    peer_settings: dict[int, int]
    rtt: RttEstimator
    _streams: dict[int, Stream]
    _control: list[bytes | memoryview]
    _scheduler: RoundRobin
    _stalled: dict[int, float]
    _pings: dict[bytes, float]
    _recv_window: ReceiveWindow
    _send_window: int
    _peer_max_frame: int
    _announced_stream_window: int
    _next_stream_id: int
    _last_peer_stream_id: int
    _peer_open: int
    _opened_total: int
    _goaway_sent: bool
    _goaway_received: bool

    # Provided by Session.
    def _charge(self, cost: float, now: float) -> None: ...
    def _queue_control(self, frame: bytes) -> None: ...
    def _forget(self, stream: Stream) -> None: ...
    def _send_ping(self, now: float) -> None: ...
    def _return_connection_credit(self, n: int, now: float) -> None: ...
    def _announce_stream_window(self) -> None: ...
    def _terminate(
        self,
        code: int,
        reason: str,
        events: list[Event],
        *,
        remote: bool = False,
        send_goaway: bool = True,
    ) -> None: ...

    def _on_data(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        n = len(payload)
        if n > self.config.max_frame_bytes:
            # The reader admits 4 + MAX_METADATA_BYTES for OPEN, which may be more
            # than MAX_FRAME_BYTES; DATA is held to MAX_FRAME_BYTES (§4).
            raise FrameSizeError(f"DATA of {n} octets above MAX_FRAME_BYTES")
        if not n and not flags & _END:
            # Charged whatever the stream: a flood on a closed stream costs too (§8.1).
            self._charge(Cost.EMPTY_DATA, now)
        self._recv_window.receive(n)  # connection scope first, whatever the stream (§7.2)
        stream = self._streams.get(stream_id)
        if stream is None:
            self._check_not_idle(stream_id, "DATA")
            self._return_connection_credit(n, now)  # closed stream: credit goes back
            return
        if stream.peer_ended:
            self._return_connection_credit(n, now)
            raise StreamError(stream_id, "DATA after END_STREAM", ErrorCode.STREAM_CLOSED)
        stream.recv_window.receive(n)
        if n:
            stream.received_any = True
            events.append(DataReceived(stream_id, payload))
        if flags & _END:
            self._peer_end(stream, events)

    def _peer_end(self, stream: Stream, events: list[Event]) -> None:
        stream.transition(StreamInput.RECV_END)
        events.append(StreamEnded(stream.stream_id))
        if stream.finished:
            self._forget(stream)

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
        self.peer_settings.update(settings)
        self._peer_max_frame = self.peer_settings[SettingId.MAX_FRAME_BYTES]
        self._send_window = self.peer_settings[SettingId.INITIAL_CONNECTION_WINDOW]
        self.version = version
        self.established = True
        self._send_ping(now)  # learn the RTT before the first stream needs it
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
        self._charge(Cost.SETTINGS, now)
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
        if stream_id == 0 or (stream_id % 2 == 1) != (not self.client):
            raise ProtocolError(f"OPEN with id {stream_id} of the wrong parity")
        if stream_id <= self._last_peer_stream_id:
            raise ProtocolError(f"OPEN reuses or lowers stream id {stream_id}")
        if len(payload) < 4:
            raise FrameSizeError("OPEN shorter than its window field")
        self._last_peer_stream_id = stream_id
        if self._goaway_sent or self._peer_open >= self.config.max_concurrent_streams:
            self._charge(Cost.REFUSED_STREAM, now)
            # Through the bounded queue, like every reply the peer provokes (§8.2).
            self._queue_control(frames.encode_reset(stream_id, ErrorCode.REFUSED_STREAM))
            return
        (initial_window,) = U32.unpack_from(payload, 0)
        if initial_window > MAX_WINDOW:
            raise FlowControlError("OPEN window above 2^31-1")
        try:
            if len(payload) - 4 > self.config.max_metadata_bytes:
                # What we announce as MAX_METADATA_BYTES we enforce (§4, §6.2).
                raise MetadataError("metadata above our MAX_METADATA_BYTES")
            metadata = StreamMetadata.decode(memoryview(payload)[4:])
        except MetadataError:
            self._charge(Cost.STREAM_ERROR, now)
            self._queue_control(frames.encode_reset(stream_id, ErrorCode.METADATA_ERROR))
            return
        stream = Stream(
            stream_id,
            local=False,
            send_window=initial_window,
            recv_window=ReceiveWindow(
                self._announced_stream_window,
                self.config.max_stream_window_bytes,
                now,
                self.config.min_stream_window_bytes,
            ),
        )
        self._streams[stream_id] = stream
        self._peer_open += 1
        self._opened_total += 1
        events.append(StreamOpened(stream_id, metadata))
        if flags & _END:
            self._peer_end(stream, events)

    def _on_window_update(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        if len(payload) != 4:
            raise FrameSizeError("WINDOW_UPDATE must carry 4 octets")
        (increment,) = U32.unpack_from(payload, 0)
        if stream_id == 0:
            if increment == 0:
                raise ProtocolError("WINDOW_UPDATE of 0 on the connection")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise FlowControlError("connection window above 2^31-1")
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            self._check_not_idle(stream_id, "WINDOW_UPDATE")
            return
        if increment == 0:
            raise StreamError(stream_id, "WINDOW_UPDATE of 0")
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            raise StreamError(stream_id, "stream window above 2^31-1", ErrorCode.FLOW_CONTROL_ERROR)
        if stream.stall_since is not None:
            stream.stall_since = None
            self._stalled.pop(stream_id, None)
        if stream.send_buffered or (stream.end_queued and not stream.end_sent):
            self._scheduler.push(stream_id)

    def _on_reset(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        if len(payload) != 4:
            raise FrameSizeError("RESET must carry 4 octets")
        if stream_id == 0:
            raise ProtocolError("RESET on stream 0")
        stream = self._streams.get(stream_id)
        if stream is None:
            self._check_not_idle(stream_id, "RESET")
            return
        if not stream.local and not stream.received_any:
            self._charge(Cost.RESET_BEFORE_DATA, now)  # rapid-reset pattern (§8)
        (code,) = U32.unpack_from(payload, 0)
        self._forget(stream)
        events.append(StreamReset(stream_id, code, remote=True))

    def _on_ping(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        _check_connection_frame(stream_id, "PING")
        if len(payload) != 8:
            raise FrameSizeError("malformed PING")
        self._charge(Cost.PING, now)
        self._queue_control(frames.encode_pong(payload))

    def _on_pong(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        _check_connection_frame(stream_id, "PONG")
        if len(payload) != 8:
            raise FrameSizeError("malformed PONG")
        sent_at = self._pings.pop(payload, None)
        if sent_at is None:
            raise ProtocolError("PONG for a PING we did not send")
        self.rtt.add_sample(now - sent_at)
        self._announce_stream_window()
        events.append(PingAcknowledged(now - sent_at))

    def _on_goaway(
        self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]
    ) -> None:
        _check_connection_frame(stream_id, "GOAWAY")
        if len(payload) < 8 or len(payload) > 8 + MAX_GOAWAY_REASON_BYTES:
            raise FrameSizeError("malformed GOAWAY")
        last_stream_id, code = U32_PAIR.unpack_from(payload, 0)
        reason = payload[8:].decode("utf-8", "replace")
        self._goaway_received = True
        events.append(GoAwayReceived(last_stream_id, code, reason))
        for stream in list(self._streams.values()):
            if stream.local and stream.stream_id > last_stream_id:
                self._forget(stream)
                events.append(StreamReset(stream.stream_id, ErrorCode.REFUSED_STREAM, remote=True))
        if code != ErrorCode.NO_ERROR:
            # The unprocessed streams were refused first (above): REFUSED_STREAM,
            # safe to retry, even when the peer closes with an error (§6.6); the
            # rest are reset with its code.
            self._terminate(code, reason, events, remote=True, send_goaway=False)

    def _check_not_idle(self, stream_id: int, what: str) -> None:
        """A frame for an unknown stream is fine if the stream existed (it closed
        while the frame was in flight); for a never-opened one it is an error."""
        if stream_id == 0:
            raise ProtocolError(f"{what} on stream 0")
        local = (stream_id % 2 == 1) == self.client
        highest = self._next_stream_id - 2 if local else self._last_peer_stream_id
        if stream_id > highest:
            raise ProtocolError(f"{what} on idle stream {stream_id}")


def _check_connection_frame(stream_id: int, what: str) -> None:
    # A connection-scope frame on a stream breaks the framing rules (§5): a
    # PROTOCOL_ERROR, not a size problem.
    if stream_id != 0:
        raise ProtocolError(f"{what} on stream {stream_id}")
