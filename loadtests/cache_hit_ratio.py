"""Per-worker caches or one cache shared by an edge's workers: the hit ratio each way.

The edge's workers share the listening sockets and the kernel hands each new
connection to any of them (DESIGN principle 9), so with a cache per worker a
URL is fetched once per worker that is asked for it, and each worker holds
its share of the memory. This replays one request stream both ways through
the real store (:class:`edge.cache.store.CacheStore`, LRU, byte limit):

- ``shared``: one store of ``memory`` bytes sees every request;
- ``per-worker``: ``workers`` stores of ``memory / workers`` bytes each (the
  same memory in all), each connection's requests going to one worker chosen
  at random, as the kernel's accept spreading does.

The stream: ``requests`` GETs over ``urls`` objects of ``object_bytes``,
their popularity Zipf-distributed (exponent ``zipf``, web traffic's usual
0.8-1.0), in connections of ``per_connection`` requests (a page view);
every object is fresh for the whole run (a miss is a first fetch or an
eviction). Deterministic: seeded.

    python -m loadtests.cache_hit_ratio
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import random
import sys
from dataclasses import dataclass

from edge.cache.entry import StoredResponse
from edge.cache.freshness import ResponseFacts
from edge.cache.store import CacheStore

_FACTS = ResponseFacts.of(200, [])
_BODIES: dict[int, bytes] = {}


@dataclass(frozen=True, slots=True)
class Workload:
    urls: int = 20_000
    requests: int = 200_000
    object_bytes: int = 16 * 1024
    zipf: float = 0.9
    per_connection: int = 20
    seed: int = 30


def stream(load: Workload) -> list[list[int]]:
    """Connections, each a list of object numbers."""
    rng = random.Random(load.seed)
    weights = [1.0 / (rank**load.zipf) for rank in range(1, load.urls + 1)]
    cumulative = list(itertools.accumulate(weights))
    total = cumulative[-1]
    picks = [bisect.bisect(cumulative, rng.random() * total) for _ in range(load.requests)]
    return [picks[i : i + load.per_connection] for i in range(0, len(picks), load.per_connection)]


def _entry(number: int, size: int) -> StoredResponse:
    return StoredResponse(
        key=f"https://h/{number}",
        url=f"https://h/{number}",
        status=200,
        reason=b"OK",
        headers=[],
        body=_BODIES.setdefault(size, b"\0" * size),  # one object: only its length counts
        vary=(),
        request_time=0.0,
        response_time=0.0,
        initial_age=0.0,
        lifetime=1e9,
        facts=_FACTS,
    )


def hit_ratio(
    connections: list[list[int]], stores: list[CacheStore], size: int, seed: int
) -> float:
    rng = random.Random(seed)
    hits = requests = 0
    for connection in connections:
        store = stores[rng.randrange(len(stores))]
        for number in connection:
            requests += 1
            held = store.variants(f"https://h/{number}")
            if held:
                hits += 1
                store.touch(held[0])
            else:
                store.put(_entry(number, size))
    return hits / requests


def compare(load: Workload, memory: int, workers: int) -> tuple[float, float]:
    connections = stream(load)
    shared = hit_ratio(connections, [CacheStore(memory)], load.object_bytes, load.seed)
    split = [CacheStore(memory // workers) for _ in range(workers)]
    per_worker = hit_ratio(connections, split, load.object_bytes, load.seed)
    return shared, per_worker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Workload()
    parser.add_argument("--requests", type=int, default=defaults.requests)
    parser.add_argument("--urls", type=int, default=defaults.urls)
    args = parser.parse_args(argv)
    load = Workload(urls=args.urls, requests=args.requests)
    catalogue = load.urls * load.object_bytes
    print(
        f"{load.requests} requests, {load.urls} URLs of {load.object_bytes // 1024} KiB "
        f"(catalogue {catalogue / 2**20:.0f} MiB), Zipf {load.zipf}, "
        f"{load.per_connection} requests per connection"
    )
    print("| memory (all workers) | workers | shared hit ratio | per-worker hit ratio | lost |")
    print("|---|---|---|---|---|")
    for share in (1.0, 0.25, 0.05):
        memory = int(catalogue * share)
        for workers in (2, 4, 8):
            shared, per_worker = compare(load, memory, workers)
            print(
                f"| {memory / 2**20:.0f} MiB ({share:.0%} of catalogue) | {workers} "
                f"| {shared:.3f} | {per_worker:.3f} | {shared - per_worker:.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
