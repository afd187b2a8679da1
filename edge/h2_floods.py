"""How much of each cheap-to-send, costly-to-answer HTTP/2 frame one client
connection may send (pure): the bounds on the known floods.

Counted per connection over :data:`FLOOD_WINDOW_S`; past a bound the front
end answers GOAWAY(ENHANCE_YOUR_CALM) and closes the connection
(:mod:`edge.front_h2`). The bounds are generous for browsers (a tab closing
resets its streams) and far below what the attacks need:

- ``resets``: streams the client resets, streams it makes us reset (a
  malformed request, a stream past the concurrency limit, a frame ``h2``
  answers with RST_STREAM): rapid reset, CVE-2023-44487, and MadeYouReset,
  CVE-2025-8671;
- ``settings``, ``pings``, ``priority``: SETTINGS, PING and PRIORITY floods;
- ``empty``: DATA frames that carry nothing and do not end their stream.
"""

from __future__ import annotations

__all__ = ["FLOOD_WINDOW_S", "LIMITS", "FloodCounters"]

#: Counters start again from zero every this many seconds.
FLOOD_WINDOW_S = 10.0
#: What one connection may send per window, by kind.
LIMITS = {"resets": 400, "settings": 100, "pings": 100, "priority": 2000, "empty": 1000}


class FloodCounters:
    """One connection's counts in the current window.

    Invariant: each count is the number of frames of its kind since
    ``window_start``, which is at most :data:`FLOOD_WINDOW_S` old once
    :meth:`roll` has run."""

    __slots__ = ("_counts", "window_start")

    def __init__(self, now: float) -> None:
        self._counts = dict.fromkeys(LIMITS, 0)
        self.window_start = now

    def over(self, kind: str) -> bool:
        """Count one frame of ``kind``: is the connection now past its bound?"""
        counts = self._counts
        counts[kind] += 1
        return counts[kind] > LIMITS[kind]

    def roll(self, now: float) -> None:
        """Start a new window once the current one is :data:`FLOOD_WINDOW_S` old."""
        if now - self.window_start >= FLOOD_WINDOW_S:
            self.window_start = now
            self._counts = dict.fromkeys(LIMITS, 0)
