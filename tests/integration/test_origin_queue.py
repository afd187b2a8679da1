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
from tests.polling import wait_for, wait_until

pytestmark = pytest.mark.skipif(not node_available(), reason="run `make node` first")


def gets(stack: Stack, paths: list[str]) -> list[tuple[int, float]]:
    """Concurrent GETs of ``paths``: (status, seconds) each."""

    def one(path: str) -> tuple[int, float]:
        started = time.monotonic()
        status, _ = stack.get(path)
        return status, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(len(paths)) as pool:
        return list(pool.map(one, paths))


def origin_lines(stack: Stack, marker: str) -> list[dict[str, object]]:
    return [
        json.loads(line)
        for line in stack.origin_log.read_text(errors="replace").splitlines()
        if line.startswith('{"ts"') and marker in line
    ]


#: Held at Node until the test releases it: the capped backend stays busy for
#: as long as the test needs, however slow the machine.
HELD = f"/gate?n=2&group=queue&ms={int(scaled(120) * 1000)}"


def with_the_backend_held(stack: Stack, others: list[str], then: Any) -> list[tuple[int, float]]:
    """GET :data:`HELD` (it takes the one connection the backend may have), then
    ``others`` at once; ``then()`` runs once they are all queued or answered,
    and the held request is released. The statuses and times, held one first."""
    streams = stack.origin_count("geoedge_origin_streams_total")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = pool.submit(gets, stack, [HELD])
        wait_until(
            lambda: stack.origin_count("geoedge_origin_streams_total") > streams,
            "the held request never reached Node",
        )
        rest = pool.submit(gets, stack, others)
        then(rest)
        stack.answer_gate(HELD)
        return held.result(timeout=scaled(60)) + rest.result(timeout=scaled(60))


def test_requests_beyond_the_cap_wait_their_turn_and_all_are_served(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    extra = "max_connections_per_backend = 1\nqueue_timeout_s = 60.0\n"
    with edge_stack(test_pki, tmp_path, origin_pool_extra=extra) as stack:

        def both_queued(_: object) -> None:  # one at a time: the two wait their turn
            wait_until(
                lambda: stack.origin_count("geoedge_origin_queue_length") == 2,
                "the two were not queued behind the held one",
            )

        results = with_the_backend_held(stack, ["/ip?turn=1", "/ip?turn=2"], both_queued)
        lines = wait_until(  # the origin's access log is flushed every 2 s
            lambda: (found := origin_lines(stack, '"/ip?turn=')) and len(found) == 2 and found,
            "no access-log lines for the queued requests",
        )
    assert [status for status, _ in results] == [200, 200, 200]
    queued = sorted(line["queue_ms"] or 0 for line in lines)
    assert queued[0] > 0 and queued[1] > 0, queued  # both waited for the held one


def test_a_request_that_waits_past_the_queue_timeout_gets_a_503(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    extra = "max_connections_per_backend = 1\nqueue_timeout_s = 0.5\n"
    with edge_stack(test_pki, tmp_path, origin_pool_extra=extra) as stack:

        def both_answered(rest: concurrent.futures.Future[Any]) -> None:
            rest.result(timeout=scaled(60))  # the backend stays held meanwhile

        results = with_the_backend_held(stack, ["/ip?late=1", "/ip?late=2"], both_answered)
        metrics = wait_for(
            stack.origin_metrics,
            lambda text: "QUEUE_TIMEOUT" in text,
            "no queue timeout counted",
        )
    assert [status for status, _ in results] == [200, 503, 503]
    for _, seconds in results[1:]:  # turned away at the queue timeout, not at once
        assert seconds > 0.4, seconds  # (a lower bound: load only adds to it)
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
    against the backend's cap as it is chosen, or both go to it at once. Node's
    /gate counts them: both at once open it (200, together 2); one at a time,
    each waits out the gate alone (504, together 1)."""
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

    gate_ms = 2000  # how long two at once have to meet (only a broken cap lets them)
    with node_backends(tmp_path, 1) as nodes:
        capped = pool(
            [nodes[0].address], health=False, max_connections_per_backend=1, queue_timeout_s=10.0
        )
        config = origin_config(test_pki, [capped])
        port = int(config.tunnel_listener.address.rpartition(":")[2])

        async def main() -> list[bytes]:
            async with origin_in_process(config):
                connection = await connect(dial_config(test_pki, port))
                ios = []
                for index in range(2):  # no await in between: one flush, one tunnel write
                    io = open_io(
                        connection, client_address=CLIENT, server_address=SERVER, host="app.test"
                    )
                    io.write(
                        f"GET /gate?n=2&group=cap&ms={gate_ms}&i={index} HTTP/1.1\r\n"
                        "Host: app.test\r\nConnection: close\r\n\r\n".encode()
                    )
                    ios.append(io)

                async def answered(io: Any) -> bytes:
                    data = await io.read_all()
                    io.write_eof()  # the stream ends (and frees its slot) as an edge ends it
                    return bytes(data)

                answers = await asyncio.gather(*(answered(io) for io in ios))
                connection.abort()
                return answers

        answers = run_async(main(), 60)
    for data in answers:  # one at a time: each was alone at the backend
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 504 "), data[:200]
        assert json.loads(body) == {"together": 1, "wanted": 2}
