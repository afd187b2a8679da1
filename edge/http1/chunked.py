"""A strict scanner of chunked transfer coding (RFC 9112 §7.1), shared by both readers.

Why our own rather than llhttp's: httptools does not report where in a buffer
a message ended, exposes no chunk-extension callbacks and has no limit on
the digits of a chunk-size (llhttp accepts any number of leading zeros) or on
the length of an extension. A smuggling-safe proxy needs all three, and
tracking them beside llhttp would duplicate its state machine anyway. So the
head goes to llhttp and the body comes here.

The scanner never copies body bytes: :meth:`ChunkedScanner.scan` reports
the payload as ``(start, end)`` spans of the caller's buffer. Lines are found
with ``bytes.find`` (C); the only Python loops run over the ≤ 16 digits of a
chunk-size. What it rejects, with status 400: a chunk-size that is empty, not
hex (``0x10``, ``+5``, spaces), longer than ``max_chunk_size_digits``; an
extension longer than ``max_chunk_extension_bytes`` or not matching the
ABNF; whitespace between size and ``;`` (llhttp's strict mode agrees); chunk
data not followed by CRLF; a bare LF anywhere in the framing; a trailer
section that is larger than ``max_header_bytes`` or not made of well-formed
field lines. With ``max_body_bytes`` (the request side), a chunk whose
declared size takes the body past it is refused with 413 as soon as its size
line is read, before its data arrives.
"""

from __future__ import annotations

from edge.http1.errors import MessageRejected
from edge.http1.limits import HttpLimits
from edge.http1.syntax import CHUNK_EXTENSION_RE, HEXDIGITS, TRAILER_SECTION_RE, parse_hex

_SIZE, _DATA, _DATA_CRLF, _TRAILERS, _DONE = range(5)


def trailer_fields(section: bytes) -> tuple[tuple[bytes, bytes], ...]:
    """(lowercase name, value without surrounding whitespace) for each field line
    of a trailer section that :class:`ChunkedScanner` validated."""
    fields = []
    for line in section.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b":")
        fields.append((name.lower(), value.strip(b" \t")))
    return tuple(fields)


class ChunkedScanner:
    """Walks chunked framing; the caller owns the buffer and any unconsumed tail."""

    __slots__ = (
        "_declared",
        "_max_body",
        "_max_digits",
        "_max_extension",
        "_max_trailer",
        "_remaining",
        "_state",
        "trailers",
    )

    def __init__(self, limits: HttpLimits, max_body_bytes: int | None = None) -> None:
        self._max_body = max_body_bytes
        self._declared = 0
        self._max_digits = limits.max_chunk_size_digits
        self._max_extension = limits.max_chunk_extension_bytes
        self._max_trailer = limits.max_header_bytes
        self._state = _SIZE
        self._remaining = 0
        self.trailers = b""
        """The trailer section's field lines, each ending in CRLF, once :attr:`done`."""

    @property
    def done(self) -> bool:
        """The last chunk and the trailer section have been consumed."""
        return self._state == _DONE

    @property
    def _line_cap(self) -> int:
        return self._max_digits + self._max_extension + 2

    def scan(self, data: bytes, pos: int, spans: list[tuple[int, int]]) -> int:
        """Consume framing from ``data[pos:]``, appending payload spans to ``spans``.

        Returns the index of the first byte not consumed. Bytes from there to
        the end are an incomplete line (never more than a chunk-size line or
        a trailer section): the caller keeps them and presents them again,
        followed by more data. Stops at the end of the body (:attr:`done`).
        Raises :class:`MessageRejected`.
        """
        size = len(data)
        while pos < size:
            state = self._state
            if state == _DATA:
                take = min(self._remaining, size - pos)
                spans.append((pos, pos + take))
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _DATA_CRLF
            elif state == _SIZE:
                line_end = data.find(b"\r\n", pos, pos + self._line_cap)
                if line_end < 0:
                    self._check_partial_size_line(data, pos)
                    return pos
                self._remaining = self._parse_size_line(data[pos:line_end])
                if self._max_body is not None:
                    self._declared += self._remaining
                    if self._declared > self._max_body:
                        raise MessageRejected(413, "chunked body above max_body_bytes")
                pos = line_end + 2
                self._state = _DATA if self._remaining else _TRAILERS
            elif state == _DATA_CRLF:
                if data.startswith(b"\r\n", pos):
                    pos += 2
                    self._state = _SIZE
                elif size - pos == 1 and data[pos] == 13:
                    return pos
                else:
                    raise MessageRejected(400, "chunk data not followed by CRLF")
            elif state == _TRAILERS:
                pos = self._scan_trailers(data, pos)
                if self._state != _DONE:
                    return pos
            else:
                return pos
        return pos

    def _check_partial_size_line(self, data: bytes, pos: int) -> None:
        """Fail early and precisely when a size line cannot become valid."""
        partial = data[pos : pos + self._line_cap]
        full = len(partial) >= self._line_cap
        if partial.endswith(b"\r"):
            partial = partial[:-1]  # the CRLF may be split between two reads
        semicolon = partial.find(b";")
        digits = partial if semicolon < 0 else partial[:semicolon]
        if len(digits) > self._max_digits:
            raise MessageRejected(400, "chunk size has too many digits")
        if digits.translate(None, HEXDIGITS) or b"\n" in partial:
            raise MessageRejected(400, "invalid chunk size line")
        if full:
            raise MessageRejected(400, "chunk extension too long")

    def _parse_size_line(self, line: bytes) -> int:
        semicolon = line.find(b";")
        if semicolon < 0:
            digits, extension = line, b""
        else:
            digits, extension = line[:semicolon], line[semicolon:]
        if len(digits) > self._max_digits:
            raise MessageRejected(400, "chunk size has too many digits")
        value = parse_hex(digits, self._max_digits)
        if value is None:
            raise MessageRejected(400, "invalid chunk size")
        if extension:
            if len(extension) > self._max_extension:
                raise MessageRejected(400, "chunk extension too long")
            if CHUNK_EXTENSION_RE.fullmatch(extension) is None:
                raise MessageRejected(400, "invalid chunk extension")
        return value

    def _scan_trailers(self, data: bytes, pos: int) -> int:
        if data.startswith(b"\r\n", pos):
            self._state = _DONE
            return pos + 2
        available = len(data) - pos
        if available == 1 and data[pos] == 13:
            return pos
        end = data.find(b"\r\n\r\n", pos, pos + self._max_trailer)
        if end < 0:
            if available >= self._max_trailer:
                raise MessageRejected(400, "trailer section too large")
            last_line_end = data.rfind(b"\n", pos) + 1
            if last_line_end and TRAILER_SECTION_RE.fullmatch(data, pos, last_line_end) is None:
                raise MessageRejected(400, "invalid trailer section")
            return pos
        if TRAILER_SECTION_RE.fullmatch(data, pos, end + 2) is None:
            raise MessageRejected(400, "invalid trailer section")
        self.trailers = data[pos : end + 2]
        self._state = _DONE
        return end + 4
