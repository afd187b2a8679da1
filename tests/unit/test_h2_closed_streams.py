"""Frames on a stream that is closed, or that the client skipped, get the same
answer on both HTTP/2 engines (edge.h2_engine): RFC 9113 §5.1 and §5.1.1, as
h2spec's "5.1. Stream States" (closed) and "5.1.1. Stream Identifiers" cases
ask. nghttp2, which keeps no closed streams here, would ignore them all."""

from __future__ import annotations

import struct
from typing import Any

import h2.exceptions
import hyperframe.frame
import pytest

from tests.h2_conversations import (
    _GET,
    PREFACE,
    _frame,
    _literal_block,
    hyperframe_frames,
    new_connection,
)
from tests.h2_engines import H2_ENGINES

SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
PROTOCOL_ERROR, STREAM_CLOSED = 0x1, 0x5


def _headers(stream: int, *, end: bool = True) -> bytes:
    return _frame(0x1, 0x4 | (0x1 if end else 0x0), stream, _literal_block(_GET))


def _data(stream: int) -> bytes:
    return _frame(0x0, 0x0, stream, b"abc")


def _reset(stream: int) -> bytes:
    return _frame(0x3, 0x0, stream, struct.pack(">I", 0x8))


def _window_update(stream: int) -> bytes:
    return _frame(0x8, 0x0, stream, struct.pack(">I", 10))


#: What the client does first (the stream's past), what it sends then, and the
#: answer: ("reset", STREAM_CLOSED) a stream error, ("goaway", code) a
#: connection error, None nothing.
CASES = {
    "DATA after the client's reset": ("client reset", _data(1), ("reset", STREAM_CLOSED)),
    "HEADERS after the client's reset": ("client reset", _headers(1), ("reset", STREAM_CLOSED)),
    "DATA after our reset": ("our reset", _data(1), ("reset", STREAM_CLOSED)),
    "HEADERS after our reset": ("our reset", _headers(1), ("reset", STREAM_CLOSED)),
    "DATA on a stream closed at both ends": ("both ended", _data(1), ("reset", STREAM_CLOSED)),
    "HEADERS on a stream closed at both ends": (
        "both ended",
        _headers(1),
        ("goaway", STREAM_CLOSED),
    ),
    "WINDOW_UPDATE on a stream closed at both ends": ("both ended", _window_update(1), None),
    "HEADERS on a stream id the client skipped": (
        "stream 5 opened",
        _headers(3),
        ("goaway", PROTOCOL_ERROR),
    ),
    "DATA on a stream id the client skipped": (
        "stream 5 opened",
        _data(3),
        ("reset", STREAM_CLOSED),
    ),
    "HEADERS on a skipped id the client reset": (
        "stream 5 opened, 3 reset",
        _headers(3),
        ("goaway", PROTOCOL_ERROR),
    ),
}


def _past(conn: Any, past: str) -> None:
    if past == "client reset":
        conn.receive_data(_headers(1, end=False) + _reset(1))
    elif past == "our reset":
        conn.receive_data(_headers(1, end=False))
        conn.reset_stream(1, 0x8)
    elif past == "both ended":
        conn.receive_data(_headers(1))
        conn.send_headers(1, [(b":status", b"200")], end_stream=True)
    elif past == "stream 5 opened":
        conn.receive_data(_headers(5, end=False))
    else:
        conn.receive_data(_headers(5, end=False) + _reset(3))


@pytest.mark.parametrize("engine", H2_ENGINES)
@pytest.mark.parametrize("case", list(CASES))
def test_a_frame_on_a_closed_or_skipped_stream_gets_rfc_9113s_answer(
    engine: str, case: str
) -> None:
    past, frame, answer = CASES[case]
    conn = new_connection(engine)
    conn.receive_data(PREFACE + SETTINGS)
    _past(conn, past)
    conn.data_to_send()
    try:
        conn.receive_data(frame)
        error = None
    except h2.exceptions.ProtocolError as exc:
        error = exc
    sent = hyperframe_frames(conn.data_to_send())
    resets = [
        (f.stream_id, f.error_code) for f in sent if isinstance(f, hyperframe.frame.RstStreamFrame)
    ]
    goaways = [f.error_code for f in sent if isinstance(f, hyperframe.frame.GoAwayFrame)]
    if answer is None:
        assert (error, resets, goaways) == (None, [], [])
    elif answer[0] == "reset":
        assert (error, resets, goaways) == (None, [(frame_stream(frame), answer[1])], [])
    else:
        assert error is not None
        assert goaways == [answer[1]]


def frame_stream(frame: bytes) -> int:
    return int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF
