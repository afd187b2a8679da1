"""Is an HTTP/2 request's field block well formed? (RFC 9113 §8.2 and §8.3; pure)

A request whose fields HTTP/2 forbids is *malformed*: the edge answers it
with RST_STREAM(PROTOCOL_ERROR) (RFC 9113 §8.1.1), a stream error that ends
that request and no other. The checks, on the fields as HPACK decoded them:

- a field name is not empty and holds no octet in 0x00-0x20, 0x41-0x5a
  (uppercase), 0x7f-0xff, and no ``:`` but as the first octet of a
  pseudo-header (§8.2.1);
- a field value holds no NUL, CR or LF, and neither starts nor ends with a
  space or a tab (§8.2.1);
- no connection-specific field (``connection``, ``proxy-connection``,
  ``keep-alive``, ``transfer-encoding``, ``upgrade``), and ``te`` only as
  ``trailers`` (§8.2.2);
- pseudo-headers come before every other field, each at most once, only the
  request's own (``:method``, ``:scheme``, ``:authority``, ``:path``, and
  ``:protocol`` for an extended CONNECT, RFC 8441 §4), and none in trailers
  (§8.3);
- ``:method`` is there; a CONNECT carries neither ``:scheme`` nor ``:path``,
  an extended CONNECT and every other method both; ``:path`` is not empty
  (§8.3.1, §8.5);
- ``:authority`` or ``host`` is there, ``host`` at most once, and the two
  agree when both are (§8.3.1);
- every ``content-length`` is one or more digits, and all are the same
  number (RFC 9110 §8.6; ``h2``'s rule). :func:`check_request` returns it:
  the body must be exactly that long (RFC 9113 §8.1.1), which the request
  side (:mod:`edge.front_h2_requests`) counts as the DATA arrives.

What is left to the HTTP/1.1 rules the translated request then goes through
(:mod:`edge.h2_translate`): field names that are not tokens, control octets
in values, the target's form, the authority's syntax, framing.

Why not ``h2``'s own checks (``validate_inbound_headers``): they run seven
chained generators and test every octet of every name and value in Python.
On a browser-like request of ten fields (timeit, this machine) ``h2`` took
55-61 us to receive the HEADERS frame with its checks and 39-41 us without;
:func:`check_request` takes 4.4 us. ``make bench-edge-logic``: an HTTP/2
request's edge logic 148 -> 138 us. A hypothesis property
(``tests/property/test_h2_fields_props.py``) holds that both refuse exactly
the same field blocks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["CONNECTION_SPECIFIC", "MalformedFields", "check_request", "check_trailers"]

#: Fields HTTP/2 forbids in any field block (RFC 9113 §8.2.2).
CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"}
)
_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":authority", b":path", b":protocol"})

# Regular field names joined by LF: each one or more octets of 0x21-0x7e but
# 0x3a (":") and 0x41-0x5a (uppercase). A name holding an LF would split in
# two here, which the count of LFs catches.
_NAME = re.compile(rb"[!-9;-@\[-~]+")
_NAMES = re.compile(rb"[!-9;-@\[-~]+(?:\n[!-9;-@\[-~]+)*")
#: Octets as ints: ``int in bytes`` is one memchr, ``bytes in bytes`` a
#: general substring search (20 against 220 ns).
_CR, _NUL, _SPACE, _TAB = b"\r\0 \t"


class MalformedFields(ValueError):
    """A field block HTTP/2 forbids; ``reason`` says which rule it broke."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def check_request(fields: Sequence[tuple[bytes, bytes]]) -> int | None:
    """Raise :class:`MalformedFields` unless ``fields`` are a well-formed
    request field block (see the module docstring); return the body length
    its ``content-length`` declares, None without one."""
    pseudo: dict[bytes, bytes] = {}
    for name, value in fields:
        if name[:1] != b":":
            break
        if name not in _REQUEST_PSEUDO:
            raise MalformedFields(f"pseudo-header {name!r} is not a request's")
        if name in pseudo:
            raise MalformedFields(f"pseudo-header {name!r} repeated")
        pseudo[name] = value
    regular = fields[len(pseudo) :]
    names = [name for name, _ in regular]
    _check_names(names)
    _check_regular(regular, names)
    _check_values([value for _, value in fields])
    method = pseudo.get(b":method")
    if method is None:
        raise MalformedFields("no :method")
    has_protocol = b":protocol" in pseudo
    if method == b"CONNECT" and not has_protocol:
        if b":scheme" in pseudo or b":path" in pseudo:
            raise MalformedFields("CONNECT with :scheme or :path")
    else:
        if has_protocol and method != b"CONNECT":
            raise MalformedFields(":protocol without CONNECT")
        path = pseudo.get(b":path")
        if path is None or b":scheme" not in pseudo:
            raise MalformedFields("no :scheme or :path")
        if not path:
            raise MalformedFields("empty :path")
    authority = pseudo.get(b":authority")
    host = None
    if b"host" in names:
        if names.count(b"host") > 1:
            raise MalformedFields("host repeated")
        host = regular[names.index(b"host")][1]
    if authority is None:
        if host is None:
            raise MalformedFields("neither :authority nor host")
    elif host is not None and host != authority:
        raise MalformedFields(":authority and host differ")
    if b"content-length" in names:
        return _declared_length(regular)
    return None


def _declared_length(fields: Sequence[tuple[bytes, bytes]]) -> int | None:
    declared = None
    for name, value in fields:
        if name == b"content-length":
            try:
                if not value.isdigit():  # ASCII digits only, for bytes
                    raise ValueError
                length = int(value)  # ValueError past 4,300 digits
            except ValueError:
                raise MalformedFields(f"content-length {value[:20]!r}") from None
            if declared is not None and length != declared:
                raise MalformedFields("content-length values differ")
            declared = length
    return declared


def check_trailers(fields: Sequence[tuple[bytes, bytes]]) -> None:
    """Raise :class:`MalformedFields` unless ``fields`` are a well-formed
    trailer field block: a request's rules for regular fields, no pseudo-header."""
    names = [name for name, _ in fields]
    for name in names:
        if name[:1] == b":":
            raise MalformedFields(f"pseudo-header {name!r} in trailers")
    _check_names(names)
    _check_regular(fields, names)
    _check_values([value for _, value in fields])


def _check_names(names: list[bytes]) -> None:
    """Regular field names: a pseudo-header among them is out of place."""
    if not names:
        return
    joined = b"\n".join(names)
    if _NAMES.fullmatch(joined) is None or joined.count(b"\n") != len(names) - 1:
        bad = next(n for n in names if _NAME.fullmatch(n) is None)
        if bad[:1] == b":":
            raise MalformedFields(f"pseudo-header {bad!r} after a regular field")
        raise MalformedFields(f"field name {bad!r}")


def _check_regular(fields: Sequence[tuple[bytes, bytes]], names: list[bytes]) -> None:
    if not CONNECTION_SPECIFIC.isdisjoint(names):
        bad = next(n for n in names if n in CONNECTION_SPECIFIC)
        raise MalformedFields(f"connection-specific field {bad!r}")
    if b"te" in names:
        for name, value in fields:
            if name == b"te" and value.lower() != b"trailers":
                raise MalformedFields("te other than trailers")


def _check_values(values: list[bytes]) -> None:
    if not values:
        return
    # Joined by LF once no value holds one, a value's first octet follows an
    # LF (or starts the whole) and its last precedes one (or ends it).
    joined = b"\n".join(values)
    if joined.count(b"\n") != len(values) - 1 or _CR in joined or _NUL in joined:
        raise MalformedFields("NUL, CR or LF in a field value")
    for value in values:  # (four substring searches of the joined values cost more)
        if value and (
            value[0] == _SPACE or value[0] == _TAB or value[-1] == _SPACE or value[-1] == _TAB
        ):
            raise MalformedFields("field value starts or ends with whitespace")
