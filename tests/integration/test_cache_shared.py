"""The tier an edge's workers share (edge/cache/shared.py): what one worker
stored, the other serves; purges and invalidation reach it too. Two workers,
a shared directory, Node.js counting what reaches it."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cache_env import CacheStack, cache_stack
from tests.conftest import PkiFiles, scaled
from tests.edge_env import metric_sum, node_available
from tests.integration.test_cache_edge import concurrent_gets

pytestmark = [
    pytest.mark.timeout(scaled(180)),
    pytest.mark.skipif(not node_available(), reason="needs Node.js (make node)"),
]

#: New connections land on a worker the kernel picks: with two workers, the
#: chance that 30 of them all land on the one that stored is 2**-30.
TRIES = 30


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-tier")


@pytest.fixture(scope="module")
def chain(
    test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory, shared: Path
) -> Iterator[CacheStack]:
    keys = f'shared_dir = "{shared}"\n'
    with cache_stack(
        test_pki, tmp_path_factory.mktemp("shared"), workers=2, cache_keys=keys, hit_for_pass_s=60
    ) as s:
        yield s


def test_what_one_worker_stored_the_other_serves(chain: CacheStack, shared: Path) -> None:
    path = "/one-fetch?cc=public,max-age=600&size=3000"
    bodies = {chain.fetch(path).body for _ in range(TRIES)}
    assert len(bodies) == 1
    assert chain.count("/one-fetch") == 1  # once per edge, not once per worker
    assert any(p.is_file() for d in shared.iterdir() if d.is_dir() for p in d.iterdir())


def test_a_purge_by_tag_reaches_the_shared_tier(chain: CacheStack) -> None:
    path = "/shared-tag?cc=public,max-age=600&tag=shared-1"
    for _ in range(TRIES):
        chain.fetch(path)
    assert chain.count("/shared-tag") == 1
    status, answer = chain.admin("POST", "/cache/purge", b'{"tag": "shared-1"}')
    assert status == 200 and json.loads(answer)["complete"] is True
    for _ in range(TRIES):
        chain.fetch(path)
    assert chain.count("/shared-tag") == 2  # fetched again once, and shared again


def test_an_unsafe_request_invalidates_the_shared_copy(chain: CacheStack) -> None:
    path = "/shared-post?cc=public,max-age=600"
    for _ in range(TRIES):
        chain.fetch(path)
    assert chain.count("/shared-post") == 1
    chain.fetch(path, method="POST", body=b"x")  # one worker sees it
    # The other worker drops its own copy at its next sweep (a second): poll
    # until every answer is from after the POST, then it must stay so.
    deadline = time.monotonic() + scaled(10)
    while time.monotonic() < deadline:
        seen = {json.loads(chain.fetch(path).body)["count"] for _ in range(TRIES)}
        if 1 not in seen:
            break
        time.sleep(0.2)
    assert seen == {3}  # fetched once after the POST, and shared again


def settled_collapses(chain: CacheStack) -> float:
    """Requests that waited for a fetch in flight, once two readings a publishing
    period apart agree (workers publish their counts once a second)."""
    name = "geoedge_edge_cache_events_total"
    last = metric_sum(chain.stack.metrics(), name, 'event="collapsed"')
    deadline = time.monotonic() + scaled(20)
    while time.monotonic() < deadline:
        time.sleep(1.2)
        now = metric_sum(chain.stack.metrics(), name, 'event="collapsed"')
        if now == last:
            return now
        last = now
    raise AssertionError("the collapse count did not settle")


def test_a_hit_for_pass_mark_outlives_a_reload_so_a_first_burst_queues_behind_nothing(
    chain: CacheStack, shared: Path
) -> None:
    # Runs last in this module: the workers after it are the reload's.
    path = "/shared-pass?cc=no-store&delay=300"
    for _ in range(6):  # one worker at least sees it twice: its mark is shared
        assert concurrent_gets(chain, path, 1)[0][0] == 200  # the burst's Host, so its key
    assert list((shared / ".passes").iterdir())
    log = chain.stack.log
    reloads = log.read_text(errors="replace").count("reload ok:")
    chain.stack.edge.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + scaled(60)
    while log.read_text(errors="replace").count("reload ok:") == reloads:
        assert time.monotonic() < deadline, "the reload did not end"
        time.sleep(0.2)
    before = settled_collapses(chain)
    replies = concurrent_gets(chain, path, 10)
    assert [status for status, _ in replies] == [200] * 10
    # The new workers found the mark: none of the ten waited behind another.
    assert settled_collapses(chain) == before
    assert chain.count("/shared-pass") == 16
