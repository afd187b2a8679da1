"""Pure decisions of the tunnel layer (STYLE.md §11): no I/O, no clock, no
global randomness, so each can be tested exhaustively without sockets.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with *full jitter* (AWS architecture blog, "Exponential
    Backoff And Jitter"): the delay before retry ``attempt`` (0-based) is uniform
    in ``[0, min(cap_s, base_s * 2**attempt)]``. Full jitter spreads a fleet of
    edges that lost their origin at the same moment, so they do not reconnect in
    lock-step and knock it over again."""

    base_s: float = 0.1
    cap_s: float = 10.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        ceiling = min(self.cap_s, self.base_s * (2 ** min(attempt, 62)))
        return rng.uniform(0.0, ceiling)


class Candidate(Protocol):
    """What :func:`choose_connection` needs to know of a connection."""

    @property
    def can_open_stream(self) -> bool: ...

    @property
    def open_streams(self) -> int: ...

    @property
    def warming(self) -> bool: ...


C = TypeVar("C", bound=Candidate)


def choose_connection(candidates: Sequence[C]) -> C | None:
    """The usable connection with the fewest open streams (first on ties), or
    None; a warm one over one still warming (tunnel.aio.warmup), whatever
    their loads: a stream on a warming connection may queue behind its
    padding and crosses a window still growing. Least-streams keeps the
    pool's connections evenly loaded, so no single TCP connection's
    congestion window carries most of the traffic."""
    best: C | None = None
    for candidate in candidates:
        if not candidate.can_open_stream:
            continue
        if (
            best is None
            or (best.warming and not candidate.warming)
            or (best.warming == candidate.warming and candidate.open_streams < best.open_streams)
        ):
            best = candidate
    return best


class Pacer:
    """Spaces events to ``rate_per_s`` on average, letting ``burst`` of them
    through at once: the virtual-scheduling form of a token bucket (GCRA, ITU-T
    I.371). :meth:`delay` says how long the event arriving at ``now`` must
    wait, and books its place; time is an argument, so the schedule can be
    tested without a clock."""

    __slots__ = ("_interval", "_tat", "_tolerance")

    def __init__(self, rate_per_s: float, burst: int) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a pacer needs a positive rate and a burst of at least 1")
        self._interval = 1.0 / rate_per_s
        self._tolerance = (burst - 1) * self._interval
        self._tat = float("-inf")  # when the bucket is next empty again

    def delay(self, now: float) -> float:
        """Seconds the event arriving at ``now`` waits (0 within the burst)."""
        tat = max(self._tat, now)
        self._tat = tat + self._interval
        return max(0.0, tat - self._tolerance - now)
