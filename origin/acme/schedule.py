"""When to renew, and when to try again: pure decisions (time is a parameter,
randomness is given), tested without a CA.

- Without renewal information, a certificate is renewed once
  ``fraction`` (2/3 by default) of its lifetime has passed: day 60 of 90,
  which leaves 30 days, and so weeks of retries, before it expires.
- With ARI (RFC 9773 §4.2), the CA's suggested window wins: the client picks
  a time in it (the ``acme`` package picks it uniformly at random, which
  spreads a fleet's renewals); a window that has already begun means now.
- A failed attempt is retried after full-jitter backoff
  (:class:`tunnel.policy.Backoff`), never later than a tenth of the time
  left before expiry, so a long cap cannot make the last attempts too rare.
"""

from __future__ import annotations

import random

from tunnel.policy import Backoff

__all__ = ["next_attempt", "renew_at"]


def renew_at(
    not_before: float, not_after: float, fraction: float, ari_time: float | None = None
) -> float:
    """When a certificate valid ``not_before``..``not_after`` is due for renewal."""
    if ari_time is not None:
        return min(ari_time, not_after)
    return not_before + fraction * (not_after - not_before)


def next_attempt(
    failures: int, now: float, not_after: float | None, backoff: Backoff, rng: random.Random
) -> float:
    """When to try again after the ``failures``-th failure in a row (1-based)."""
    delay = backoff.delay(failures - 1, rng)
    if not_after is not None and not_after > now:
        delay = min(delay, max(1.0, (not_after - now) / 10))
    return now + delay
