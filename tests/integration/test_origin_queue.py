"""Per-backend caps queue instead of failing (HAProxy's maxconn + timeout queue):
real edge, origin and Node; one backend capped at one request at a time."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path
from typing import Any

import pytest

from origin.queue import StreamQueue
from tests.conftest import PkiFiles, run_async, scaled
from tests.edge_env import Stack, edge_stack, node_available

pytestmark = pytest.mark.skipif(not node_available(), reason="run `make node` first")


def slow_gets(stack: Stack, count: int, ms: int) -> list[tuple[int, float]]:
    """``count`` concurrent GETs of a ``ms`` response: (status, seconds) each."""

    def one(index: int) -> tuple[int, float]:
        started = time.monotonic()
        status, _ = stack.get(f"/slow?ms={ms}&i={index}")
        return status, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def origin_lines(stack: Stack) -> list[dict[str, object]]:
    return [
        json.loads(line)
        for line in stack.origin_log.read_text(errors="replace").splitlines()
        if line.startswith('{"ts"') and '"/slow?' in line
    ]


def test_requests_beyond_the_cap_wait_their_turn_and_all_are_served(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    extra = "max_connections_per_backend = 1\nqueue_timeout_s = 10.0\n"
    with edge_stack(test_pki, tmp_path, origin_pool_extra=extra) as stack:
        results = slow_gets(stack, 3, 700)
        time.sleep(2.5)  # the origin's access log is flushed every 2 s
        lines = origin_lines(stack)
    assert [status for status, _ in results] == [200, 200, 200]
    # One at a time: the last one waited for the two before it.
    assert max(seconds for _, seconds in results) >= 3 * 0.7 - 0.1
    queued = sorted(line["queue_ms"] or 0 for line in lines)
    assert len(lines) == 3 and queued[0] == 0 and queued[-1] >= 1200, queued


def test_a_request_that_waits_past_the_queue_timeout_gets_a_503(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    extra = "max_connections_per_backend = 1\nqueue_timeout_s = 0.5\n"
    with edge_stack(test_pki, tmp_path, origin_pool_extra=extra) as stack:
        results = slow_gets(stack, 3, 2000)
        metrics = stack.origin_metrics()
    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 503, 503]
    for status, seconds in results:
        if status == 503:  # turned away at the queue timeout, not at once
            assert 0.4 < seconds < scaled(2.0), seconds
    assert 'geoedge_origin_stream_failures_total{pool="app",reason="QUEUE_TIMEOUT"} 2.0' in metrics


def test_the_queue_is_first_come_first_served_and_bounded() -> None:
    async def scenario() -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        queue = StreamQueue(max_queued=2)
        first, second, third = (loop.create_future() for _ in range(3))
        assert queue.join(first) and queue.join(second)
        assert not queue.join(third)  # full: turned away at once
        queue.leave(first)  # gave up (its timeout)
        assert queue.wake_next() and second.done() and len(queue) == 0
        assert not queue.wake_next()

    run_async(scenario(), 5)


def test_two_streams_opened_in_one_tunnel_read_do_not_both_take_a_capped_backend(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    """Two OPENs that arrive in one read of the tunnel are dispatched in one turn
    of the origin's loop, before either connect task runs: the first must count
    against the backend's cap as it is chosen, or both go to it at once."""
    import asyncio

    from tests.integration.origin_harness import (
        CLIENT,
        SERVER,
        node_backends,
        origin_config,
        origin_in_process,
        pool,
    )
    from tests.tunnel_env import connect, dial_config, open_io

    slow_ms = 600
    with node_backends(tmp_path, 1) as nodes:
        capped = pool(
            [nodes[0].address], health=False, max_connections_per_backend=1, queue_timeout_s=10.0
        )
        config = origin_config(test_pki, [capped])
        port = int(config.tunnel_listener.address.rpartition(":")[2])

        async def main() -> list[float]:
            async with origin_in_process(config):
                connection = await connect(dial_config(test_pki, port))
                loop = asyncio.get_running_loop()
                started = loop.time()
                ios = []
                for index in range(2):  # no await in between: one flush, one tunnel write
                    io = open_io(
                        connection, client_address=CLIENT, server_address=SERVER, host="app.test"
                    )
                    io.write(
                        f"GET /slow?ms={slow_ms}&i={index} HTTP/1.1\r\nHost: app.test\r\n"
                        "Connection: close\r\n\r\n".encode()
                    )
                    ios.append(io)

                async def answered(io: Any) -> float:
                    data = await io.read_all()
                    io.write_eof()  # the stream ends (and frees its slot) as an edge ends it
                    assert data.startswith(b"HTTP/1.1 200 "), data[:100]
                    return loop.time() - started

                took = await asyncio.gather(*(answered(io) for io in ios))
                connection.abort()
                return sorted(took)

        first, second = run_async(main(), 30)
    # One at a time: the second waited for the first (both at once: ~0.6 s each).
    assert first >= slow_ms / 1000 - 0.05
    assert second >= 2 * slow_ms / 1000 - 0.1, (first, second)
