"""One backend's per-stream counts between two publishes (the origin's hot path).

The dispatcher adds a finished stream's facts here, to plain numbers on the
backend's own object; the publisher (:mod:`origin.publisher`) hands them to
the backend's Prometheus children once a second. Why not the worker's
:class:`~geoedge.metrics.Tally`: six of its calls per stream (streams, reused,
bytes both ways, two histograms) were ~20,000 machine instructions, 6% of the
origin's keep-alive request (``make bench-hop-instructions``); here the key is
the object the dispatcher already holds, and a stream is a few additions.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

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

    def publish(self, streams: Any, reused: Any, bytes_up: Any, bytes_down: Any,
                first_byte: Any, stream_seconds: Any) -> None:  # fmt: skip
        """Add the sums to the backend's children (a counter each, two
        histograms) and start again from zero."""
        if self.streams:
            streams.inc(self.streams)
            self.streams = 0
        if self.reused:
            reused.inc(self.reused)
            self.reused = 0
        if self.bytes_up:
            bytes_up.inc(self.bytes_up)
            self.bytes_up = 0
        if self.bytes_down:
            bytes_down.inc(self.bytes_down)
            self.bytes_down = 0
        for child, counts in ((first_byte, self.first_byte), (stream_seconds, self.stream_seconds)):
            if not any(counts[:-1]):
                continue
            # prometheus_client keeps per-bucket (non-cumulative) children and a
            # sum; adding to them is what ``observe`` does one value at a time.
            for index, count in enumerate(counts[:-1]):
                if count:
                    child._buckets[index].inc(count)
            child._sum.inc(counts[-1])
            counts[:] = [0.0] * len(counts)
