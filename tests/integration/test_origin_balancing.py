"""The origin daemon (``python -m origin``, 2 worker processes, mutual TLS) in front
of real Node.js backends: even load, drain through the admin API, the metrics
endpoint. (Its CPU time per 1,000 streams: ``make bench-origin-streams``.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import PkiFiles, run_async
from tests.integration.origin_harness import (
    admin_request,
    http_get,
    metric_values,
    needs_node,
    node_backends,
    origin_config,
    origin_process,
    pool,
)
from tests.polling import wait_until_async
from tests.tunnel_env import connect, dial_config, free_port
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.errors import StreamResetError, TunnelHandshakeError

pytestmark = needs_node

REQUEST = b"GET /ip HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n"  # http_get's


async def load(
    connections: list[TunnelConnection], requests: int, concurrency: int
) -> tuple[Counter[int], int]:
    """``requests`` short streams, ``concurrency`` at a time; (backend counts, failures)."""
    counts: Counter[int] = Counter()
    failures = 0
    queue = iter(range(requests))

    async def client(index: int) -> None:
        nonlocal failures
        for n in queue:
            connection = connections[(index + n) % len(connections)]
            try:
                result = await http_get(connection, "/ip")
                counts[result.json()["backend"]] += 1
            except (ConnectionError, ValueError):
                failures += 1

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return counts, failures


def test_even_load_over_four_backends(test_pki: PkiFiles, tmp_path: Path) -> None:
    """By count: every backend within 10% of the mean. (The origin's CPU per
    1,000 streams is a figure of ``make bench-origin-streams``: a timed test
    on a shared machine measures the machine.)"""
    requests = 4000
    with node_backends(tmp_path, 4) as nodes:
        # Round robin: within 10% of the mean is its promise whatever each
        # backend's speed; least_connections (the default, its own tests in
        # test_origin_balancer*) rightly favours a backend faster at the moment.
        backends = pool([n.address for n in nodes], algorithm="round_robin")
        config = origin_config(test_pki, [backends], workers=2)
        with origin_process(tmp_path, config) as origin:

            async def main() -> tuple[Counter[int], int]:
                await origin.wait_ready()
                dial = dial_config(test_pki, origin.port)
                connections = [await connect(dial) for _ in range(2)]
                await load(connections, 40, 4)  # warm up
                counts, failures = await load(connections, requests, 24)
                for connection in connections:
                    connection.abort()
                return counts, failures

            counts, failures = run_async(main(), 120)
    assert failures == 0
    assert set(counts) == {n.port for n in nodes}
    mean = requests / 4
    for port, count in counts.items():
        assert abs(count - mean) <= 0.10 * mean, (port, counts)


def test_drain_through_the_admin_reaches_every_worker(test_pki: PkiFiles, tmp_path: Path) -> None:
    with node_backends(tmp_path, 3) as nodes:
        config = origin_config(test_pki, [pool([n.address for n in nodes])], workers=2)
        drained = nodes[0]
        with origin_process(tmp_path, config) as origin:

            async def main() -> tuple[Counter[int], Counter[int], list[object]]:
                await origin.wait_ready()
                base = f"{origin.admin_url}/backends/web"
                answers = [
                    await admin_request("POST", f"{base}/{drained.address}/drain"),
                    await admin_request("POST", f"{base}/127.0.0.1:1/drain"),
                    await admin_request("POST", f"{base.replace('web', 'nope')}/x:1/drain"),
                ]
                # several connections, so that both workers serve some of them
                dial = dial_config(test_pki, origin.port)
                connections = [await connect(dial) for _ in range(4)]

                # The workers take the drain from the next snapshot the parent
                # sends, after the admin answered: until a round of 40 misses
                # the backend (a worker still without it would send it a third
                # of its share), then 300 must all miss it.
                async def drained_gets_some() -> bool:
                    counts, _ = await load(connections, 40, 6)
                    return drained.port in counts

                async def drained_gets_none() -> bool:
                    return not await drained_gets_some()

                await wait_until_async(drained_gets_none, "the drain did not reach the workers")
                during, failures = await load(connections, 300, 6)
                assert failures == 0
                answers.append(await admin_request("POST", f"{base}/{drained.address}/undrain"))
                await wait_until_async(drained_gets_some, "the undrain did not reach the workers")
                after, _ = await load(connections, 300, 6)
                answers.append(await admin_request("GET", f"{origin.admin_url}/backends"))
                return during, after, answers

            during, after, answers = run_async(main(), 60)
    drain, unknown_backend, unknown_pool, undrain, listing = answers
    assert drain == (
        200,
        {"pool": "web", "backend": drained.address, "drained": True, "changed": True},
    )
    assert unknown_backend[0] == 404 and unknown_pool[0] == 404
    assert undrain[1]["changed"] is True  # type: ignore[index]
    assert drained.port not in during and sum(during.values()) == 300
    assert after[drained.port] > 50
    assert listing[1]["web"][drained.address]["drained"] is False  # type: ignore[index]


def test_metrics_endpoint_exposes_the_series(test_pki: PkiFiles, tmp_path: Path) -> None:
    """Every listed series, each made to move: streams and bytes (web), connect
    failures and a retry (a pool of closed ports), a drain, a refused edge."""
    with node_backends(tmp_path, 2) as nodes:
        closed = [f"127.0.0.1:{free_port()}" for _ in range(2)]
        pools = [
            pool([n.address for n in nodes]),
            pool(
                closed,
                name="dead",
                hosts=("dead.test",),
                default=False,
                health=False,
                connect_retries=1,
            ),
        ]
        config = origin_config(test_pki, pools, workers=2)
        with origin_process(tmp_path, config) as origin:

            async def main() -> str:
                await origin.wait_ready()
                connection = await connect(dial_config(test_pki, origin.port))
                for _ in range(10):
                    await http_get(connection, "/ip")
                with pytest.raises(StreamResetError):
                    await http_get(connection, "/ip", host="dead.test")
                rogue = dial_config(
                    test_pki,
                    origin.port,
                    cert=test_pki.rogue_edge.cert,
                    key=test_pki.rogue_edge.key,
                )
                with pytest.raises((TunnelHandshakeError, OSError)):
                    await connect(rogue)
                await admin_request(
                    "POST", f"{origin.admin_url}/backends/web/{nodes[1].address}/drain"
                )

                # Workers publish their counts once a second, edge RTTs every 2 s.
                async def published() -> str:
                    _, text = await admin_request("GET", f"{origin.admin_url}/metrics")
                    done = (
                        sum(metric_values(text, "geoedge_origin_streams_total").values()) >= 10
                        and sum(
                            v
                            for k, v in metric_values(text, "geoedge_origin_bytes_total").items()
                            if "to_backend" in k
                        )
                        >= 10 * len(REQUEST)
                        and metric_values(text, "geoedge_origin_edge_rtt_seconds")
                        and metric_values(text, "geoedge_origin_stream_failures_total")
                        and metric_values(text, "geoedge_origin_edges_refused_total")
                        and 1.0 in metric_values(text, "geoedge_origin_backend_drained").values()
                    )
                    return str(text) if done else ""

                text = await wait_until_async(published, "the series were not all published")
                connection.abort()
                return text

            text = run_async(main(), 30)
    streams = metric_values(text, "geoedge_origin_streams_total")
    assert sum(streams.values()) == 10
    used = [key for key, value in streams.items() if value]
    assert len(used) == 2 and all('pool="web"' in key for key in used)
    assert sum(metric_values(text, "geoedge_origin_streams_active").values()) == 0
    bytes_ = metric_values(text, "geoedge_origin_bytes_total")
    assert sum(v for k, v in bytes_.items() if "to_backend" in k) == 10 * len(REQUEST)
    assert sum(v for k, v in bytes_.items() if "from_backend" in k) > 10 * 200
    healthy = metric_values(text, "geoedge_origin_backend_healthy")
    for node in nodes:
        assert healthy[f'{{backend="{node.address}",pool="web"}}'] == 1.0
    drained = metric_values(text, "geoedge_origin_backend_drained")
    assert drained[f'{{backend="{nodes[1].address}",pool="web"}}'] == 1.0
    assert sum(metric_values(text, "geoedge_origin_connect_failures_total").values()) == 2
    assert metric_values(text, "geoedge_origin_connect_retries_total") == {'{pool="dead"}': 1.0}
    assert metric_values(text, "geoedge_origin_stream_failures_total") == {
        '{pool="dead",reason="CONNECT_FAILED"}': 1.0
    }
    refused = metric_values(text, "geoedge_origin_edges_refused_total")
    assert list(refused.values()) == [1.0] and "tls_" in next(iter(refused))
    assert metric_values(text, "geoedge_origin_edges_connected") == {'{edge="edge-1"}': 1.0}
    rtt = metric_values(text, "geoedge_origin_edge_rtt_seconds")
    assert list(rtt) == ['{edge="edge-1"}'] and 0 < rtt['{edge="edge-1"}'] < 1
    assert metric_values(text, "geoedge_origin_workers_running") == {"": 2.0}
    checks = metric_values(text, "geoedge_origin_health_checks_total")
    assert checks and all('result="pass"' in key for key in checks)
