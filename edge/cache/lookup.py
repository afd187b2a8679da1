"""What the cache knows of one request while it is answered: shared by
:mod:`edge.cache.cache` and the clients it puts in front of an exchange
(:mod:`edge.cache.fill`), so neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass

from edge.cache.entry import StoredResponse
from edge.cache.keys import CacheKey
from edge.cache.policy import RequestFacts

__all__ = ["CacheCounters", "Lookup"]


@dataclass(slots=True)
class CacheCounters:
    """What the metrics and the status page show (monotonic counts)."""

    hits: int = 0
    misses: int = 0
    stale_served: int = 0
    revalidated: int = 0
    bytes_served: int = 0
    collapsed_waits: int = 0
    stored: int = 0
    passes: int = 0
    purged: int = 0
    shared: int = 0
    """Responses found in the shared tier (another worker stored them)."""


@dataclass(slots=True)
class Lookup:
    """One request as the cache saw it: what its fill needs to know."""

    key: CacheKey | None
    request: RequestFacts
    fields: tuple[tuple[bytes, bytes], ...]
    coding: str | None
    fwd: str
    head_only: bool
    frame_h1: bool
    """The front end frames the body itself (HTTP/1.1): chunks are the fill's to write."""
    http10: bool
    stale: StoredResponse | None = None
    """The stored response being revalidated (None: a miss)."""
    validating: bool = False
    """The request went up with the stored response's validators."""
    bypass: bool = False
    why_not_stored: str | None = None
