"""Splitting the byte stream into frames (PROTOCOL.md §2, §3).

Why its own reader rather than a bytearray that accumulates everything: the
receive path is the tunnel's hottest loop. Frames that arrive whole are sliced
straight out of the chunk the transport handed us (one copy per payload); only a
frame split across reads is assembled in a small buffer. Memory held between
reads is bounded by one header plus ``max_payload`` octets.
"""

from __future__ import annotations

from tunnel.mux.constants import HEADER, HEADER_SIZE, PREFACE
from tunnel.mux.errors import FrameSizeError, ProtocolError

RawFrame = tuple[int, int, int, bytes]  # type, flags, stream id, payload

_unpack_header = HEADER.unpack_from


class FrameReader:
    __slots__ = ("_partial", "_preface_pending", "max_payload")

    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload
        self._partial = bytearray()
        self._preface_pending = True

    @property
    def buffered(self) -> int:
        """Octets held for a frame not yet complete."""
        return len(self._partial)

    def feed(self, data: bytes) -> list[RawFrame]:
        """Whole frames found so far; raises :class:`ProtocolError` (or
        :class:`FrameSizeError`) when the stream cannot be framed.

        The exception carries the whole frames that preceded the fault in
        ``frames_before``: the session processes them first, so the outcome
        does not depend on how the bytes were split into reads (the first
        error in byte order wins, PROTOCOL.md §2.3)."""
        frames: list[RawFrame] = []
        try:
            self._feed(data, frames)
        except ProtocolError as exc:
            exc.frames_before = frames  # type: ignore[attr-defined]
            raise
        return frames

    def _feed(self, data: bytes, frames: list[RawFrame]) -> None:
        if not isinstance(data, bytes):
            data = bytes(data)
        pos = 0
        if self._partial or self._preface_pending:
            pos = self._complete_partial(data, frames)
            if self._partial or self._preface_pending:
                return
        end = len(data)
        limit = self.max_payload
        while end - pos >= HEADER_SIZE:
            frame_type, flags, stream_id, length = _unpack_header(data, pos)
            if length > limit:
                raise FrameSizeError(f"frame of {length} octets exceeds our limit {limit}")
            start = pos + HEADER_SIZE
            stop = start + length
            if stop > end:
                break
            frames.append((frame_type, flags, stream_id, data[start:stop]))
            pos = stop
        if pos < end:
            self._partial += memoryview(data)[pos:]
            if len(self._partial) >= HEADER_SIZE:
                self._check_length(self._partial)

    def _complete_partial(self, data: bytes, frames: list[RawFrame]) -> int:
        """Fill the pending preface or split frame from ``data``; returns how
        many octets of ``data`` it used."""
        buf = self._partial
        if self._preface_pending:
            used = min(len(PREFACE) - len(buf), len(data))
            buf += data[:used]
            if not PREFACE.startswith(bytes(buf)):
                raise ProtocolError("peer did not send the geoedge preface")
            if len(buf) == len(PREFACE):
                self._preface_pending = False
                buf.clear()
            return used
        pos = 0
        if len(buf) < HEADER_SIZE:
            pos = min(HEADER_SIZE - len(buf), len(data))
            buf += data[:pos]
            if len(buf) < HEADER_SIZE:
                return pos
        length = self._check_length(buf)
        take = min(HEADER_SIZE + length - len(buf), len(data) - pos)
        buf += data[pos : pos + take]
        pos += take
        if len(buf) == HEADER_SIZE + length:
            frame_type, flags, stream_id, _ = _unpack_header(buf, 0)
            frames.append((frame_type, flags, stream_id, bytes(buf[HEADER_SIZE:])))
            buf.clear()
        return pos

    def _check_length(self, buf: bytearray) -> int:
        length: int = _unpack_header(buf, 0)[3]
        if length > self.max_payload:
            raise FrameSizeError(f"frame of {length} octets exceeds our limit {self.max_payload}")
        return length
