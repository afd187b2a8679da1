"""One stored response: what a hit is served from.

A :class:`StoredResponse` keeps the response as the origin meant it for
every client (RFC 9111 §3.1): its status, its fields less those that are
about one connection or one user (:data:`NOT_STORED`), its whole body
(identity, as received: chunk framing removed), and what the cache decides
by: when it was requested and received, its corrected initial age and
freshness lifetime (:mod:`edge.cache.freshness`), the request values of the
fields its ``Vary`` names, its purge tags. ``encoded`` holds the body
compressed, one entry per coding, each made once (:mod:`edge.cache.compress`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from edge.cache.freshness import ResponseFacts

__all__ = ["ENTRY_OVERHEAD_BYTES", "NOT_STORED", "PlainHead", "StoredResponse", "VaryValues"]

NOT_STORED = frozenset(
    {
        # RFC 9111 §3.1: about the connection, or the proxy's own authentication
        b"connection", b"keep-alive", b"proxy-connection", b"te", b"transfer-encoding",
        b"upgrade", b"trailer", b"proxy-authenticate", b"proxy-authentication-info",
        b"proxy-authorization",
        # about the one user who asked (never handed to another: DESIGN principle 16)
        b"set-cookie", b"set-cookie2", b"x-request-id",
        # computed per hit, or consumed by this cache (W3C Edge Architecture)
        b"age", b"cache-status", b"surrogate-control",
    }
)  # fmt: skip
"""Lowercase names of the response fields a stored response never keeps."""

ENTRY_OVERHEAD_BYTES = 512
"""What one entry costs beyond its octets (the object, its lists and tuples),
counted against the byte limit so that many small entries cannot overrun it."""

VaryValues = tuple[tuple[bytes, bytes | None], ...]
"""(field name, normalised request value or None when absent) per name ``Vary`` lists."""


class PlainHead(NamedTuple):
    """The fixed part of a stored response's whole reply, built at its first
    such hit (edge.cache.responses.plain_head)."""

    status_line: bytes
    lines: bytes
    """Its field lines, ``Content-Length`` last, each ending in CRLF."""
    fields: tuple[tuple[bytes, bytes], ...]


@dataclass(eq=False, slots=True)
class StoredResponse:
    key: str
    """The primary cache key (:mod:`edge.cache.keys`)."""
    url: str
    """``scheme://authority/path?query`` as requested (purge by URL and prefix)."""
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    """Stored fields, lowercase names, in the origin's order."""
    body: bytes
    vary: VaryValues
    request_time: float
    response_time: float
    initial_age: float
    lifetime: float
    facts: ResponseFacts
    tags: frozenset[str] = frozenset()
    encoded: dict[str, bytes] = field(default_factory=dict)
    hits: int = 0
    plain_heads: dict[str, PlainHead] = field(default_factory=dict)
    """The fixed part of its whole reply's head per coding ("" for none), each
    built at its first such hit (edge.cache.responses); emptied whenever its
    fields change."""
    compressible: bool | None = None
    """May the edge compress it (edge.cache.compress.compressible), once
    asked; None again whenever its fields change."""

    @property
    def size(self) -> int:
        """Octets counted against the store's limit."""
        fields = sum(len(name) + len(value) for name, value in self.headers)
        encoded = sum(len(data) for data in self.encoded.values())
        return (
            ENTRY_OVERHEAD_BYTES + len(self.key) + len(self.url) + fields + len(self.body) + encoded
        )

    def age(self, now: float) -> float:
        """The current age (RFC 9111 §4.2.3) at ``now`` (seconds since the epoch)."""
        return self.initial_age + max(0.0, now - self.response_time)

    def ttl(self, now: float) -> float:
        """Seconds of freshness left (negative once stale)."""
        return self.lifetime - self.age(now)

    def field(self, name: bytes) -> bytes | None:
        for stored, value in self.headers:
            if stored == name:
                return value
        return None
