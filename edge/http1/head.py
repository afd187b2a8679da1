"""One message head, start line to empty line, parsed by llhttp inside our own bounds.

Why a frame around llhttp (httptools) rather than feeding it the whole stream:

- httptools accumulates a header value that spans several ``feed_data`` calls
  with no bound, and llhttp has no limit on the start line or head size, so we
  find the end of the head ourselves (``bytes.find`` in C) and feed llhttp
  only bytes that fit in :class:`~edge.http1.limits.HttpLimits`;
- httptools cannot tell us where in a buffer a message ended (except for an
  upgrade), so we hand it exactly one head and never a body byte: body
  framing is ours (:mod:`edge.http1.chunked`), with the limits llhttp lacks;
- the start line is fed in one piece once its CRLF is in, so whether an
  unknown method gets 501 or 400 does not depend on how the bytes were split.

llhttp still does what it is good at, strictly (no leniency flags set):
method, target and version syntax, header-name tokens, header-value
characters (NUL, CR, DEL...), bare LF, obs-fold, duplicate Content-Length,
Content-Length with Transfer-Encoding. A fresh llhttp parser serves each head
(0.2 µs to create).

A plain head that arrives whole in one ``feed`` takes a shorter road in the
compiled build (:func:`plain_head`): a scan of its bytes, compiled to a loop
in C, that accepts only heads llhttp accepts too and reads them as llhttp
does; anything else, and every rejection, is llhttp's as above. Why:
llhttp's parser object and a Python callback per field cost more than the
parsing itself: ~51,000 machine instructions per request head and ~35,000
per response head at the edge, against ~9,000 and ~15,000 on the plain road
(``make bench-hop-instructions``). A version with regular expressions saved
nothing (``re`` spends 80-300 instructions a byte on such patterns).
``tests/property/test_head_roads_agree.py`` holds the two roads to each
other.
"""

from __future__ import annotations

import httptools

from edge.http1.errors import MessageRejected
from edge.http1.limits import HttpLimits
from edge.http1.syntax import DIGITS, LINE_FORBIDDEN_RE, MAX_CONTENT_LENGTH_DIGITS, REQUEST_LINE_RE

_SUPPORTED_VERSIONS = ("1.1", "1.0")
_CRLF = b"\r\n"
_END = b"\r\n\r\n"


# The plain road (plain_head): a scan of the bytes, compiled to a loop in C.
# Each piece it accepts is a subset of what llhttp accepts: a known method,
# an origin-form target of RFC 3986 characters, HTTP/1.0 or 1.1, a status of
# 200-599 with a reason of visible characters and spaces, and field lines of
# a token, a colon, optional whitespace and a value of visible characters and
# inner whitespace (llhttp reports trailing whitespace as part of a value;
# such heads go to llhttp).
_TOKEN_CHAR, _TARGET_CHAR, _VALUE_CHAR, _VISIBLE_CHAR = 1, 2, 4, 8


def _classes() -> bytes:
    table = bytearray(256)
    alphanumerics = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    for byte in b"!#$%&'*+-.^_`|~" + alphanumerics:  # RFC 9110 tchar
        table[byte] |= _TOKEN_CHAR
    for byte in b"-._~!$&'()*+,;=:@/%?" + alphanumerics:  # RFC 3986 pchar, "/", "?"
        table[byte] |= _TARGET_CHAR
    for byte in range(0x21, 0x7F):
        table[byte] |= _VALUE_CHAR | _VISIBLE_CHAR
    table[0x20] |= _VALUE_CHAR
    table[0x09] |= _VALUE_CHAR
    return bytes(table)


_CLASSES = _classes()
_PLAIN_METHODS = frozenset({b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"})
#: The plain road runs in the compiled build only: interpreted, a scan byte
#: by byte costs more than llhttp's road, and the pure build is the reference.
PLAIN_ROAD = not __file__.endswith(".py")


PlainHead = tuple[int | bytes, bytes, bytes, list[tuple[bytes, bytes]]]


def plain_head(
    data: bytes, pos: int, end: int, response: bool, max_headers: int
) -> PlainHead | None:
    """``data[pos:end]``, a whole head ending in CRLFCRLF, read without llhttp
    when it is plain: ``(method or status, target or reason, http_version,
    headers)`` exactly as llhttp would report them, or None for any head that
    is not plain (llhttp then reads it, and rejects what it rejects).

    Besides the syntax: at most ``max_headers`` fields; at most one
    Content-Length, of 1-18 digits; Transfer-Encoding only as one
    ``chunked``, in HTTP/1.1, without a Content-Length; no Upgrade."""
    classes = _CLASSES
    if end - pos < 18:
        return None
    i = pos
    if response:
        if not data.startswith(b"HTTP/1.", i):
            return None
        minor = data[i + 7]
        hundreds, tens, units = data[i + 9], data[i + 10], data[i + 11]
        if (
            (minor != 48 and minor != 49)
            or data[i + 8] != 32
            or not (50 <= hundreds <= 53 and 48 <= tens <= 57 and 48 <= units <= 57)
            or data[i + 12] != 32
        ):
            return None
        first: int | bytes = hundreds * 100 + tens * 10 + units - 5328  # 5328 == 48 * 111
        i += 13
        start = i
        while classes[data[i]] & _VALUE_CHAR and data[i] != 9:
            i += 1
        if i == start or data[i - 1] == 32 or data[i] != 13 or data[i + 1] != 10:
            return None
        second = data[start:i]
        i += 2
    else:
        while 65 <= data[i] <= 90:
            i += 1
        first = data[pos:i]
        if first not in _PLAIN_METHODS or data[i] != 32 or data[i + 1] != 47:  # SP "/"
            return None
        i += 1
        start = i
        while classes[data[i]] & _TARGET_CHAR:
            i += 1
        second = data[start:i]
        if data[i] != 32 or not data.startswith(b"HTTP/1.", i + 1):
            return None
        minor = data[i + 8]
        if (minor != 48 and minor != 49) or data[i + 9] != 13 or data[i + 10] != 10:
            return None
        i += 11
    headers: list[tuple[bytes, bytes]] = []
    lengths = 0
    chunked = False
    while data[i] != 13:
        start = i
        while classes[data[i]] & _TOKEN_CHAR:
            i += 1
        if i == start or data[i] != 58:  # ":"
            return None
        name = data[start:i]
        i += 1
        while data[i] == 32 or data[i] == 9:
            i += 1
        start = i
        if not classes[data[i]] & _VISIBLE_CHAR:
            return None
        while classes[data[i]] & _VALUE_CHAR:
            i += 1
        if not classes[data[i - 1]] & _VISIBLE_CHAR or data[i] != 13 or data[i + 1] != 10:
            return None
        value = data[start:i]
        i += 2
        headers.append((name, value))
        if len(headers) > max_headers:
            return None
        size = len(name)
        if size == 14 or size == 17 or size == 7:  # Content-Length, Transfer-Encoding, Upgrade
            lowered = name.lower()
            if lowered == b"content-length":
                digits = len(value)
                if lengths or digits > MAX_CONTENT_LENGTH_DIGITS or value.translate(None, DIGITS):
                    return None
                lengths = 1
            elif lowered == b"transfer-encoding":
                if chunked or value != b"chunked" or minor == 48:
                    return None
                chunked = True
            elif lowered == b"upgrade":
                return None
    if i + 2 != end or data[i + 1] != 10 or (lengths and chunked):
        return None
    return first, second, b"1.1" if minor == 49 else b"1.0", headers


class _TooManyHeaders(Exception):
    """Raised from inside an llhttp callback to stop parsing at once."""


class _Callbacks:
    """llhttp's callbacks for one head, and what they collect.

    A parser keeps its callbacks (bound methods) for its whole life. With the
    :class:`HeadParser` itself as the callbacks object, the two would hold each
    other: a cycle that only the cyclic collector frees, left behind by every
    connection that ends mid-head or with a rejected head. Here it is one way,
    HeadParser → parser → callbacks, and reference counting frees all three.
    """

    __slots__ = ("complete", "headers", "max_headers", "reason", "target")

    def __init__(self, max_headers: int) -> None:
        self.max_headers = max_headers
        self.headers: list[tuple[bytes, bytes]] = []
        self.target = b""
        self.reason = b""
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self.headers
        headers.append((name, value))
        if len(headers) > self.max_headers:
            raise _TooManyHeaders  # stops llhttp; _feed_llhttp maps it to 431

    def on_headers_complete(self) -> None:
        self.complete = True


class HeadParser:
    """Parses one head incrementally; :meth:`feed` returns where the head ended.

    For requests the bytes are not kept (the reader re-serialises the head);
    for responses (``keep_raw``) they are, because the head is forwarded raw.
    """

    __slots__ = (
        "_callbacks",
        "_fed",
        "_is_response",
        "_keep_raw",
        "_limits",
        "_line",
        "_line_done",
        "_parser",
        "_raw",
        "_tail",
        "headers",
        "http_version",
        "method",
        "reason",
        "status",
        "target",
    )

    def __init__(self, limits: HttpLimits, *, response: bool) -> None:
        self._limits = limits
        self._is_response = response
        self._keep_raw = response
        self._fed = 0
        self._line = b""
        self._line_done = False
        self._tail = b""
        self._raw: list[bytes] = []
        self._callbacks: _Callbacks | None = None
        self._parser: httptools.HttpRequestParser | httptools.HttpResponseParser | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.method = b""
        self.target = b""
        self.http_version = b""
        self.status = 0
        self.reason = b""

    @property
    def started(self) -> bool:
        """At least one byte of this head has arrived."""
        return self._fed > 0 or bool(self._line)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of this head held so far (by us or inside llhttp's callbacks)."""
        return self._fed + len(self._line)

    @property
    def raw(self) -> bytes:
        """The head's bytes as received (responses only), once :meth:`feed` found its end."""
        return self._raw[0] if len(self._raw) == 1 else b"".join(self._raw)

    def feed(self, data: bytes, pos: int) -> int:
        """Consume head bytes from ``data[pos:]``.

        Returns the index just past the empty line that ends the head, or -1
        when all of ``data[pos:]`` was consumed and the head goes on. Raises
        :class:`MessageRejected`.
        """
        if not self._line_done:
            if PLAIN_ROAD and not self._fed and not self._line and type(data) is bytes:
                end = self._feed_whole(data, pos)
                if end >= 0:
                    return end
            pos = self._feed_start_line(data, pos)
            if pos < 0:
                return -1
        return self._feed_fields(data, pos)

    def _feed_whole(self, data: bytes, pos: int) -> int:
        """The plain road: the whole head is in ``data[pos:]`` and within the
        limits, and :func:`plain_head` reads it. Returns where it ended, or -1
        with nothing changed (llhttp's road then starts from the same place)."""
        limits = self._limits
        end = data.find(_END, pos, pos + limits.max_header_bytes)
        if end < 0:
            return -1
        end += 4
        if data.find(_CRLF, pos, end) - pos > limits.max_request_line_bytes:
            return -1
        parsed = plain_head(data, pos, end, self._is_response, limits.max_headers)
        if parsed is None:
            return -1
        first, second, version, headers = parsed
        if self._is_response:
            self.status = first  # type: ignore[assignment]  # an int for a response
            self.reason = second
            self._raw.append(data[pos:end])
        else:
            self.method = first  # type: ignore[assignment]  # bytes for a request
            self.target = second
        self.http_version = version
        self.headers = headers
        self._fed = end - pos
        self._line_done = True
        return end

    # Start line ------------------------------------------------------------------

    def _feed_start_line(self, data: bytes, pos: int) -> int:
        line_cap = self._limits.max_request_line_bytes + 2  # with its CRLF
        while True:
            budget = line_cap - len(self._line)
            newline = data.find(b"\n", pos, pos + budget)
            if newline < 0:
                chunk = data[pos : pos + budget]
                if LINE_FORBIDDEN_RE.search(chunk) is not None:
                    raise MessageRejected(400, "invalid byte in the start line")
                if len(chunk) >= budget:
                    raise MessageRejected(414, "start line too long")
                self._check_budget(len(chunk))
                self._line += chunk
                return -1
            line = self._line + data[pos : newline + 1]
            self._line = b""
            pos = newline + 1
            if line == _CRLF and not self._is_response:
                self._fed += 2  # RFC 9112 §2.2: ignore empty lines before a request line
                self._check_budget(0)
                continue
            self._start(line)
            return pos

    def _start(self, line: bytes) -> None:
        self._fed += len(line)
        self._check_budget(0)
        if not line.endswith(_CRLF):
            raise MessageRejected(400, "start line ends in a bare LF")
        if LINE_FORBIDDEN_RE.search(line, 0, len(line) - 2) is not None:
            raise MessageRejected(400, "invalid byte in the start line")
        callbacks = self._callbacks = _Callbacks(self._limits.max_headers)
        self.headers = callbacks.headers  # one list, filled by llhttp's callbacks
        parser: httptools.HttpRequestParser | httptools.HttpResponseParser
        if self._is_response:
            parser = httptools.HttpResponseParser(callbacks)
        else:
            parser = httptools.HttpRequestParser(callbacks)
        self._parser = parser
        try:
            parser.feed_data(line)
        except httptools.HttpParserInvalidMethodError:
            raise MessageRejected(*self._bad_method(line)) from None
        except httptools.HttpParserError as exc:
            status = self._bad_version_status(line)
            raise MessageRejected(status, f"bad start line: {exc}") from None
        version = parser.get_http_version()
        if version not in _SUPPORTED_VERSIONS:
            raise MessageRejected(self._bad_version_status(line), f"unsupported HTTP/{version}")
        self.http_version = version.encode()
        if isinstance(parser, httptools.HttpResponseParser):
            self.status = parser.get_status_code()
        else:
            self.method = parser.get_method()
        if self._keep_raw:
            self._raw.append(line)
        self._line_done = True
        self._tail = _CRLF

    def _bad_method(self, line: bytes) -> tuple[int, str]:
        match = REQUEST_LINE_RE.fullmatch(line)
        if match is not None and not self._is_response:
            return 501, "method not implemented"
        return 400, "invalid method"

    def _bad_version_status(self, line: bytes) -> int:
        """505 for a well-formed request line with another version, else 400."""
        if self._is_response:
            return 502
        match = REQUEST_LINE_RE.fullmatch(line)
        if match is not None and (match[2], match[3]) not in ((b"1", b"0"), (b"1", b"1")):
            return 505
        return 400

    # Header section --------------------------------------------------------------

    def _feed_fields(self, data: bytes, pos: int) -> int:
        budget = self._limits.max_header_bytes - self._fed
        tail = self._tail
        end = (tail + data[pos : pos + 3]).find(_END)
        if end >= 0:
            end = pos + end + 4 - len(tail)
        else:
            end = data.find(_END, pos, pos + budget)
            if end >= 0:
                end += 4
        if end < 0:
            if len(data) - pos >= budget:
                raise MessageRejected(431, "head too large")
            chunk = data[pos:] if pos else data
        else:
            if end - pos > budget:
                raise MessageRejected(431, "head too large")
            chunk = data[pos:end]
        self._fed += len(chunk)
        self._tail = chunk[-3:] if len(chunk) >= 3 else (tail + chunk)[-3:]
        if self._keep_raw:
            self._raw.append(chunk)
        self._feed_llhttp(chunk)
        callbacks = self._callbacks
        assert callbacks is not None
        if end < 0:
            if callbacks.complete:
                raise MessageRejected(400, "head ended without CRLFCRLF")
            return -1
        if not callbacks.complete:
            raise MessageRejected(400, "malformed head")
        self.target = callbacks.target
        self.reason = callbacks.reason
        self._parser = None
        return end

    def _feed_llhttp(self, chunk: bytes) -> None:
        parser = self._parser
        assert parser is not None
        try:
            parser.feed_data(chunk)
        except httptools.HttpParserUpgrade:
            pass  # llhttp stops after the head of an upgrade / CONNECT; so do we
        except httptools.HttpParserError as exc:
            if self._callbacks.complete and self.status == 101:  # type: ignore[union-attr]
                return  # llhttp pauses on any 101; the handshake check is ours (.websocket)
            if len(self.headers) > self._limits.max_headers:
                raise MessageRejected(431, "too many header fields") from None
            raise MessageRejected(400, f"malformed head: {exc}") from None

    def _check_budget(self, extra: int) -> None:
        if self._fed + len(self._line) + extra > self._limits.max_header_bytes:
            raise MessageRejected(431, "head too large")
