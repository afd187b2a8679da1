"""The last minute of a daemon's metrics, for its status page.

Prometheus computes rates and quantiles over a window from scrapes; the status
page must say the same things with no Prometheus beside it ("which hop got
slower in the last minute?"). :class:`MetricsWindow` keeps a few snapshots of
the merged metrics (every worker's, read by the admin in the parent) and
answers from the difference between the newest and the oldest one: rates of
counters, and quantiles and means of histograms over that span, computed as
``histogram_quantile`` does (linear interpolation inside a bucket). Gauges are
read from the newest snapshot.

Pure apart from ``collect`` (called by :meth:`MetricsWindow.sample`): tests feed
it families they build.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from geoedge.status_page import Cell, Row, Table, cell

__all__ = [
    "RETRANSMIT_BAD",
    "RETRANSMIT_WARN",
    "MetricsWindow",
    "Snapshot",
    "bucket_quantile",
    "retransmit_ratio",
    "workers_table",
]

#: Tunnel octets retransmitted over octets sent, on both daemons' pages: a
#: warning from a path losing about 0.1% of its packets, bad from 1%.
RETRANSMIT_WARN = 0.001
RETRANSMIT_BAD = 0.01


def retransmit_ratio(sent: float | None, retransmitted: float | None) -> float | None:
    """Retransmitted over sent (rates or totals); None when nothing was sent."""
    if not sent:
        return None
    return (retransmitted or 0.0) / sent


#: (sample name, sorted label items) -> value
Values = dict[tuple[str, tuple[tuple[str, str], ...]], float]
Group = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken_at: float
    values: Values


def snapshot(families: Iterable[Any], taken_at: float) -> Snapshot:
    """Flatten ``prometheus_client`` metric families (``registry.collect()``)."""
    values: Values = {}
    for family in families:
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            values[key] = values.get(key, 0.0) + sample.value
    return Snapshot(taken_at, values)


def bucket_quantile(quantile: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``quantile`` of observations given cumulative ``(upper bound, count)``
    buckets sorted by bound, the last being +Inf; None without observations.
    As Prometheus' ``histogram_quantile``: linear inside the bucket it falls in,
    the highest finite bound when it falls in +Inf."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = quantile * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


class MetricsWindow:
    """Snapshots over the last ``span_s`` seconds (one more, as the baseline)."""

    def __init__(
        self,
        collect: Callable[[], Iterable[Any]],
        *,
        span_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._collect = collect
        self._span_s = span_s
        self._clock = clock
        self._snapshots: deque[Snapshot] = deque()

    def sample(self) -> None:
        now = self._clock()
        self.add(snapshot(self._collect(), now))

    def add(self, taken: Snapshot) -> None:
        snapshots = self._snapshots
        snapshots.append(taken)
        # Keep the newest one older than the span as the window's baseline.
        while len(snapshots) > 2 and snapshots[1].taken_at <= taken.taken_at - self._span_s:
            snapshots.popleft()

    @property
    def seconds(self) -> float:
        """How much time the window covers now (0 with fewer than two snapshots)."""
        if len(self._snapshots) < 2:
            return 0.0
        return self._snapshots[-1].taken_at - self._snapshots[0].taken_at

    # -- queries ---------------------------------------------------------------------

    def gauge(
        self, name: str, by: Sequence[str], combine: Callable[..., float] = sum
    ) -> dict[Group, float]:
        """The newest value of gauge ``name`` per ``by`` label values, workers'
        values combined with ``combine`` (sum, or max)."""
        groups: dict[Group, list[float]] = {}
        for labels, value in self._latest(name):
            groups.setdefault(_group(labels, by), []).append(value)
        return {group: combine(values) for group, values in groups.items()}

    def rate(self, name: str, by: Sequence[str]) -> dict[Group, float]:
        """Per-second increase of counter sample ``name`` (e.g. ``x_total``)."""
        seconds = self.seconds
        if seconds <= 0:
            return {}
        return {group: delta / seconds for group, delta in self._deltas(name, by).items()}

    def quantile(self, q: float, histogram: str, by: Sequence[str]) -> dict[Group, float | None]:
        """The ``q`` quantile of what ``histogram`` observed in the window."""
        per_group: dict[Group, dict[float, float]] = {}
        for labels, delta in self._delta_items(f"{histogram}_bucket"):
            le = float(dict(labels)["le"])
            counts = per_group.setdefault(_group(labels, by), {})
            counts[le] = counts.get(le, 0.0) + delta
        return {
            group: bucket_quantile(q, sorted(counts.items())) for group, counts in per_group.items()
        }

    def count(self, histogram: str, by: Sequence[str]) -> dict[Group, float]:
        """Observations in the window."""
        return self._deltas(f"{histogram}_count", by)

    # -- internals -----------------------------------------------------------------------

    def _latest(self, name: str) -> list[tuple[tuple[tuple[str, str], ...], float]]:
        if not self._snapshots:
            return []
        values = self._snapshots[-1].values
        return [(labels, value) for (sample, labels), value in values.items() if sample == name]

    def _delta_items(self, name: str) -> list[tuple[tuple[tuple[str, str], ...], float]]:
        if len(self._snapshots) < 2:
            return []
        old, new = self._snapshots[0].values, self._snapshots[-1].values
        items = []
        for (sample, labels), value in new.items():
            if sample != name:
                continue
            before = old.get((sample, labels), 0.0)
            # A restarted worker's counters start again from zero: count what it has.
            items.append((labels, value - before if value >= before else value))
        return items

    def _deltas(self, name: str, by: Sequence[str]) -> dict[Group, float]:
        groups: dict[Group, float] = {}
        for labels, delta in self._delta_items(name):
            group = _group(labels, by)
            groups[group] = groups.get(group, 0.0) + delta
        return groups


def _group(labels: tuple[tuple[str, str], ...], by: Sequence[str]) -> Group:
    found = dict(labels)
    return tuple(found.get(name, "") for name in by)


def workers_table(window: MetricsWindow, daemon: str) -> Table:
    """Each worker process: the version it runs (during a reload, old and new
    side by side), memory, descriptors, CPU, event-loop lag."""
    by = ("daemon", "pid")
    rss = window.gauge("geoedge_process_resident_memory_bytes", by)
    fds = window.gauge("geoedge_process_open_fds", by)
    lag = window.gauge("geoedge_event_loop_lag_seconds", by, max)
    builds = window.gauge("geoedge_build_info", ("pid", "version", "compiled"), max)
    version = {pid: f"{v} ({compiled})" for (pid, v, compiled), up in builds.items() if up}
    rows = [
        Row(
            [
                Cell(pid),
                Cell(version.get(pid, "?")),
                cell(value, "B"),
                cell(fds.get((kind, pid))),
                cell(lag.get((kind, pid)), "s", warn=0.05, bad=0.2),
            ]
        )
        for (kind, pid), value in sorted(rss.items())
        if kind == daemon
    ]
    return Table(
        "Workers", ["pid", "version", "resident memory", "open fds", "event-loop lag"], rows
    )
