"""What ``consistent_hash`` hashes: the pool's ``hash_key`` read from a request.

``client_ip`` (the default: the client address from the stream's metadata),
``path`` (the target without its query), ``header:<name>`` or
``cookie:<name>``. Headers and cookies are in the request head, which arrives
right behind the stream's OPEN as its first octets (the stream's reading is
paused until a backend is chosen, so they wait in the stream, unread):
:func:`key_for` reads them there. A request without the header or cookie
falls back to the client address, so it still goes somewhere stable.

Pure: the caller passes the head octets it has.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HashKey", "key_for", "needs_head"]

#: Heads are parsed up to this many octets (the edge's own limit is 64 KiB).
MAX_HEAD = 64 * 1024


@dataclass(frozen=True, slots=True)
class HashKey:
    kind: str  # client_ip, path, header, cookie
    name: bytes = b""

    @classmethod
    def parse(cls, spec: str) -> HashKey:
        """``client_ip``, ``path``, ``header:<name>`` or ``cookie:<name>``;
        ValueError for anything else."""
        if spec in ("client_ip", "path"):
            return cls(spec)
        kind, _, name = spec.partition(":")
        if kind in ("header", "cookie") and name and name.isascii() and " " not in name:
            return cls(kind, name.lower().encode() if kind == "header" else name.encode())
        raise ValueError(f"hash_key {spec!r}: use client_ip, path, header:<name> or cookie:<name>")


def needs_head(key: HashKey) -> bool:
    return key.kind in ("header", "cookie")


def key_for(key: HashKey, client_ip: str, target: str | None, head: bytes) -> bytes:
    """The octets to hash for this request (the client address when the key
    is missing from it)."""
    fallback = client_ip.encode()
    if key.kind == "client_ip":
        return fallback
    if key.kind == "path":
        return (target or "").partition("?")[0].encode() or fallback
    end = head.find(b"\r\n\r\n", 0, MAX_HEAD)
    lines = head[: end if end >= 0 else MAX_HEAD].split(b"\r\n")[1:]
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name = name.strip().lower()
        if key.kind == "header" and name == key.name:
            return value.strip() or fallback
        if key.kind == "cookie" and name == b"cookie":
            for pair in value.split(b";"):
                cookie, equals, cookie_value = pair.strip().partition(b"=")
                if equals and cookie == key.name:
                    return cookie_value or fallback
    return fallback
