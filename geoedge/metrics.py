"""Prometheus metrics for both daemons, across worker processes.

Each daemon declares its metrics on a :class:`MetricSet` (one namespace, one
registry) and the admin listener exposes them with :func:`exposition`.

Worker processes (:mod:`geoedge.workers`) each count for themselves;
prometheus_client's *multiprocess mode* adds them up at scrape time: every
process writes its values to memory-mapped files in ``PROMETHEUS_MULTIPROC_DIR``
and the admin's ``MultiProcessCollector`` merges the files. The parent calls
:func:`enable_multiprocess` before it declares a metric or forks a worker: it
makes a fresh directory (stale files from a previous run would be merged in),
sets the variable and switches prometheus_client's value class, which the
library otherwise picks once, at import. :func:`process_exited` drops a dead
worker's live gauges; its counters stay, as counters must.

Gauges say how processes combine (``mode``): ``livesum`` for "streams open"
(the sum over live workers), ``livemax`` for a value every worker measures on
its own (an edge's RTT), ``max`` for a value one process owns.

Hot paths should not touch metric objects per chunk: in multiprocess mode an
``inc`` takes a lock, checks the pid and writes the mmap (~1-2 us). Count in
plain attributes and add to a counter once per stream, and keep the labelled
child (``counter.labels(...)``) instead of looking it up per event.
"""

from __future__ import annotations

import bisect
import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.metrics_core import Metric

from geoedge.version import build_mode, running_version

__all__ = [
    "ENV_VAR",
    "LATENCY_BUCKETS",
    "MetricSet",
    "ProcessMetrics",
    "Tally",
    "cleanup_multiprocess",
    "enable_multiprocess",
    "exposition",
    "merged_families",
    "merged_registry",
    "multiprocess_enabled",
    "process_exited",
]

ENV_VAR = "PROMETHEUS_MULTIPROC_DIR"

#: Request latencies span a few ms (near users, keep-alive; a backend on the
#: origin's network) to seconds (far origins); finer between 50 ms and 1 s,
#: where inter-region round trips fall, so that a 100-200 ms change moves a
#: quantile (the status page's and the dashboard's). Both daemons use these.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.6, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip

GaugeMode = Literal["livesum", "liveall", "livemax", "livemin", "max", "min", "sum", "all"]


def enable_multiprocess(
    directory: str | os.PathLike[str] | None = None, *, keep: bool = False
) -> Path:
    """Switch this process (and the workers it forks) to multiprocess mode.

    With no ``directory``, a fresh temporary one; a given one is emptied of
    ``*.db`` files first, unless ``keep`` (a supervisor that re-executed
    itself: its older workers still write there, and the counters of the
    ones gone must go on, not start again from 0). Call before declaring
    metrics. Returns the directory.
    """
    if directory is None:
        path = Path(tempfile.mkdtemp(prefix="geoedge-metrics-"))
    else:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        for stale in () if keep else path.glob("*.db"):
            stale.unlink()
    os.environ[ENV_VAR] = str(path)
    values.ValueClass = values.MultiProcessValue()
    return path


def multiprocess_enabled() -> bool:
    return ENV_VAR in os.environ and values.ValueClass is not values.MutexValue


def process_exited(pid: int) -> None:
    """Forget a dead worker's live gauges (call from the parent after reaping it)."""
    if multiprocess_enabled():
        multiprocess.mark_process_dead(pid)


def cleanup_multiprocess(directory: str | os.PathLike[str]) -> None:
    """Remove the directory made by :func:`enable_multiprocess` (at parent exit)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(directory)


#: Drops or rewrites metric families before they are exposed (see :func:`exposition`).
FamilyFilter = Callable[[list[Metric]], list[Metric]]


class _Families:
    """A collector that yields families collected elsewhere."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def exposition(
    registries: Sequence[CollectorRegistry] = (), keep: FamilyFilter | None = None
) -> tuple[bytes, str]:
    """The text format and its content type: every process's metrics merged in
    multiprocess mode, else the given registries'. ``keep`` filters the
    families first (the origin drops the series of backends it no longer has:
    in multiprocess mode a worker cannot delete a series from its value file)."""
    if keep is not None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(keep(merged_families(registries))))
        return generate_latest(registry), CONTENT_TYPE_LATEST
    if multiprocess_enabled():
        return generate_latest(merged_registry()), CONTENT_TYPE_LATEST
    return b"".join(generate_latest(r) for r in registries), CONTENT_TYPE_LATEST


def merged_families(registries: Sequence[CollectorRegistry] = ()) -> list[Metric]:
    """The metric families :func:`exposition` would print, as objects."""
    if multiprocess_enabled():
        return list(merged_registry().collect())
    return [family for registry in registries for family in registry.collect()]


class _WrittenFiles(multiprocess.MultiProcessCollector):
    """prometheus_client's merge of the value files, leaving out a file that a
    process is creating at this moment: ``MmapedDict`` opens it (0 octets), then
    sizes it, and a merge in between failed on the empty file (a struct.error
    out of /metrics or /readyz while a worker started). Such a file holds no
    value yet."""

    def __init__(self, registry: CollectorRegistry) -> None:
        multiprocess.MultiProcessCollector.__init__(self, registry)

    def collect(self) -> Iterable[Metric]:
        files = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            with contextlib.suppress(OSError):  # gone (a dead worker's, cleaned up)
                if os.path.getsize(path) >= 8:  # the header: octets in use
                    files.append(path)
        merged: Iterable[Metric] = multiprocess.MultiProcessCollector.merge(files, accumulate=True)
        return merged


def merged_registry() -> CollectorRegistry:
    """A registry that collects every process's values (multiprocess mode)."""
    registry = CollectorRegistry()
    _WrittenFiles(registry)
    return registry


class MetricSet:
    """Declares metrics named ``<namespace>_<name>`` in one registry.

    Each set has its own registry unless given one, so two sets of one
    daemon in a process (tests run several) never clash over names.
    """

    def __init__(self, namespace: str, registry: CollectorRegistry | None = None) -> None:
        self.namespace = namespace
        self.registry = registry if registry is not None else CollectorRegistry()

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        """``name`` without ``_total``; the exposition adds it."""
        return Counter(
            name, documentation, labels, namespace=self.namespace, registry=self.registry
        )

    def gauge(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        mode: GaugeMode = "livesum",
    ) -> Gauge:
        return Gauge(
            name,
            documentation,
            labels,
            namespace=self.namespace,
            registry=self.registry,
            multiprocess_mode=mode,
        )

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
    ) -> Histogram:
        return Histogram(
            name,
            documentation,
            labels,
            namespace=self.namespace,
            registry=self.registry,
            buckets=buckets,
        )


_process_metrics: dict[str, tuple[Gauge, Gauge, Counter, Gauge, Gauge]] = {}  # "all": the one set


class ProcessMetrics:
    """A worker's own health, sampled by its periodic task: resident memory, open
    descriptors, CPU time and event-loop lag (how late a timer fired: a loop
    busy for that long delayed every connection it serves). Gauges are per
    live process (``pid`` label); CPU is a counter summed over processes.

    And what the worker runs: ``geoedge_build_info{version, compiled, pid}``
    is 1 for each live worker, so during and after a reload every worker's
    version shows (:func:`geoedge.version.running_version`; ``compiled`` is
    :func:`geoedge.version.build_mode`). A worker's series goes when it exits."""

    __slots__ = ("_cpu", "_daemon", "_fds", "_lag", "_last_cpu", "_page", "_rss")

    def __init__(self, daemon: str) -> None:
        if not _process_metrics:  # declared once per process, after multiprocess mode
            _process_metrics["all"] = (
                Gauge("geoedge_process_resident_memory_bytes", "Resident memory",
                      ["daemon"], multiprocess_mode="liveall"),
                Gauge("geoedge_process_open_fds", "Open file descriptors",
                      ["daemon"], multiprocess_mode="liveall"),
                Counter("geoedge_process_cpu_seconds", "CPU time (user + system)", ["daemon"]),
                Gauge("geoedge_event_loop_lag_seconds",
                      "How late the last periodic timer fired", ["daemon"],
                      multiprocess_mode="liveall"),
                Gauge("geoedge_build_info", "The version each worker runs (1 per worker)",
                      ["version", "compiled"], multiprocess_mode="liveall"),
            )  # fmt: skip
        rss, fds, cpu, lag, build = _process_metrics["all"]
        build.labels(running_version(), build_mode()).set(1)
        self._daemon = daemon
        self._rss, self._fds, self._cpu, self._lag = (
            rss.labels(daemon),
            fds.labels(daemon),
            cpu.labels(daemon),
            lag.labels(daemon),
        )
        self._page = os.sysconf("SC_PAGE_SIZE")
        times = os.times()
        self._last_cpu = times.user + times.system
        self.sample(event_loop_lag_s=0.0)  # no zero RSS shown before the first tick

    def sample(self, *, event_loop_lag_s: float) -> None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open("/proc/self/statm", "rb") as f:
                self._rss.set(int(f.read().split()[1]) * self._page)
            self._fds.set(len(os.listdir("/proc/self/fd")))
        times = os.times()
        cpu = times.user + times.system
        self._cpu.inc(max(0.0, cpu - self._last_cpu))
        self._last_cpu = cpu
        self._lag.set(max(0.0, event_loop_lag_s))


class Tally:
    """Hot-path counting in plain numbers, added to Prometheus by :meth:`publish`
    (the worker calls it every second or two and the numbers are at most that
    stale).

    Why: in multiprocess mode every ``inc``/``observe`` takes a lock, calls
    ``getpid()`` and writes a memory-mapped file (0.85-1.7 us each); per request
    that was 7% of the edge's CPU and 14% of the origin's in ``make
    bench-edge``. A dict increment is ~0.1 us, and publishing costs one ``inc``
    per label set per interval.

    Two ways to name a series: a metric and its label value(s) (:meth:`add`,
    :meth:`observe`), or a labelled child looked up once (:meth:`inc`,
    :meth:`observe_child`).
    """

    __slots__ = ("_counts", "_histograms")

    def __init__(self) -> None:
        # (counter, label) or (child, None) -> amount
        self._counts: dict[tuple[Any, Any], float] = {}
        # (histogram, labels) or (child, None) -> [per-bucket counts..., sum]
        self._histograms: dict[tuple[Any, Any], list[float]] = {}

    def add(self, counter: Counter, label: str | tuple[str, ...], amount: float = 1) -> None:
        """``label``: the label value, or a tuple of them for several labels."""
        key = (counter, label)
        self._counts[key] = self._counts.get(key, 0) + amount

    def inc(self, child: Counter, amount: float = 1) -> None:
        """Add to a labelled child (``counter.labels(...)``, kept by the caller)."""
        key = (child, None)
        self._counts[key] = self._counts.get(key, 0) + amount

    def observe(self, histogram: Histogram, labels: tuple[str, ...], seconds: float) -> None:
        self._bucket((histogram, labels), histogram, seconds)

    def observe_child(self, child: Histogram, seconds: float) -> None:
        self._bucket((child, None), child, seconds)

    def _bucket(self, key: tuple[Any, Any], histogram: Histogram, seconds: float) -> None:
        counts = self._histograms.get(key)
        bounds = histogram._upper_bounds
        if counts is None:
            counts = self._histograms[key] = [0.0] * (len(bounds) + 1)
        counts[bisect.bisect_left(bounds, seconds)] += 1
        counts[-1] += seconds

    def add_buckets(
        self, histogram: Histogram, labels: tuple[str, ...] | None, buckets: Sequence[float]
    ) -> None:
        """Add per-bucket counts and their sum (the layout :meth:`_bucket` keeps:
        one count per upper bound, then the sum), summed elsewhere; ``labels``
        None: ``histogram`` is a labelled child already."""
        key = (histogram, labels)
        counts = self._histograms.get(key)
        if counts is None:
            self._histograms[key] = list(buckets)
            return
        for index, count in enumerate(buckets):
            counts[index] += count

    def publish(self) -> None:
        counts, self._counts = self._counts, {}
        for (counter, label), amount in counts.items():
            _child(counter, label).inc(amount)
        histograms, self._histograms = self._histograms, {}
        for (histogram, labels), buckets in histograms.items():
            # prometheus_client keeps per-bucket (non-cumulative) children and a
            # sum; adding to them is what ``observe`` does one value at a time.
            child = _child(histogram, labels)
            for index, count in enumerate(buckets[:-1]):
                if count:
                    child._buckets[index].inc(count)
            child._sum.inc(buckets[-1])


def _child(metric: Any, label: str | tuple[str, ...] | None) -> Any:
    if label is None:
        return metric
    return metric.labels(*label) if isinstance(label, tuple) else metric.labels(label)
