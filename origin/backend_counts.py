"""One backend's per-stream counts between two publishes (the origin's hot path).

The dispatcher adds a finished stream's facts here, to plain numbers on the
backend's own object; the publisher (:mod:`origin.publisher`) hands them to
the backend's Prometheus children once a second. Why not the worker's
:class:`~geoedge.metrics.Tally`: six of its calls per stream (streams, reused,
bytes both ways, two histograms) were ~20,000 machine instructions, 6% of the
origin's keep-alive request (``make bench-hop-instructions``); here the key is
the object the dispatcher already holds, and a stream is a few additions.
Once a second they go to the Tally, which writes them to Prometheus.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from geoedge.metrics import Tally

__all__ = ["BackendCounts"]


class BackendCounts:
    """Sums since the last :meth:`publish`; each histogram as per-bucket counts
    (one per upper bound, ``+Inf`` last) followed by the sum of the values."""

    __slots__ = (
        "_first_byte_bounds",
        "_stream_bounds",
        "bytes_down",
        "bytes_up",
        "first_byte",
        "reused",
        "stream_seconds",
        "streams",
    )

    def __init__(self, first_byte_histogram: Any, stream_histogram: Any) -> None:
        self._first_byte_bounds: list[float] = list(first_byte_histogram._upper_bounds)
        self._stream_bounds: list[float] = list(stream_histogram._upper_bounds)
        self.streams = 0
        self.reused = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.first_byte = [0.0] * (len(self._first_byte_bounds) + 1)
        self.stream_seconds = [0.0] * (len(self._stream_bounds) + 1)

    def finished(self, bytes_up: int, bytes_down: int, first_byte_s: float | None,
                 stream_s: float) -> None:  # fmt: skip
        """A stream that had this backend ended (``first_byte_s`` None: no
        response octet came)."""
        self.bytes_up += bytes_up
        self.bytes_down += bytes_down
        if first_byte_s is not None:
            counts = self.first_byte
            counts[bisect_left(self._first_byte_bounds, first_byte_s)] += 1
            counts[-1] += first_byte_s
        counts = self.stream_seconds
        counts[bisect_left(self._stream_bounds, stream_s)] += 1
        counts[-1] += stream_s

    def publish(self, tally: Tally, streams: Any, reused: Any, bytes_up: Any,
                bytes_down: Any, first_byte: Any, stream_seconds: Any) -> None:  # fmt: skip
        """Hand the sums to ``tally`` for the backend's children (a counter
        each, two histograms) and start again from zero."""
        counters = ((streams, self.streams), (reused, self.reused),
                    (bytes_up, self.bytes_up), (bytes_down, self.bytes_down))  # fmt: skip
        for child, amount in counters:
            if amount:
                tally.inc(child, amount)
        self.streams = self.reused = self.bytes_up = self.bytes_down = 0
        for child, counts in ((first_byte, self.first_byte), (stream_seconds, self.stream_seconds)):
            if any(counts[:-1]):
                tally.add_buckets(child, None, counts)
                counts[:] = [0.0] * len(counts)
