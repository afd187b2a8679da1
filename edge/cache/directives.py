"""Reading the fields a cache decides by: pure functions of field values.

- :func:`parse_directives` reads ``Cache-Control`` (RFC 9111 §5.2), and the
  targeted fields ``CDN-Cache-Control`` (RFC 9213) and ``Surrogate-Control``
  (W3C Edge Architecture), into :class:`Directives`: names lowercased, values
  unquoted, a quoted string never read as a directive
  (``extension="max-age=1"`` has one directive, ``extension``), the first
  occurrence of a directive winning (§4.2.1 allows "the first").
- Delta-seconds (§1.2.2): digits only, leading zeros allowed, capped at
  2^31; anything else (``-1``, ``'3600'``, ``1.5``) is *invalid*, which makes
  a lifetime 0: the response is stale (§4.2.1).
- ``Age`` (§5.1): exactly one field line of digits; anything else (two lines,
  ``0, 0``, ``7200.0``, a parameter) is invalid, and an invalid ``Age`` makes
  the response stale: it may be very old (cache-tests ``age-parse-*``).
- HTTP dates (RFC 9110 §5.6.7): the three formats; an invalid ``Expires``
  means "already expired" (§5.3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

__all__ = [
    "DELTA_SECONDS_CAP",
    "INVALID",
    "Directives",
    "delta_seconds",
    "field_values",
    "http_date",
    "parse_age",
    "parse_directives",
    "split_list",
]

DELTA_SECONDS_CAP = 2**31
"""RFC 9111 §1.2.2: a larger delta-seconds is taken as this."""

INVALID = -1
"""What :func:`delta_seconds` returns for a value that is not delta-seconds."""

_DIGITS = re.compile(rb"[0-9]+")
_DIRECTIVE = re.compile(
    rb'[ \t]*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)[ \t]*(?:=[ \t]*("(?:[^"\\]|\\.)*"|[^,;"]*))?[ \t]*'
)
_TARGET = re.compile(rb"[ \t]*;[ \t]*[^,]*")


def field_values(headers: object, name: bytes) -> list[bytes]:
    """The values of field ``name`` (lowercase) in a ``(name, value)`` sequence."""
    return [value for field, value in headers if field == name]  # type: ignore[attr-defined]


def split_list(values: list[bytes]) -> list[bytes]:
    """A list-based field's members (RFC 9110 §5.6.1), lowercased, empties dropped."""
    out = []
    for value in values:
        for member in value.split(b","):
            member = member.strip(b" \t").lower()
            if member:
                out.append(member)
    return out


def delta_seconds(value: bytes | None) -> int:
    """``value`` as delta-seconds (capped), or :data:`INVALID`."""
    if value is None or _DIGITS.fullmatch(value) is None:
        return INVALID
    return min(int(value), DELTA_SECONDS_CAP)


@dataclass(frozen=True, slots=True)
class Directives:
    """Directives of one field (or of several lines of it), first occurrence kept."""

    values: dict[bytes, bytes | None]
    """Directive name (lowercase) → its value (unquoted), or None without one."""

    def __contains__(self, name: bytes) -> bool:
        return name in self.values

    def seconds(self, name: bytes) -> int | None:
        """The delta-seconds of ``name``: None when absent, :data:`INVALID` when malformed."""
        if name not in self.values:
            return None
        return delta_seconds(self.values[name])

    def __bool__(self) -> bool:
        return bool(self.values)


def parse_directives(values: list[bytes], *, targeted: bool = False) -> Directives:
    """The directives of a ``Cache-Control``-like field's lines.

    ``targeted``: a ``Surrogate-Control`` field, where ``max-age=60;token``
    is for the device named ``token`` (W3C Edge Architecture §2.2), so not
    for this cache: such directives are left out."""
    out: dict[bytes, bytes | None] = {}
    for line in values:
        pos, size = 0, len(line)
        while pos < size:
            match = _DIRECTIVE.match(line, pos)
            if match is None:  # garbage up to the next comma
                comma = line.find(b",", pos)
                pos = size if comma < 0 else comma + 1
                continue
            name, value = match[1].lower(), match[2]
            pos = match.end()
            other_device = False
            if pos < size and line[pos : pos + 1] == b";":
                target = _TARGET.match(line, pos)
                pos = target.end() if target is not None else size
                other_device = targeted
            if value is not None and value[:1] == b'"':
                value = re.sub(rb"\\(.)", rb"\1", value[1:-1])
            elif value is not None:
                value = value.strip(b" \t")
            if not other_device and name not in out:
                out[name] = value
            comma = line.find(b",", pos)
            if comma < 0:
                break
            pos = comma + 1
    return Directives(out)


def parse_age(values: list[bytes]) -> int | None:
    """The ``Age`` in seconds: None without one, :data:`INVALID` when malformed."""
    if not values:
        return None
    if len(values) > 1:
        return INVALID
    return delta_seconds(values[0].strip(b" \t"))


def http_date(value: bytes | None) -> float | None:
    """An HTTP date as a POSIX timestamp, or None when absent or invalid."""
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value.decode("latin-1"))
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:  # asctime (RFC 9110 §5.6.7): always GMT
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
