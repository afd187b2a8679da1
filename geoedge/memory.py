"""A worker's memory: the collector's policy, giving freed memory back, and a
report of what is alive.

Three decisions, with the figures behind them (2 shared cores; ``make soak``
and the scripts described in ``loadtests/soak.py``):

1. **Connections are freed by reference counting, not by the collector.**
   Every object of a connection (client connection, TLS transport, tunnel
   stream and its protocol, the origin's splice and backend protocol, the
   HTTP parsers) is reachable from the event loop while the connection is
   open and from nothing once it is closed: each side lets go of the other
   when the connection ends (a transport drops its protocol after
   ``connection_lost``, as asyncio's own do), and no object keeps bound
   methods of itself. Before, each connection left a handful of reference
   cycles (transport ↔ protocol, stream ↔ protocol, splice ↔ backend
   protocol, HTTP parser ↔ llhttp callbacks, a tunnel session ↔ its frame
   handlers), which only a full collection frees, and the tuning below makes
   those rare: 3,000 WebSockets opened and closed three times took the edge
   worker's RSS from 124 to 192 to 262 MB and the origin's from 57 to 66 to
   74 MB; the issue saw 287 → 494 → 702 MB with 9,000. ``tests`` check that
   closed connections leave no object behind with the collector disabled.

2. **The collector stays tuned for throughput** (:func:`tune_gc`): freeze
   what start-up allocated, collect the young generation every 50,000 net
   allocations. The other way to free cycles, collections that actually run,
   costs more than it saves here. With 6,000 WebSockets open (edge and origin
   in one process, 272,000 tracked objects), a full collection stalls the
   loop for 110 ms and a middle-generation one for 90 ms, while finding
   nothing once the cycles are gone; the default thresholds cost 3-5% of a
   request's CPU in ``make bench-edge``. So no periodic full collection: the
   report below runs one on request and says what it found, and the
   ``gc_unreachable_objects`` gauge counts what the collector frees anyway.

3. **Freed memory goes back to the system.** glibc keeps freed heap memory for
   reuse, so a worker that held 9,000 connections stays at its high-water mark
   once they close: after 3,000 WebSockets the heap held 98 MB free against
   15 MB in use. Every :data:`TRIM_INTERVAL_S`, when more than
   :data:`TRIM_MIN_FREE_BYTES` of the heap is free, :class:`MemoryKeeper` calls
   ``malloc_trim(0)``, which returns the free pages (about 7 ms for that
   heap; RSS 160 → 90 MB). HAProxy trims the same way when it releases its
   pools. Elsewhere than glibc this step is skipped.

What is alive: ``SIGUSR2`` makes a worker log one ``memory report`` line
(:meth:`MemoryKeeper.report`): the live instances of the daemon's own classes
counted *before* anything is collected (``live``), asyncio tasks, RSS, open
descriptors, the heap, and then the number of unreachable objects a full
collection found (``unreachable``; it runs one, so expect a pause of a few
tens of ms per thousand open connections). The supervisor forwards the signal
to every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from geoedge.logs import log_event
from geoedge.metrics import MetricSet

__all__ = [
    "HeapStatistics",
    "MemoryKeeper",
    "MemoryReport",
    "census",
    "give_back_heap",
    "heap_statistics",
    "tune_gc",
]

log = logging.getLogger("geoedge.memory")

#: How often the keeper publishes its gauges.
METRICS_INTERVAL_S = 10.0
#: How often, at most, freed heap memory is given back.
TRIM_INTERVAL_S = 30.0
#: Free heap below this is kept for reuse (a trim costs more than it returns).
TRIM_MIN_FREE_BYTES = 16 * 1024 * 1024

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def tune_gc() -> None:
    """Call in a worker once it is set up. Freeze what start-up allocated
    (configs, contexts, modules) so the collector stops re-scanning it, and
    collect the young generation less often: per-connection objects are freed
    by reference counting (module docstring). GC was ~3% of a keep-alive
    request at the edge and ~5% of a stream at the origin in ``make bench-edge``."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def census(packages: Sequence[str]) -> dict[str, int]:
    """Live instances of each class defined in ``packages`` (``"edge"`` counts
    ``edge.*``), among the objects the collector tracks; frozen start-up objects
    are not counted. Runs no collection: what it counts is what reference
    counting has not freed. Costs a walk over every tracked object."""
    prefixes = tuple(f"{package}." for package in packages)
    counts: Counter[str] = Counter()
    for obj in gc.get_objects():
        cls = type(obj)
        module = cls.__module__
        if isinstance(module, str) and module.startswith(prefixes):
            counts[f"{module}.{cls.__qualname__}"] += 1
    return dict(sorted(counts.items()))


def _collect_naming_garbage(top: int = 15) -> tuple[int, dict[str, int]]:
    """A full collection that also names the ``top`` classes of what it found:
    the found objects are kept aside for counting (``DEBUG_SAVEALL``), then
    freed by a second collection."""
    was = gc.get_debug()
    gc.set_debug(was | gc.DEBUG_SAVEALL)
    try:
        found = gc.collect()
        garbage, gc.garbage[:] = list(gc.garbage), []
    finally:
        gc.set_debug(was)
    counts: Counter[str] = Counter(
        f"{type(obj).__module__}.{type(obj).__qualname__}" for obj in garbage
    )
    del garbage
    gc.collect()
    return found, dict(counts.most_common(top))


# --------------------------------------------------------------------------- heap


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",  # heap bytes obtained with sbrk
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",  # bytes in mmap'ed blocks
            "usmblks",
            "fsmblks",
            "uordblks",  # bytes in use
            "fordblks",  # free bytes kept in the heap
            "keepcost",
        )
    ]


def _load_glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        return None
    return libc


_glibc = _load_glibc()


@dataclass(frozen=True, slots=True)
class HeapStatistics:
    """glibc's view of the C heap (``mallinfo2``)."""

    in_use_bytes: int
    free_bytes: int
    """Freed memory the heap keeps for reuse (and which counts in RSS)."""
    mmapped_bytes: int


def heap_statistics() -> HeapStatistics | None:
    """None when the C library is not glibc."""
    if _glibc is None:
        return None
    info = _glibc.mallinfo2()
    return HeapStatistics(info.uordblks, info.fordblks, info.hblkhd)


def give_back_heap() -> int:
    """``malloc_trim(0)``: return the heap's free pages to the system. Returns
    how much RSS fell (bytes; 0 without glibc)."""
    if _glibc is None:
        return 0
    before = resident_bytes()
    _glibc.malloc_trim(0)
    return max(0, before - resident_bytes())


def resident_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


# --------------------------------------------------------------------------- report


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """What a worker holds (see the module docstring)."""

    live: dict[str, int]
    """Instances of the daemon's classes, counted before any collection."""
    asyncio_tasks: int
    resident_bytes: int
    open_fds: int
    heap: HeapStatistics | None
    gc_counts: tuple[int, int, int]
    """Net allocations since each generation's last collection (``gc.get_count``)."""
    unreachable: int | None
    """Objects a full collection run for this report found (None: not run)."""
    collect_ms: float | None
    unreachable_types: dict[str, int] | None = None
    """The commonest classes among those objects (what is leaking in cycles)."""


class MemoryKeeper:
    """One worker's memory upkeep: gauges every :data:`METRICS_INTERVAL_S`, freed
    heap given back (module docstring), and a :class:`MemoryReport` logged on
    ``SIGUSR2``. ``packages``: where the daemon's own classes live, for the census."""

    def __init__(
        self,
        namespace: str,
        packages: Sequence[str],
        *,
        metrics_interval_s: float = METRICS_INTERVAL_S,
        trim_interval_s: float = TRIM_INTERVAL_S,
        trim_min_free_bytes: int = TRIM_MIN_FREE_BYTES,
    ) -> None:
        self.packages = tuple(packages)
        self._metrics_interval_s = metrics_interval_s
        self._trim_interval_s = trim_interval_s
        self._trim_min_free_bytes = trim_min_free_bytes
        self._last_trim = time.monotonic()
        heap = heap_statistics()
        self._free_low = heap.free_bytes if heap is not None else 0
        """The least free heap seen since the last trim (see :meth:`maintain`)."""
        self.trims = 0
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unreachable = [0, 0, 0]
        m = MetricSet(namespace)
        self._tasks = m.gauge("worker_asyncio_tasks", "asyncio tasks alive in the workers.")
        self._rss = m.gauge(
            "worker_resident_bytes", "Resident memory of each worker.", mode="liveall"
        )
        self._fds = m.gauge("worker_open_fds", "Open descriptors of each worker.", mode="liveall")
        self._gc_unreachable = m.gauge(
            "worker_gc_unreachable_objects",
            "Objects the cyclic collector freed since the worker started, by generation "
            "(growing: something leaves reference cycles).",
            ("generation",),
        )
        self._returned = m.gauge(
            "worker_memory_returned_bytes",
            "Freed heap memory given back to the system (malloc_trim) since start.",
        )
        self._returned_total = 0

    def start(self) -> None:
        """Start the gauges' timer and take ``SIGUSR2`` (call in the worker's loop)."""
        self._loop = loop = asyncio.get_running_loop()
        gc.callbacks.append(self._on_gc)
        loop.add_signal_handler(signal.SIGUSR2, self.log_report)
        self._tick()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGUSR2)
            self._loop = None

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            self._unreachable[info["generation"]] += info["collected"]

    def _tick(self) -> None:
        assert self._loop is not None
        self.maintain()
        self._timer = self._loop.call_later(self._metrics_interval_s, self._tick)

    def maintain(self) -> None:
        """One round: give freed heap back if it is due and worth it, publish.

        Worth it: at least ``trim_min_free_bytes`` were freed since the heap was
        last that full (its least free bytes since the last trim, seen at each
        round), so that much may be resident again. Free bytes alone would not
        do: pages given back stay "free" to glibc, and every round would trim
        again for nothing."""
        heap = heap_statistics()
        if heap is not None:
            self._free_low = min(self._free_low, heap.free_bytes)
            now = time.monotonic()
            if (
                now - self._last_trim >= self._trim_interval_s
                and heap.free_bytes - self._free_low >= self._trim_min_free_bytes
            ):
                self._last_trim = now
                self.trims += 1
                self._returned_total += give_back_heap()
                self._free_low = heap.free_bytes
        self._tasks.set(len(asyncio.all_tasks()))
        self._rss.set(resident_bytes())
        self._fds.set(open_fds())
        for generation, count in enumerate(self._unreachable):
            self._gc_unreachable.labels(str(generation)).set(count)
        self._returned.set(self._returned_total)

    def report(self, *, collect: bool = True) -> MemoryReport:
        """Count what is alive; then, with ``collect``, run a full collection and
        say how many unreachable objects it found."""
        live = census(self.packages)
        counts = gc.get_count()
        unreachable: int | None = None
        collect_ms: float | None = None
        unreachable_types: dict[str, int] | None = None
        if collect:
            started = time.perf_counter()
            unreachable, unreachable_types = _collect_naming_garbage()
            collect_ms = round((time.perf_counter() - started) * 1000, 1)
        return MemoryReport(
            live=live,
            asyncio_tasks=len(asyncio.all_tasks()),
            resident_bytes=resident_bytes(),
            open_fds=open_fds(),
            heap=heap_statistics(),
            gc_counts=counts,
            unreachable=unreachable,
            collect_ms=collect_ms,
            unreachable_types=unreachable_types,
        )

    def log_report(self) -> None:
        """The ``SIGUSR2`` handler. Logged at warning level: it was asked for, and
        must show whatever the configured level."""
        fields = asdict(self.report())
        log_event(log, "warning", "memory report", pid=os.getpid(), **fields)
