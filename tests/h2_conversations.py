"""What an HTTP/2 client sends, for the tests that hold the edge's two HTTP/2
engines (edge.h2_engine) to each other: conversations written by the ``h2``
client library, mutated at the frame level, cut into reads; and what each
engine makes of them.

- :func:`conversations`: a hypothesis strategy of client byte streams: the
  preface and SETTINGS, then requests (GETs, POSTs with bodies and
  trailers, extended CONNECTs, malformed ones), DATA, resets, PINGs,
  SETTINGS, WINDOW_UPDATEs, PRIORITY frames, acknowledgements; then up to
  three mutations of the frames after the client's first SETTINGS (a frame
  dropped, repeated, moved, a byte changed, a raw frame added); then cut
  into reads anywhere;
- :func:`connection_transcript`: the events one engine's connection emits
  for those reads (as comparable tuples) and its connection error, if any.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack
import hyperframe.frame
from hypothesis import strategies as st

from edge.h2_engine import new_server_connection

__all__ = [
    "CONNECTION_WINDOW",
    "MAX_CONCURRENT_STREAMS",
    "MAX_HEADER_LIST_SIZE",
    "Transcript",
    "connection_transcript",
    "conversations",
    "split_frames",
]

#: Small, so that the refusals and the HPACK bomb bound are met often.
MAX_CONCURRENT_STREAMS = 3
MAX_HEADER_LIST_SIZE = 700
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 4 << 20
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

Fields = list[tuple[bytes, bytes]]

_GET = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"a.test"), (b":path", b"/")]
_POST = [(b":method", b"POST"), *_GET[1:], (b"content-length", b"5")]
_CONNECT = [
    (b":method", b"CONNECT"),
    (b":protocol", b"websocket"),
    *_GET[1:],
    (b"sec-websocket-version", b"13"),
]
_REQUESTS: list[Fields] = [
    _GET,
    _POST,
    _CONNECT,
    [*_GET, (b"cookie", b"a=1"), (b"cookie", b"b=2"), (b"user-agent", b"Mozilla/5.0 (X11)")],
    [*_GET, (b"x-big", b"v" * 300)],
    [*_GET, (b"x-big", b"w" * 700)],  # past the header list size: an HPACK bomb
    [*_GET, (b"X-Upper", b"1")],  # malformed, for the front end
    [(b":method", b"GET"), (b":path", b"/")],
    [(b":status", b"100"), *_GET],
    [(b"te", b"trailers"), *_GET],
]
_TRAILERS: list[Fields] = [[(b"x-sum", b"7")], [(b"x-sum", b"7"), (b"x-a", b"b" * 40)]]
_SETTINGS = [
    {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 3},
    {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535},
    {h2.settings.SettingCodes.HEADER_TABLE_SIZE: 0},
    {h2.settings.SettingCodes.MAX_FRAME_SIZE: 20000},
    {h2.settings.SettingCodes.ENABLE_PUSH: 0},
    {0x9: 1},  # SETTINGS_NO_RFC7540_PRIORITIES (RFC 9218), unknown to h2
    {0x77: 5},  # an unknown setting
]

# Frames a client library would not write, each for a stream chosen later.
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes((kind, flags))
        + struct.pack(">I", stream_id)
        + payload
    )


def _literal_block(fields: Fields) -> bytes:
    """A header block of literals without indexing (RFC 7541 §6.2.2): it
    leaves the HPACK table as it is, whichever stream it lands on."""
    out = bytearray()
    for name, value in fields:
        out.append(0x00)
        for octets in (name, value):
            out += hpack.hpack.encode_integer(len(octets), 7) + octets
    return bytes(out)


def _raw_frames(stream_id: int) -> list[bytes]:
    return [
        _frame(0x0, 0x0, stream_id, b"xyz"),  # DATA
        _frame(0x0, 0x1, stream_id, b""),  # empty DATA, END_STREAM
        _frame(0x0, 0x8, stream_id, b"\x02ab\x00\x00"),  # DATA, padded
        _frame(0x1, 0x5, stream_id, _literal_block(_GET)),  # HEADERS, END_STREAM
        _frame(0x1, 0x4, stream_id, _literal_block([(b"x-t", b"1")])),  # HEADERS, no END_STREAM
        _frame(0x1, 0x1, stream_id, _literal_block(_GET)),  # HEADERS without END_HEADERS
        _frame(0x9, 0x4, stream_id, _literal_block([(b"x-c", b"1")])),  # CONTINUATION
        _frame(0x3, 0x0, stream_id, struct.pack(">I", 8)),  # RST_STREAM(CANCEL)
        _frame(0x8, 0x0, stream_id, struct.pack(">I", 2**31 - 1)),  # WINDOW_UPDATE, overflow
        _frame(0x8, 0x0, stream_id, struct.pack(">I", 0)),  # WINDOW_UPDATE of 0
        _frame(0x2, 0x0, stream_id, struct.pack(">IB", stream_id, 15)),  # depends on itself
        _frame(0x2, 0x0, stream_id, struct.pack(">IB", 0, 200)),  # PRIORITY
        _frame(0x6, 0x0, 0, b"12345678"),  # PING
        _frame(0x4, 0x0, 0, struct.pack(">HI", 0x4, 2**31)),  # SETTINGS: window too large
        _frame(0x4, 0x1, 0, b"\x00"),  # SETTINGS ACK with a payload
        _frame(0x7, 0x0, 0, struct.pack(">II", stream_id, 0)),  # GOAWAY
        _frame(0xF0, 0x0, stream_id, b"extension"),  # an unknown type
        _frame(0x5, 0x4, stream_id, struct.pack(">I", stream_id + 1)),  # PUSH_PROMISE
        SETTINGS_ACK,
    ]


@st.composite
def _client_frames(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """(the preface and first SETTINGS, then each frame after them), as an
    ``h2`` client writes them for a drawn list of actions."""
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    client = h2.connection.H2Connection(config)
    client.initiate_connection()
    opening = client.data_to_send()
    out = bytearray()
    opened: list[int] = []
    for _ in range(draw(st.integers(1, 12))):
        action = draw(
            st.sampled_from(
                ["request", "request", "request", "data", "data", "trailers", "reset",
                 "ping", "settings", "window", "priority", "ack", "raw"]
            )
        )  # fmt: skip
        stream = draw(st.sampled_from(opened)) if opened else 1
        try:
            if action == "request":
                stream = client.get_next_available_stream_id()
                fields = draw(st.sampled_from(_REQUESTS))
                end = draw(st.booleans())
                weight = draw(st.sampled_from([None, None, 16, 220]))
                client.send_headers(stream, fields, end_stream=end, priority_weight=weight)
                opened.append(stream)
            elif action == "data":
                size = draw(st.sampled_from([0, 1, 5, 100, 16384, 40000]))
                pad = draw(st.sampled_from([None, None, 0, 7]))
                end = draw(st.booleans())
                window = client.local_flow_control_window(stream)
                body = b"b" * min(size, window, client.max_outbound_frame_size)
                client.send_data(stream, body, end_stream=end, pad_length=pad)
            elif action == "trailers":
                client.send_headers(stream, draw(st.sampled_from(_TRAILERS)), end_stream=True)
            elif action == "reset":
                client.reset_stream(stream, draw(st.sampled_from([0, 8])))
            elif action == "ping":
                client.ping(b"pingpong")
            elif action == "settings":
                client.update_settings(draw(st.sampled_from(_SETTINGS)))
            elif action == "window":
                client.increment_flow_control_window(
                    draw(st.sampled_from([1, 1000, 2**30])),
                    stream_id=draw(st.sampled_from([None, stream])),
                )
            elif action == "priority":
                client.prioritize(stream, weight=draw(st.integers(1, 256)))
            elif action == "ack":
                out += client.data_to_send() + SETTINGS_ACK
            else:
                out += client.data_to_send() + draw(st.sampled_from(_raw_frames(stream)))
        except (h2.exceptions.ProtocolError, ValueError, KeyError, IndexError):
            pass  # the client refuses it: a later action goes on
        out += client.data_to_send()
    return opening, split_frames(bytes(out))


def split_frames(data: bytes) -> list[bytes]:
    """Whole frames (and what is left, last)."""
    frames = []
    at = 0
    while at + 9 <= len(data):
        end = at + 9 + int.from_bytes(data[at : at + 3], "big")
        frames.append(data[at:end])
        at = end
    if at < len(data):
        frames.append(data[at:])
    return frames


@st.composite
def _mutated(draw: st.DrawFn, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    for _ in range(draw(st.integers(0, 3))):
        if not frames:
            break
        at = draw(st.integers(0, len(frames) - 1))
        op = draw(st.sampled_from(["drop", "repeat", "move", "flip", "flags"]))
        if op == "drop":
            del frames[at]
        elif op == "repeat":
            frames.insert(at, frames[at])
        elif op == "move":
            frames.insert(draw(st.integers(0, len(frames))), frames.pop(at))
        elif op == "flip":
            frame = bytearray(frames[at])
            where = draw(st.integers(0, len(frame) - 1))
            frame[where] ^= draw(st.sampled_from([0x01, 0x04, 0x08, 0x80, 0xFF]))
            frames[at] = bytes(frame)
        else:
            frame = bytearray(frames[at])
            if len(frame) >= 9:
                frame[4] ^= draw(st.sampled_from([0x01, 0x04, 0x08, 0x20]))
            frames[at] = bytes(frame)
    return frames


@st.composite
def conversations(draw: st.DrawFn) -> list[bytes]:
    """A client's byte stream (see the module docstring), cut into reads."""
    opening, frames = draw(_client_frames())
    data = opening + b"".join(draw(_mutated(frames)))
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=4, unique=True)))
    bounds = [0, *(c for c in cuts if c < len(data)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@dataclass(frozen=True)
class Transcript:
    """What one engine made of a conversation: each read's events, and the
    connection error that ended it (GOAWAY's error code; -1 without GOAWAY),
    and the RST_STREAM frames it sent ((stream, error code), in order) before
    the read that ended it."""

    events: list[list[tuple[Any, ...]]]
    error: int | None
    resets: list[tuple[int, int]] = field(default_factory=list, compare=False)
    reason: str = field(default="", compare=False)  # the exception's text


def normal(event: h2.events.Event) -> tuple[Any, ...] | None:
    """An event as a comparable tuple (None: one the edge does not use)."""
    kind = type(event).__name__
    e: Any = event
    if kind in ("RequestReceived", "TrailersReceived"):
        priority = normal(e.priority_updated) if e.priority_updated is not None else None
        return kind, e.stream_id, tuple(e.headers), e.stream_ended is not None, priority
    if kind == "DataReceived":
        return (
            kind,
            e.stream_id,
            bytes(e.data),
            e.flow_controlled_length,
            e.stream_ended is not None,
        )
    if kind in ("StreamEnded", "StreamRefused"):
        return kind, e.stream_id
    if kind == "StreamReset":
        return kind, e.stream_id, int(e.error_code), e.remote_reset
    if kind == "WindowUpdated":
        return kind, e.stream_id, e.delta
    if kind == "RemoteSettingsChanged":
        changes = sorted(
            (int(code), c.original_value, c.new_value) for code, c in e.changed_settings.items()
        )
        return kind, tuple(changes)
    if kind in ("PingReceived", "PingAckReceived"):
        return kind, e.ping_data
    if kind == "PriorityUpdated":
        return kind, e.stream_id, e.weight, e.depends_on, e.exclusive
    if kind == "ConnectionTerminated":
        return kind, int(e.error_code), e.last_stream_id, e.additional_data
    return None  # SettingsAcknowledged, UnknownFrameReceived


def goaway_code(output: bytes) -> int:
    """The error code of the GOAWAY in ``output``, -1 without one."""
    for frame in split_frames(output):
        if len(frame) >= 17 and frame[3] == 0x7:
            return int.from_bytes(frame[13:17], "big")
    return -1


def new_connection(engine: str) -> Any:
    conn = new_server_connection(
        engine,
        max_concurrent_streams=MAX_CONCURRENT_STREAMS,
        max_header_list_size=MAX_HEADER_LIST_SIZE,
        stream_window=STREAM_WINDOW,
    )
    conn.initiate_connection()
    conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
    conn.data_to_send()
    return conn


def connection_transcript(engine: str, reads: Sequence[bytes]) -> Transcript:
    """Each read's events from a fresh server connection of ``engine``, up to
    its connection error (whose read's events it drops, as both engines do)."""
    conn = new_connection(engine)
    events: list[list[tuple[Any, ...]]] = []
    resets: list[tuple[int, int]] = []
    for read in reads:
        try:
            got = conn.receive_data(read)
        except h2.exceptions.ProtocolError as exc:
            return Transcript(events, goaway_code(conn.data_to_send()), resets, str(exc))
        events.append([n for n in map(normal, got) if n is not None])
        resets += [
            (frame.stream_id, frame.error_code)
            for frame in hyperframe_frames(conn.data_to_send())
            if isinstance(frame, hyperframe.frame.RstStreamFrame)
        ]
    return Transcript(events, None, resets)


def hyperframe_frames(data: bytes) -> list[hyperframe.frame.Frame]:
    """``data`` as hyperframe's frames (whole ones only)."""
    frames = []
    for raw in split_frames(data):
        if len(raw) < 9:
            break
        frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(raw[:9]))
        if len(raw) < 9 + length:
            break
        frame.parse_body(memoryview(raw[9:]))
        frames.append(frame)
    return frames
