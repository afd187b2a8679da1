"""``make bench-heap-return``: how much resident memory a worker's
:class:`geoedge.memory.MemoryKeeper` gives back after a burst.

The pattern of a worker after many connections closed: ``--mib`` MiB in
blocks of ``--block-bytes`` (below glibc's mmap threshold, so from the heap),
then every block freed but one in ``--keep-every``, so that the heap cannot
shrink from its top. Then one round of the keeper, as its timer runs it.

Figures (stdout, and ``--out`` as JSON): the process's RSS and the heap
mapping's resident bytes before and after the round, glibc's free heap bytes,
how long ``malloc_trim`` took, and ``returned_share`` (RSS given back over the
bytes freed). The unit test (``tests/unit/test_runtime_memory.py``) checks
the same path by the heap's accounting; RSS is a figure of this whole process,
which other work on a shared machine does not move but other code in a test
process does, so it is reported here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from geoedge import memory

MiB = 1024 * 1024


def heap_mapping_resident_bytes() -> int:
    """Resident bytes of this process's ``[heap]`` mapping (glibc's main arena),
    from /proc/self/smaps: what ``malloc_trim`` gives back leaves this mapping,
    whatever the rest of the process allocates elsewhere (the unit test of the
    keeper counts on that too)."""
    in_heap = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef":  # a mapping's first line
            in_heap = line.endswith("[heap]")
        elif in_heap and line.startswith("Rss:"):
            return int(line.split()[1]) * 1024
    return 0


async def run(mib: int, block_bytes: int, keep_every: int) -> dict[str, Any]:
    """In an event loop, as in a worker (the keeper's gauges count its tasks)."""
    count = mib * MiB // block_bytes
    blocks = [bytearray(block_bytes) for _ in range(count)]
    kept = blocks[::keep_every]
    keeper = memory.MemoryKeeper("bench_heap_return", ["loadtests"], trim_interval_s=0)
    full = memory.heap_statistics()
    rss_full = memory.resident_bytes()
    del blocks
    heap = memory.heap_statistics()
    if full is None or heap is None:
        raise SystemExit("the C library is not glibc: nothing to measure")
    rss_before, heap_rss_before = memory.resident_bytes(), heap_mapping_resident_bytes()
    started = time.perf_counter()
    keeper.maintain()
    trim_ms = (time.perf_counter() - started) * 1000
    rss_after, heap_rss_after = memory.resident_bytes(), heap_mapping_resident_bytes()
    freed = full.in_use_bytes - heap.in_use_bytes
    keeper.close()
    assert len(kept) == (count + keep_every - 1) // keep_every
    return {
        "allocated_mib": mib,
        "freed_mib": round(freed / MiB, 1),
        "rss_with_blocks_mib": round(rss_full / MiB, 1),
        "rss_before_trim_mib": round(rss_before / MiB, 1),
        "rss_after_trim_mib": round(rss_after / MiB, 1),
        "heap_resident_before_mib": round(heap_rss_before / MiB, 1),
        "heap_resident_after_mib": round(heap_rss_after / MiB, 1),
        "heap_free_mib": round(heap.free_bytes / MiB, 1),
        "trims": keeper.trims,
        "trim_ms": round(trim_ms, 2),
        "returned_share": round((rss_before - rss_after) / freed, 3) if freed else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--block-bytes", type=int, default=4000)
    parser.add_argument("--keep-every", type=int, default=64)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    result = asyncio.run(run(args.mib, args.block_bytes, args.keep_every))
    print(
        f"RSS {result['rss_before_trim_mib']} -> {result['rss_after_trim_mib']} MiB after "
        f"{result['freed_mib']} MiB freed (heap mapping {result['heap_resident_before_mib']} -> "
        f"{result['heap_resident_after_mib']} MiB), returned share "
        f"{result['returned_share']:.2f}, trim {result['trim_ms']} ms, trims {result['trims']}"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if result["trims"] != 1:
        sys.exit("the keeper did not trim")


if __name__ == "__main__":
    main()
