"""What the cache knows of one request while it is answered: shared by
:mod:`edge.cache.cache` and the clients it puts in front of an exchange
(:mod:`edge.cache.fill`), so neither imports the other for it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from edge.cache.entry import StoredResponse
from edge.cache.keys import CacheKey
from edge.cache.policy import RequestFacts

__all__ = ["CacheCounters", "Lookup", "PassMarks"]


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


class PassMarks:
    """Keys whose last response could not be stored, until when (hit-for-pass):
    requests for them go to the origin without waiting on each other. At most
    ``limit`` keys, the oldest marks dropped first."""

    __slots__ = ("_limit", "_marks", "seconds")

    def __init__(self, seconds: float, limit: int = 10_000) -> None:
        self.seconds = seconds
        self._limit = limit
        self._marks: OrderedDict[str, float] = OrderedDict()

    def passing(self, key: str, now: float) -> bool:
        until = self._marks.get(key)
        if until is None:
            return False
        if until < now:
            del self._marks[key]
            return False
        return True

    def mark(self, key: str, now: float) -> bool:
        """Mark ``key`` for ``seconds`` from ``now``; False when marks are off
        (``seconds`` 0)."""
        if self.seconds <= 0:
            return False
        self.mark_until(key, now + self.seconds)
        return True

    def mark_until(self, key: str, until: float) -> None:
        """Mark ``key`` until ``until`` (a mark another worker made: edge.cache.shared)."""
        marks = self._marks
        marks[key] = until
        marks.move_to_end(key)
        while len(marks) > self._limit:
            marks.popitem(last=False)
