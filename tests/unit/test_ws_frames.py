"""The WebSocket frame tracker (edge.ws_frames): boundaries and Close codes in a
relayed byte stream however it is split, checked against frames built here."""

from __future__ import annotations

import os
import struct

from hypothesis import given
from hypothesis import strategies as st

from edge.ws_frames import CLOSE_NO_STATUS, FrameTracker, close_frame


def frame(opcode: int, payload: bytes, *, masked: bool, fin: bool = True) -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode])
    size = len(payload)
    mask_bit = 0x80 if masked else 0
    if size < 126:
        head += bytes([mask_bit | size])
    elif size < 65536:
        head += bytes([mask_bit | 126]) + struct.pack("!H", size)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", size)
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


sizes = st.sampled_from([0, 1, 2, 125, 126, 127, 300, 65535, 65536, 70000])
frames = st.lists(
    st.tuples(st.sampled_from([0x1, 0x2, 0x0, 0x9, 0xA]), sizes, st.booleans()), max_size=6
)


@given(frames, st.booleans(), st.integers(0, 65535), st.lists(st.integers(1, 5000), max_size=30))
def test_boundaries_and_the_close_code_survive_any_split(
    specs: list[tuple[int, int, bool]], masked: bool, code: int, cuts: list[int]
) -> None:
    built = [
        frame(op, os.urandom(size) if size < 300 else bytes(size), masked=masked)
        for op, size, _ in specs
    ]
    built.append(frame(0x8, struct.pack("!H", code) + b"bye", masked=masked))
    built.append(frame(0x1, b"after the close", masked=masked))
    stream = b"".join(built)
    ends = set()
    position = 0
    for piece in built:
        position += len(piece)
        ends.add(position)
    tracker = FrameTracker()
    offset = 0
    pieces = []
    for cut in cuts:
        if offset >= len(stream):
            break
        pieces.append(stream[offset : offset + cut])
        offset += cut
    pieces.append(stream[offset:])
    fed = 0
    for piece in pieces:
        if piece:
            # until_boundary: exactly to the next frame end, or all of the piece.
            k = tracker.until_boundary(piece)
            following = min((e for e in ends if e > fed), default=len(stream))
            expected = 0 if fed in ends or fed == 0 else min(following - fed, len(piece))
            assert k == expected, (fed, k, expected)
        tracker.feed(piece)
        fed += len(piece)
        assert tracker.at_boundary == (fed in ends)
    assert tracker.frames == len(built)
    assert tracker.close_code == code


def test_a_close_without_a_code_is_1005_and_only_the_first_close_counts() -> None:
    tracker = FrameTracker()
    tracker.feed(frame(0x8, b"", masked=True) + frame(0x8, struct.pack("!H", 1000), masked=True))
    assert tracker.close_code == CLOSE_NO_STATUS and tracker.frames == 2


def test_injected_close_frames_parse_as_their_code() -> None:
    for masked in (False, True):
        tracker = FrameTracker()
        tracker.feed(close_frame(1001, masked=masked))
        assert tracker.close_code == 1001 and tracker.at_boundary
    assert close_frame(1001, masked=False) == b"\x88\x02\x03\xe9"
    assert close_frame(1012, masked=True)[1] == 0x82  # mask bit, two octets
