"""Hand-rolled parsers for the numbers, lists and tokens HTTP/1.1 puts on the wire.

Why not ``int()``: it accepts ``+5``, `` 5``, ``1_0``, non-ASCII digits and
unbounded lengths. Every such leniency is a request-smuggling lever when two
parsers on the path disagree about a length (RFC 9112 §11.2). These functions
accept exactly the ABNF and nothing else; the loops run over at most a few
dozen digits, never over body bytes. Patterns are compiled once and run in C.
"""

from __future__ import annotations

import re

DIGITS = b"0123456789"
HEXDIGITS = b"0123456789abcdefABCDEF"

MAX_CONTENT_LENGTH_DIGITS = 18
"""At most 18 decimal digits: every such value fits in a signed 64-bit integer,
so no parser downstream (Node.js, llhttp) can overflow on a value we accepted."""

_HEX_VALUES = [-1] * 256
for _i, _c in enumerate("0123456789abcdef"):
    _HEX_VALUES[ord(_c)] = _i
    _HEX_VALUES[ord(_c.upper())] = _i
del _i, _c

_TCHAR = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
_TOKEN = _TCHAR + rb"+"
_QUOTED_STRING = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'

TOKEN_RE = re.compile(_TOKEN)
"""RFC 9110 §5.6.2 token (use ``fullmatch``)."""

CHUNK_EXTENSION_RE = re.compile(
    rb"(?:[ \t]*;[ \t]*"
    + _TOKEN
    + rb"(?:[ \t]*=[ \t]*(?:"
    + _TOKEN
    + rb"|"
    + _QUOTED_STRING
    + rb"))?)*"
)
"""RFC 9112 §7.1.1 chunk-ext (use ``fullmatch``)."""

TRAILER_SECTION_RE = re.compile(rb"(?:" + _TOKEN + rb":[\t \x21-\x7e\x80-\xff]*\r\n)*")
"""Field lines each ending in CRLF (RFC 9112 §7.1.2); obs-fold, bare LF, NUL or
CR inside a value do not match. Written so that it cannot backtrack."""

HOST_RE = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]+)(?::[0-9]{0,5})?")
"""RFC 9110 §7.2 Host: ``uri-host [ ":" port ]`` (use ``fullmatch``). No userinfo,
no whitespace, no path characters."""

REQUEST_LINE_RE = re.compile(rb"(" + _TOKEN + rb") +[^ ]+ +HTTP/([0-9])\.([0-9])\r\n")
"""The shape of a request line, used only to choose the status of a rejection
(501 for an unknown method, 505 for an unsupported version); llhttp validates."""

LINE_FORBIDDEN_RE = re.compile(rb"[^\x21-\x7e \r\n]")
"""A byte that can never appear in a request or status line (CTLs, obs-text):
seeing one rejects the line at once, before waiting for its end."""

REQUEST_ID_RE = re.compile(rb"[\x21-\x7e]{1,200}")
"""A client-supplied X-Request-Id we are willing to keep (trusted proxies only):
visible ASCII, bounded, so it cannot inject into logs."""


def parse_decimal(text: bytes, max_digits: int) -> int | None:
    """``1*DIGIT`` with at most ``max_digits`` digits, or None. No sign, no spaces."""
    if not text or len(text) > max_digits or text.translate(None, DIGITS):
        return None
    value = 0
    for byte in text:
        value = value * 10 + (byte - 48)
    return value


def parse_hex(text: bytes, max_digits: int) -> int | None:
    """``1*HEXDIG`` with at most ``max_digits`` digits, or None. No ``0x``, no spaces."""
    if not text or len(text) > max_digits or text.translate(None, HEXDIGITS):
        return None
    value = 0
    for byte in text:
        value = (value << 4) | _HEX_VALUES[byte]
    return value


def strip_ows(value: bytes) -> bytes:
    """Remove optional whitespace around a field value (RFC 9110 §5.5).

    llhttp drops leading OWS but keeps trailing OWS in the values it reports.
    """
    return value.strip(b" \t")


def split_tokens(values: list[bytes]) -> list[bytes]:
    """Elements of comma-separated list fields, lowercased, empties dropped (RFC 9110 §5.6.1)."""
    tokens = []
    for value in values:
        for item in value.split(b","):
            item = item.strip(b" \t")
            if item:
                tokens.append(item.lower())
    return tokens
