"""Frame encoders (PROTOCOL.md §5). Decoding lives in the session's receive loop,
which dispatches on the 10-octet header without building frame objects: that is
the hot path, and an object per frame costs more than the frame.
"""

from __future__ import annotations

import struct

from tunnel.mux.constants import (
    HEADER,
    MAX_GOAWAY_REASON_BYTES,
    PREFACE,
    SETTING,
    U32,
    U32_PAIR,
    Flag,
    FrameType,
)

_VERSIONS = struct.Struct(">HH")

_pack_header = HEADER.pack


def header(frame_type: int, flags: int, stream_id: int, length: int) -> bytes:
    return _pack_header(frame_type, flags, stream_id, length)


def encode_hello(min_version: int, max_version: int, settings: dict[int, int]) -> bytes:
    """The preface and HELLO frame that open a connection (PROTOCOL.md §3)."""
    payload = _VERSIONS.pack(min_version, max_version) + encode_settings_payload(settings)
    return PREFACE + _pack_header(FrameType.HELLO, 0, 0, len(payload)) + payload


def encode_settings_payload(settings: dict[int, int]) -> bytes:
    return b"".join(SETTING.pack(key, value) for key, value in sorted(settings.items()))


def encode_settings(settings: dict[int, int]) -> bytes:
    payload = encode_settings_payload(settings)
    return _pack_header(FrameType.SETTINGS, 0, 0, len(payload)) + payload


def encode_open(stream_id: int, initial_window: int, metadata: bytes, end_stream: bool) -> bytes:
    flags = Flag.END_STREAM if end_stream else 0
    return (
        _pack_header(FrameType.OPEN, flags, stream_id, 4 + len(metadata))
        + U32.pack(initial_window)
        + metadata
    )


def encode_window_update(stream_id: int, increment: int) -> bytes:
    return _pack_header(FrameType.WINDOW_UPDATE, 0, stream_id, 4) + U32.pack(increment)


def encode_reset(stream_id: int, error_code: int) -> bytes:
    return _pack_header(FrameType.RESET, 0, stream_id, 4) + U32.pack(error_code)


def encode_ping(opaque: bytes) -> bytes:
    return _pack_header(FrameType.PING, 0, 0, 8) + opaque


def encode_pong(opaque: bytes) -> bytes:
    return _pack_header(FrameType.PONG, 0, 0, 8) + opaque


def encode_padding(length: int) -> bytes:
    """A PADDING frame of ``length`` zero octets (PROTOCOL.md §5.13): the peer
    discards it; it only exists to be carried."""
    return _pack_header(FrameType.PADDING, 0, 0, length) + bytes(length)


def encode_goaway(last_stream_id: int, error_code: int, reason: str) -> bytes:
    text = reason.encode("utf-8")[:MAX_GOAWAY_REASON_BYTES]
    payload = U32_PAIR.pack(last_stream_id, error_code) + text
    return _pack_header(FrameType.GOAWAY, 0, 0, len(payload)) + payload


def decode_versions(payload: bytes) -> tuple[int, int]:
    return _VERSIONS.unpack_from(payload, 0)


def decode_settings(payload: bytes) -> dict[int, int]:
    """Settings pairs; the caller has checked the length is a multiple of 6."""
    return {key: value for key, value in SETTING.iter_unpack(payload)}
