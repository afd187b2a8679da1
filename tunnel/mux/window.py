"""Flow-control windows: receive-side credit with auto-tuning, and RTT.

Algorithm (after quic-go's ``flowcontrol`` and Chromium QUIC's auto-tuning):

- A receive window of ``size`` octets lets the peer send up to
  ``consumed + size``; the peer's limit is ``limit``.
- When the application has consumed at least half the window beyond the last
  announced limit, we announce a new limit (a WINDOW_UPDATE).
- Auto-tuning works in *epochs*: an epoch starts at each announcement. If the
  reader consumed ``fraction`` of the window in less than ``2 * fraction * rtt``
  — i.e. the window, not the reader, was the bottleneck — the window doubles,
  up to ``max_size``. A window-bound flow consumes a window per RTT, so it
  always passes; a reader-bound flow (a busy CPU, a slow client) consumes
  half a window in ``size / 2 / rate`` and passes only while the window is
  below the bandwidth-delay product. quic-go uses ``4 *``, which on a
  reader-bound loopback link grew windows to 4 MiB of pure queue (~4 ms ahead
  of every small response in ``make bench-tunnel``).
  ``rtt`` is the connection's *minimum* RTT, not the
  smoothed one: under load the smoothed RTT includes the queue that a large
  window itself builds, and tuning on it grows the window without end (the
  bufferbloat loop; measured: a 16 MiB window and 26 ms of queueing on loopback
  in ``make bench-tunnel``). The minimum is the path's propagation delay.
  A reader that lags never grows its window, so a slow reader's memory stays
  at the window it has; no stream ever exceeds the cap.
- Bursts fool the epoch test: a 256 KiB TLS read consumed in one go looks
  infinitely fast. So growth also needs a *delay* signal (as in delay-based
  congestion control, Vegas/LEDBAT): the latest RTT sample must show no
  standing queue (``latest <= 2 * min + QUEUE_SLACK_S``). When it does show
  one, the window is larger than the path needs and halves (down to its
  floor). The session sends measurement PINGs while data flows, so the delay
  signal is fresh.
- New streams start from what the connection has learned: the session keeps
  the largest window any stream reached and seeds new streams with it
  (:meth:`tunnel.mux.session.Session.learned_stream_window`), because every
  stream here is new (one per client connection) and would otherwise re-learn
  the path from a small default each time (gRPC's BDP estimator needs several
  requests to converge).
"""

from __future__ import annotations

from tunnel.mux.errors import FlowControlError

#: Queueing delay tolerated beyond twice the minimum RTT before a window shrinks
#: instead of growing; small against human latency, large against scheduler jitter.
QUEUE_SLACK_S = 0.001


class ReceiveWindow:
    """Receive-side credit of one stream (or of the connection)."""

    __slots__ = (
        "_epoch_start_offset",
        "_epoch_start_time",
        "consumed",
        "limit",
        "max_size",
        "min_size",
        "received",
        "size",
    )

    def __init__(self, size: int, max_size: int, now: float, min_size: int = 0) -> None:
        self.size = size
        self.max_size = max(size, max_size)
        self.min_size = min(size, min_size) if min_size else size
        self.limit = size
        self.received = 0
        self.consumed = 0
        self._epoch_start_time = now
        self._epoch_start_offset = 0

    def receive(self, n: int) -> None:
        """Account ``n`` octets from the peer; more than granted is a connection
        FLOW_CONTROL_ERROR (PROTOCOL.md §7.2)."""
        self.received += n
        if self.received > self.limit:
            raise FlowControlError(
                f"peer sent {self.received - self.limit} octets beyond the window"
            )

    @property
    def unconsumed(self) -> int:
        """Octets received but not yet consumed by the application."""
        return self.received - self.consumed

    def consume(self, n: int, now: float, rtt: RttEstimator | None = None) -> int:
        """The application consumed ``n`` octets. Returns the increment to
        announce in a WINDOW_UPDATE, or 0 when none is due yet."""
        self.consumed += n
        new_limit = self.consumed + self.size
        if new_limit - self.limit < self.size // 2:
            return 0
        if rtt is not None:
            self._tune(now, rtt)
        new_limit = self.consumed + self.size
        increment = max(0, new_limit - self.limit)
        self.limit += increment
        return increment

    def _tune(self, now: float, rtt: RttEstimator) -> None:
        consumed_in_epoch = self.consumed - self._epoch_start_offset
        min_rtt, latest = rtt.min, rtt.latest
        if min_rtt and latest is not None:
            if latest > 2.0 * min_rtt + QUEUE_SLACK_S:
                self.size = max(self.min_size, self.size // 2)
            elif self.size < self.max_size:
                fraction = consumed_in_epoch / self.size
                if now - self._epoch_start_time < 2.0 * fraction * min_rtt:
                    self.size = min(2 * self.size, self.max_size)
        self._epoch_start_time = now
        self._epoch_start_offset = self.consumed

    def raise_size(self, size: int) -> int:
        """Grow the window to at least ``size`` (capped) now; returns the
        increment to announce, or 0."""
        size = min(size, self.max_size)
        if size <= self.size:
            return 0
        self.size = size
        new_limit = self.consumed + size
        increment = max(0, new_limit - self.limit)
        self.limit += increment
        return increment


class RttEstimator:
    """Smoothed RTT as in RFC 6298 (alpha 1/8), plus the minimum seen."""

    __slots__ = ("latest", "min", "smoothed")

    def __init__(self) -> None:
        self.smoothed: float | None = None
        self.min: float | None = None
        self.latest: float | None = None

    def add_sample(self, rtt: float) -> None:
        rtt = max(rtt, 0.0)
        self.latest = rtt
        self.min = rtt if self.min is None else min(self.min, rtt)
        self.smoothed = rtt if self.smoothed is None else 0.875 * self.smoothed + 0.125 * rtt
