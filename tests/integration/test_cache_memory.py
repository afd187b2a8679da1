"""Filling the edge's cache past its limit: the worker's memory stays within
the limit plus 10% (issue 30), counted from /proc, the octets from Node.js."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cache_env import cache_stack
from tests.conftest import PkiFiles, scaled
from tests.edge_env import node_available

pytestmark = [
    pytest.mark.timeout(scaled(300)),
    pytest.mark.skipif(not node_available(), reason="needs Node.js (make node)"),
]

LIMIT = 32 * 1024 * 1024
OBJECT = 256 * 1024


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def worker_pid(parent: int) -> int:
    children = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        children += [int(p) for p in (task / "children").read_text().split()]
    assert len(children) == 1, children
    return children[0]


def test_filling_the_cache_past_its_limit_keeps_rss_within_the_limit_plus_ten_percent(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with cache_stack(test_pki, tmp_path, max_bytes=LIMIT) as chain:
        worker = worker_pid(chain.stack.edge.pid)
        for warm in range(20):  # the code paths, the TLS buffers, the allocator's arenas
            chain.fetch(f"/warm-{warm}?cc=no-store&size={OBJECT}")
        before = rss_bytes(worker)
        peak = before
        objects = 3 * LIMIT // OBJECT
        for index in range(objects):
            reply = chain.fetch(f"/fill-{index}?cc=public,max-age=600&size={OBJECT}")
            assert reply.status == 200 and len(reply.body) == OBJECT
            peak = max(peak, rss_bytes(worker))
        evicted = chain.stack.metrics()
        assert "geoedge_edge_cache_bytes " in evicted
        growth = peak - before
        print(f"RSS growth {growth / 2**20:.1f} MiB for a {LIMIT / 2**20:.0f} MiB cache")
        assert growth <= LIMIT * 1.1, (
            f"RSS grew {growth / 2**20:.1f} MiB for a {LIMIT / 2**20:.0f} MiB cache"
        )
        # the first ones were evicted: fetched again, they reach Node.js
        chain.fetch(f"/fill-0?cc=public,max-age=600&size={OBJECT}")
        assert chain.count("/fill-0") == 2
        last = objects - 1
        chain.fetch(f"/fill-{last}?cc=public,max-age=600&size={OBJECT}")
        assert chain.count(f"/fill-{last}") == 1
