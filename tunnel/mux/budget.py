"""The per-connection error budget (PROTOCOL.md §8, IMPLEMENTATION.md §N8.1).

The HTTP/2 denial-of-service patterns (ping floods, settings floods, rapid
open-then-reset, empty frames, refused streams) are each legal once. What makes
them attacks is their rate. Each such event costs points from a token bucket;
when the bucket is empty the peer is sent GOAWAY(ENHANCE_YOUR_CALM) and cut off.
"""

from __future__ import annotations

import enum

from tunnel.mux.errors import CalmError


class Cost(enum.IntEnum):
    """Points each suspicious event costs."""

    PING = 1
    SETTINGS = 1
    EMPTY_DATA = 1
    REFUSED_STREAM = 1
    RESET_BEFORE_DATA = 1
    CONTROL = 1
    STALLED_STREAM = 5
    STREAM_ERROR = 10


class ErrorBudget:
    """A token bucket with ``capacity`` points refilled at ``refill_per_s``."""

    __slots__ = ("_last", "capacity", "refill_per_s", "tokens")

    def __init__(self, capacity: float, refill_per_s: float, now: float) -> None:
        self.capacity = capacity
        self.refill_per_s = refill_per_s
        self.tokens = capacity
        self._last = now

    def take(self, cost: float, now: float) -> bool:
        """Spend ``cost`` points if the bucket holds them; False, and nothing
        spent, if not (an allowance, unlike :meth:`charge`, never owes)."""
        self._refill(now)
        if self.tokens < cost:
            return False
        self.tokens -= cost
        return True

    def _refill(self, now: float) -> None:
        elapsed = now - self._last
        if elapsed > 0:
            self.tokens = min(self.capacity, self.tokens + elapsed * self.refill_per_s)
            self._last = now

    def charge(self, cost: float, now: float) -> bool:
        """Spend ``cost`` points; False once the budget is exhausted."""
        self._refill(now)
        self.tokens -= cost
        return self.tokens >= 0

    def spend(self, cost: float, now: float) -> None:
        """Spend ``cost`` points; :class:`CalmError` (a connection error) once
        the budget is exhausted."""
        if not self.charge(cost, now):
            raise CalmError("error budget exhausted")
