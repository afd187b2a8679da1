"""Where WebSocket frames begin and end in one direction of a relayed connection.

The edge relays a WebSocket's octets as they come (it does not re-frame
messages), so to say how a session ended, and to close one itself on a drain
without cutting a frame in half, it follows the frame headers (RFC 6455
§5.2) and skips the payloads. Sans-I/O: :meth:`FrameTracker.feed` takes the
octets in the order they are relayed, :meth:`FrameTracker.until_boundary`
says how many of the next ones finish the frame in progress, and
:func:`close_frame` builds the Close frame to inject there. Control frames may
come between the fragments of a message (§5.4), so a frame boundary is a safe
place for a Close.

Cost: the header of each frame, none per payload octet (a 64 KiB frame is
skipped in one step); the tracker validates nothing, the peers do.
"""

from __future__ import annotations

import os
import struct

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_NO_STATUS",
    "CLOSE_SERVICE_RESTART",
    "FrameTracker",
    "close_frame",
]

#: The endpoint is going away (a server shutting down): RFC 6455 §7.4.1.
CLOSE_GOING_AWAY = 1001
#: The service restarts: reconnect (IANA WebSocket close code registry, RFC 6455 §11.7).
CLOSE_SERVICE_RESTART = 1012
#: A Close frame without a status code (§7.1.5: "no status code was present").
CLOSE_NO_STATUS = 1005
_OPCODE_CLOSE = 0x8


class FrameTracker:
    """One direction of a WebSocket: frame boundaries and the first Close seen."""

    __slots__ = (
        "_close_payload",
        "_header",
        "_in_close",
        "_mask",
        "_offset",
        "_remaining",
        "close_code",
        "frames",
    )

    def __init__(self) -> None:
        self._header = bytearray()  # a frame header still incomplete
        self._remaining = 0  # payload octets of the current frame still to come
        self._in_close = False
        self._mask = b""
        self._offset = 0  # payload octets of the current Close frame seen
        self._close_payload = bytearray()
        self.frames = 0
        #: The status code of the first Close frame seen (1005 when it had none).
        self.close_code: int | None = None

    @property
    def at_boundary(self) -> bool:
        """Between two frames: a frame of our own may go here."""
        return not self._header and not self._remaining

    def until_boundary(self, data: bytes) -> int:
        """How many octets of ``data`` finish the frame in progress: 0 at a
        boundary, ``len(data)`` when the frame does not end within it."""
        if self.at_boundary:
            return 0
        if not self._header:
            return min(self._remaining, len(data))
        # Inside a header: parse a copy to learn where that frame ends.
        probe = FrameTracker()
        probe._header = bytearray(self._header)
        for index in range(len(data)):
            probe.feed(data[index : index + 1])
            if not probe._header:
                return min(index + 1 + probe._remaining, len(data))
        return len(data)

    def feed(self, data: bytes) -> None:
        """Octets relayed in this direction, in order."""
        size = len(data)
        index = 0
        while index < size:
            if self._remaining:
                take = min(self._remaining, size - index)
                if self._in_close:
                    self._close_octets(data[index : index + take])
                self._remaining -= take
                index += take
                if not self._remaining:
                    self._frame_done()
                continue
            header = self._header
            for _ in range(2):  # the first two octets say how long the header is
                needed = self._header_length()
                take = min(needed - len(header), size - index)
                header += data[index : index + take]
                index += take
            if len(header) == self._header_length():
                self._start_frame()

    def _header_length(self) -> int:
        header = self._header
        if len(header) < 2:
            return 2
        length7 = header[1] & 0x7F
        extended = 2 if length7 == 126 else 8 if length7 == 127 else 0
        return 2 + extended + (4 if header[1] & 0x80 else 0)

    def _start_frame(self) -> None:
        header = self._header
        length = header[1] & 0x7F
        if length == 126:
            length = struct.unpack_from("!H", header, 2)[0]
        elif length == 127:
            length = struct.unpack_from("!Q", header, 2)[0]
        self.frames += 1
        if header[0] & 0x0F == _OPCODE_CLOSE and self.close_code is None:
            self._in_close = True
            self._mask = bytes(header[-4:]) if header[1] & 0x80 else b""
            self._offset = 0
            self._close_payload.clear()
        self._header = bytearray()
        self._remaining = length
        if not length:
            self._frame_done()

    def _frame_done(self) -> None:
        if self._in_close:
            self._in_close = False
            if self.close_code is None:
                payload = self._close_payload
                code = struct.unpack("!H", bytes(payload[:2]))[0] if len(payload) >= 2 else None
                self.close_code = CLOSE_NO_STATUS if code is None else code

    def _close_octets(self, chunk: bytes) -> None:
        """Keep the (unmasked) status code: the payload's first two octets."""
        needed = 2 - len(self._close_payload)
        mask = self._mask
        for octet in chunk[:needed]:
            self._close_payload.append(octet ^ mask[self._offset % 4] if mask else octet)
            self._offset += 1


def close_frame(code: int, *, masked: bool) -> bytes:
    """A Close frame with ``code`` and no reason; ``masked`` as a client sends it."""
    payload = struct.pack("!H", code)
    if not masked:
        return bytes((0x80 | _OPCODE_CLOSE, len(payload))) + payload
    mask = os.urandom(4)
    body = bytes(octet ^ mask[i % 4] for i, octet in enumerate(payload))
    return bytes((0x80 | _OPCODE_CLOSE, 0x80 | len(payload))) + mask + body
