"""geoedge.memory: the census, giving freed heap back, the report."""

from __future__ import annotations

import asyncio

import pytest

from geoedge import memory
from loadtests.heap_return import heap_mapping_resident_bytes
from tests.conftest import run_async
from tests.leaks import collector_off


class Counted:
    def __init__(self) -> None:
        self.me = self  # a cycle: freed only by the collector


def test_census_counts_live_instances_without_collecting() -> None:
    with collector_off():
        before = memory.census(["tests"]).get(f"{__name__}.Counted", 0)
        made = [Counted() for _ in range(7)]
        assert memory.census(["tests"])[f"{__name__}.Counted"] == before + 7
        del made
        # In cycles: the census must not collect them.
        assert memory.census(["tests"])[f"{__name__}.Counted"] == before + 7
        assert "builtins.dict" not in memory.census(["tests"])  # only the given packages


MiB = 1024 * 1024


@pytest.mark.skipif(memory.heap_statistics() is None, reason="the C library is not glibc")
def test_the_keeper_gives_freed_heap_back() -> None:
    """By the heap's own accounting, not the test process's RSS (which the
    rest of pytest moves too): the freed blocks are free heap, the keeper trims
    once, and the heap mapping's resident pages go. The figure (RSS before and
    after a trim) is ``make bench-heap-return``'s."""

    async def main() -> None:
        # 64 MiB in blocks glibc serves from its heap (below the mmap threshold),
        # then freed but for every 64th: with those in between, the heap cannot
        # shrink from its top, and keeps the rest (RSS with it).
        blocks = [bytearray(4000) for _ in range(16 * 1024)]
        pinned = blocks[::64]
        keeper = memory.MemoryKeeper("test_memory", ["tests"], trim_interval_s=0)
        full = memory.heap_statistics()
        del blocks
        heap = memory.heap_statistics()
        assert full is not None and heap is not None
        # 63 of 64 blocks freed into the heap (not unmapped): what a trim can return.
        assert full.in_use_bytes - heap.in_use_bytes >= 56 * MiB
        assert heap.free_bytes - full.free_bytes >= 56 * MiB
        resident = heap_mapping_resident_bytes()
        assert resident >= 56 * MiB
        keeper.maintain()
        assert keeper.trims == 1
        assert heap_mapping_resident_bytes() <= resident - 32 * MiB
        # The pages are back, but glibc still counts them free: no second trim.
        keeper.maintain()
        assert keeper.trims == 1
        assert len(pinned) == 256

    run_async(main(), 20)


def test_the_report_counts_first_then_collects() -> None:
    async def main() -> None:
        keeper = memory.MemoryKeeper("test_memory_report", ["tests"])
        with collector_off():
            made = [Counted() for _ in range(5)]
            del made
            report = keeper.report()
        assert report.live[f"{__name__}.Counted"] >= 5  # counted before the collection
        assert report.unreachable is not None and report.unreachable >= 5
        assert report.asyncio_tasks >= 1  # this one
        assert report.resident_bytes > 0 and report.open_fds > 0
        await asyncio.sleep(0)

    run_async(main(), 20)
