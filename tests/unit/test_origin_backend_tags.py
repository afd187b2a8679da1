"""The dispatcher's per-backend metric handles and counts (origin.dispatch)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from geoedge.metrics import Tally
from origin.dispatch import StreamDispatcher
from origin.metrics import WorkerMetrics
from origin.snapshot import BackendSpec, PoolSnapshot


def test_a_backend_that_leaves_and_comes_back_gets_its_tag_again() -> None:
    """DNS discovery may drop a backend and add it back many times a day: its
    handles and counts are one per (pool, address), not one more each time,
    and what it counted before it left is still published."""

    async def main() -> None:
        tally = Tally()
        dispatcher = StreamDispatcher(
            "o", WorkerMetrics(CollectorRegistry()), tally, None, lambda: 0.0
        )
        with_a = PoolSnapshot(
            "p", backends=(BackendSpec("127.0.0.1:1"), BackendSpec("127.0.0.1:2"))
        )
        without_a = PoolSnapshot("p", backends=(BackendSpec("127.0.0.1:2"),))
        dispatcher.adopt((with_a,))
        first = dispatcher.pools["p"].backends[0]
        first.tag.counts.streams += 3
        for _ in range(5):
            dispatcher.adopt((without_a,))
            dispatcher.adopt((with_a,))
        again = dispatcher.pools["p"].backends[0]
        assert again is not first  # a new Backend object...
        assert again.tag is first.tag  # ...with the same handles and counts
        assert len(dispatcher.tags) == 2
        dispatcher.publish_counts()
        tally.publish()
        assert first.tag.streams._value.get() == 3

    asyncio.run(main())
