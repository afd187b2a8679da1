"""An in-memory pair of sessions wired back to back, with a manual clock.

The first layer of STYLE.md §12: the whole protocol runs without sockets, and
the test decides how bytes are split on the way (``chunk`` octets at a time).

Also here, for tests of what a *misbehaving* peer may send: :class:`RawPeer`
drives one real :class:`Session` with hand-made frames, built by
:func:`raw_frame` and read back by :func:`parse_frames`. Both follow
PROTOCOL.md §2 independently of ``tunnel.mux.frames`` and ``tunnel.mux.reader``,
so an encoder bug cannot hide behind a decoder with the same bug.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from tunnel.mux import (
    ConnectionTerminated,
    DataReceived,
    Event,
    Session,
    SessionConfig,
    StreamEnded,
    StreamOpened,
    StreamReset,
)

PREFACE = b"GEOEDGE\n"

RawFrame = tuple[int, int, int, bytes]  # type, flags, stream id, payload


def raw_frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame, byte by byte as PROTOCOL.md §2 draws it."""
    return (
        bytes((frame_type, flags))
        + stream_id.to_bytes(4, "big")
        + len(payload).to_bytes(4, "big")
        + payload
    )


def raw_settings_payload(settings: dict[int, int]) -> bytes:
    return b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in settings.items())


def raw_hello(
    min_version: int = 1, max_version: int = 1, settings: dict[int, int] | None = None
) -> bytes:
    """The preface and a HELLO frame (PROTOCOL.md §3)."""
    payload = (
        min_version.to_bytes(2, "big")
        + max_version.to_bytes(2, "big")
        + raw_settings_payload(settings or {})
    )
    return PREFACE + raw_frame(0x0, 0, 0, payload)


def parse_frames(data: bytes, *, preface: bool = False) -> list[RawFrame]:
    """Split what a session wrote into frames; fails on a truncated frame."""
    pos = 0
    if preface:
        assert data[:8] == PREFACE, f"no preface: {data[:8]!r}"
        pos = 8
    frames: list[RawFrame] = []
    while pos < len(data):
        assert len(data) - pos >= 10, "truncated frame header"
        length = int.from_bytes(data[pos + 6 : pos + 10], "big")
        payload = data[pos + 10 : pos + 10 + length]
        assert len(payload) == length, "truncated frame payload"
        stream_id = int.from_bytes(data[pos + 2 : pos + 6], "big")
        frames.append((data[pos], data[pos + 1], stream_id, payload))
        pos += 10 + length
    return frames


@dataclass
class Side:
    session: Session
    events: list[Event] = field(default_factory=list)
    received: dict[int, bytearray] = field(default_factory=lambda: defaultdict(bytearray))
    ended: set[int] = field(default_factory=set)
    opened: dict[int, object] = field(default_factory=dict)
    resets: dict[int, int] = field(default_factory=dict)
    auto_ack: bool = True
    end_count: Counter[int] = field(default_factory=Counter)
    """StreamEnded events per stream: the protocol promises exactly one."""
    sent: bytearray = field(default_factory=bytearray)
    """Every octet this side's session wrote, in order (the pair's transcript)."""

    def take(self, events: list[Event], now: float) -> None:
        for event in events:
            self.events.append(event)
            if isinstance(event, DataReceived):
                self.received[event.stream_id] += event.data
                if self.auto_ack:
                    self.session.acknowledge_received_data(event.stream_id, len(event.data), now)
            elif isinstance(event, StreamEnded):
                self.ended.add(event.stream_id)
                self.end_count[event.stream_id] += 1
            elif isinstance(event, StreamOpened):
                self.opened[event.stream_id] = event.metadata
            elif isinstance(event, StreamReset):
                self.resets[event.stream_id] = event.error_code

    @property
    def terminated(self) -> ConnectionTerminated | None:
        for event in self.events:
            if isinstance(event, ConnectionTerminated):
                return event
        return None

    def of_type(self, kind: type) -> list:
        return [event for event in self.events if isinstance(event, kind)]


def assert_windows_respected(session: Session) -> None:
    """No receive window of ``session`` holds more than it granted (PROTOCOL.md §7.2)."""
    window = session._credit.window
    assert window.received <= window.limit, "connection window exceeded"
    for stream_id, stream in session._streams.items():
        w = stream.recv_window
        assert w.received <= w.limit, f"stream {stream_id} window exceeded"
        assert stream.send_window >= 0, f"stream {stream_id} send window negative"
    assert session._out.window >= 0, "connection send window negative"


class SessionPair:
    def __init__(
        self,
        client_config: SessionConfig | None = None,
        server_config: SessionConfig | None = None,
        *,
        chunk: int | None = None,
        max_data_bytes: int = 256 * 1024,
    ) -> None:
        self.now = 1000.0
        self.chunk = chunk
        self.max_data_bytes = max_data_bytes
        self.client = Side(Session(client_config or SessionConfig(), client=True, now=self.now))
        self.server = Side(Session(server_config or SessionConfig(), client=False, now=self.now))
        self.wire_bytes = {"c2s": 0, "s2c": 0}

    def _deliver(self, src: Side, dst: Side, key: str) -> bool:
        out = src.session.data_to_send(self.max_data_bytes)
        data = b"".join(bytes(chunk) for chunk in out)
        if not data:
            return False
        src.sent += data
        self.wire_bytes[key] += len(data)
        step = self.chunk or len(data)
        for i in range(0, len(data), step):
            dst.take(dst.session.receive_data(data[i : i + step], self.now), self.now)
        return True

    def pump(self, max_rounds: int = 10000) -> None:
        """Move bytes both ways until nothing is left to send."""
        for _ in range(max_rounds):
            moved = self._deliver(self.client, self.server, "c2s")
            moved |= self._deliver(self.server, self.client, "s2c")
            if not moved:
                return
        raise AssertionError("pump did not settle")

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for side in (self.client, self.server):
            side.take(side.session.handle_timer(self.now), self.now)

    def establish(self) -> SessionPair:
        self.pump()
        assert self.client.session.established and self.server.session.established
        return self

    # -- a link with latency: deliver in rounds --------------------------------------

    def flight(self, src: Side, dst: Side, one_way_s: float, max_calls: int = 10000) -> int:
        """One flight over a link of ``one_way_s`` latency and unlimited rate:
        everything ``src`` can send now leaves, the clock moves ``one_way_s``,
        and it all arrives at ``dst``. Returns the octets moved."""
        key = "c2s" if src is self.client else "s2c"
        pieces: list[bytes] = []
        for _ in range(max_calls):
            out = src.session.data_to_send(self.max_data_bytes)
            if not out:
                break
            pieces.append(b"".join(bytes(chunk) for chunk in out))
        else:
            raise AssertionError("flight did not settle")
        self.advance(one_way_s)
        data = b"".join(pieces)
        src.sent += data
        self.wire_bytes[key] += len(data)
        step = self.chunk or max(len(data), 1)
        for i in range(0, len(data), step):
            dst.take(dst.session.receive_data(data[i : i + step], self.now), self.now)
        return len(data)

    def round_trip(self, one_way_s: float) -> int:
        """The client's flight, then the server's: one round trip of
        ``2 * one_way_s``. Returns the octets moved."""
        return self.flight(self.client, self.server, one_way_s) + self.flight(
            self.server, self.client, one_way_s
        )

    def establish_with_rtt(self, rtt_s: float, max_rounds: int = 10) -> SessionPair:
        """Establish over a link of ``rtt_s`` and wait until both sides measured it."""
        for _ in range(max_rounds):
            self.round_trip(rtt_s / 2)
            if self.client.session.rtt.min is not None and self.server.session.rtt.min is not None:
                return self
        raise AssertionError("no RTT sample on both sides")

    def check_windows(self) -> None:
        assert_windows_respected(self.client.session)
        assert_windows_respected(self.server.session)


class RawPeer:
    """A real :class:`Session` on one end, hand-made frames on the other."""

    def __init__(
        self,
        config: SessionConfig | None = None,
        *,
        session_is_client: bool = False,
        now: float = 1000.0,
        hello: bool = True,
        peer_settings: dict[int, int] | None = None,
    ) -> None:
        self.now = now
        self.session = Session(config or SessionConfig(), client=session_is_client, now=now)
        self.events: list[Event] = []
        self._preface_read = False
        if hello:
            self.feed(raw_hello(settings=peer_settings))
            assert self.session.established, self.events

    def feed(self, data: bytes, chunk: int | None = None) -> list[Event]:
        """Bytes from the hand-made peer; returns (and records) the events."""
        events: list[Event] = []
        step = chunk or max(len(data), 1)
        for i in range(0, len(data), step):
            events += self.session.receive_data(data[i : i + step], self.now)
        self.events += events
        return events

    def send(
        self, frame_type: int, flags: int, stream_id: int, payload: bytes = b""
    ) -> list[Event]:
        return self.feed(raw_frame(frame_type, flags, stream_id, payload))

    def read(self) -> list[RawFrame]:
        """The frames the session wants to send now."""
        data = b"".join(bytes(chunk) for chunk in self.session.data_to_send(2**30))
        frames = parse_frames(data, preface=not self._preface_read)
        self._preface_read = True
        return frames

    def advance(self, seconds: float) -> list[Event]:
        self.now += seconds
        events = self.session.handle_timer(self.now)
        self.events += events
        return events

    @property
    def terminated(self) -> ConnectionTerminated | None:
        for event in self.events:
            if isinstance(event, ConnectionTerminated):
                return event
        return None

    def of_type(self, kind: type) -> list:
        return [event for event in self.events if isinstance(event, kind)]
