"""Frame encoders (PROTOCOL.md §5). Decoding lives in the session's receive loop,
which dispatches on the 10-octet header without building frame objects: that is
the hot path, and an object per frame costs more than the frame. The decoders
here are for payloads with fields to check (HELLO, SETTINGS, CONTROL).
"""

from __future__ import annotations

import struct

from tunnel.mux.constants import (
    CONTROL_HEADER,
    CONTROL_HEADER_SIZE,
    HEADER,
    MAX_CONTROL_REASON_BYTES,
    MAX_GOAWAY_REASON_BYTES,
    PREFACE,
    SETTING,
    U32,
    U32_PAIR,
    ControlKind,
    ControlStatus,
    Flag,
    FrameType,
)
from tunnel.mux.errors import FrameSizeError, ProtocolError

_VERSIONS = struct.Struct(">HH")

_pack_header = HEADER.pack
# Frame types and flags as plain ints: a member read off its class goes through
# ``EnumType.__getattr__``'s slot (~1,000 instructions in 3.11), and a request
# encodes an OPEN and a RESET.
_HELLO = int(FrameType.HELLO)
_SETTINGS = int(FrameType.SETTINGS)
_OPEN = int(FrameType.OPEN)
_WINDOW_UPDATE = int(FrameType.WINDOW_UPDATE)
_RESET = int(FrameType.RESET)
_PING = int(FrameType.PING)
_PONG = int(FrameType.PONG)
_PADDING = int(FrameType.PADDING)
_GOAWAY = int(FrameType.GOAWAY)
_CONTROL = int(FrameType.CONTROL)
_END_STREAM = int(Flag.END_STREAM)


def header(frame_type: int, flags: int, stream_id: int, length: int) -> bytes:
    return _pack_header(frame_type, flags, stream_id, length)


def encode_hello(min_version: int, max_version: int, settings: dict[int, int]) -> bytes:
    """The preface and HELLO frame that open a connection (PROTOCOL.md §3)."""
    payload = _VERSIONS.pack(min_version, max_version) + encode_settings_payload(settings)
    return PREFACE + _pack_header(_HELLO, 0, 0, len(payload)) + payload


def encode_settings_payload(settings: dict[int, int]) -> bytes:
    return b"".join(SETTING.pack(key, value) for key, value in sorted(settings.items()))


def encode_settings(settings: dict[int, int]) -> bytes:
    payload = encode_settings_payload(settings)
    return _pack_header(_SETTINGS, 0, 0, len(payload)) + payload


def encode_open(stream_id: int, initial_window: int, metadata: bytes, end_stream: bool) -> bytes:
    flags = _END_STREAM if end_stream else 0
    return (
        _pack_header(_OPEN, flags, stream_id, 4 + len(metadata))
        + U32.pack(initial_window)
        + metadata
    )


def encode_window_update(stream_id: int, increment: int) -> bytes:
    return _pack_header(_WINDOW_UPDATE, 0, stream_id, 4) + U32.pack(increment)


def encode_reset(stream_id: int, error_code: int) -> bytes:
    return _pack_header(_RESET, 0, stream_id, 4) + U32.pack(error_code)


def encode_ping(opaque: bytes) -> bytes:
    return _pack_header(_PING, 0, 0, 8) + opaque


def encode_pong(opaque: bytes) -> bytes:
    return _pack_header(_PONG, 0, 0, 8) + opaque


def encode_padding(length: int) -> bytes:
    """A PADDING frame of ``length`` zero octets (PROTOCOL.md §5.13): the peer
    discards it; it only exists to be carried."""
    return _pack_header(_PADDING, 0, 0, length) + bytes(length)


def encode_goaway(last_stream_id: int, error_code: int, reason: str) -> bytes:
    text = reason.encode("utf-8")[:MAX_GOAWAY_REASON_BYTES]
    payload = U32_PAIR.pack(last_stream_id, error_code) + text
    return _pack_header(_GOAWAY, 0, 0, len(payload)) + payload


def encode_control(kind: int, message_id: int, body: bytes) -> bytes:
    """A CONTROL frame (PROTOCOL.md §5.14): Kind, Message Id, then the body."""
    return (
        _pack_header(_CONTROL, 0, 0, CONTROL_HEADER_SIZE + len(body))
        + CONTROL_HEADER.pack(kind, message_id)
        + body
    )


def encode_control_ack(message_id: int, status: int, reason: str) -> bytes:
    """The ACK of ``message_id`` (CONTROL kind 0). The reason is cut to 256
    octets at a character boundary, so what goes out is always UTF-8."""
    text = reason.encode("utf-8")
    if len(text) > MAX_CONTROL_REASON_BYTES:
        text = text[:MAX_CONTROL_REASON_BYTES].decode("utf-8", "ignore").encode("utf-8")
    return encode_control(ControlKind.ACK, message_id, bytes((status,)) + text)


def decode_control(payload: bytes) -> tuple[int, int, bytes]:
    """Kind, Message Id and Body of a CONTROL payload; shorter than its
    6-octet header: :class:`FrameSizeError` (§5.14)."""
    if len(payload) < CONTROL_HEADER_SIZE:
        raise FrameSizeError("CONTROL shorter than its kind and message id")
    kind, message_id = CONTROL_HEADER.unpack_from(payload, 0)
    return kind, message_id, payload[CONTROL_HEADER_SIZE:]


_STATUSES = {int(status): status for status in ControlStatus}


def decode_control_ack(body: bytes) -> tuple[ControlStatus, str]:
    """Status and reason of an ACK's body. No status octet, or a reason above
    256 octets: :class:`FrameSizeError`; a status not in §5.14:
    :class:`ProtocolError`. The reason is for logs: invalid UTF-8 is replaced."""
    if not body or len(body) > 1 + MAX_CONTROL_REASON_BYTES:
        raise FrameSizeError(f"CONTROL ACK body of {len(body)} octets")
    status = _STATUSES.get(body[0])
    if status is None:
        raise ProtocolError(f"CONTROL ACK with unknown status {body[0]}")
    return status, body[1:].decode("utf-8", "replace")


def decode_versions(payload: bytes) -> tuple[int, int]:
    return _VERSIONS.unpack_from(payload, 0)


def decode_settings(payload: bytes) -> dict[int, int]:
    """Settings pairs; the caller has checked the length is a multiple of 6."""
    return {key: value for key, value in SETTING.iter_unpack(payload)}
