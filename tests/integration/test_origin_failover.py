"""Connect failures, retries and the codes the edge gets (an origin in process,
real mutual TLS, real Node.js): a closed port is retried elsewhere and ejected;
no backend left gives CONNECT_FAILED or NO_BACKEND; DNS-discovered pools; the
WireGuard-style TCP listener."""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path

import pytest

from origin.config import DnsConfig, PoolConfig
from origin.daemon import OriginDaemon
from tests.conftest import PkiFiles, run_async
from tests.integration.origin_harness import (
    http_get,
    needs_node,
    node_backends,
    origin_config,
    origin_in_process,
    pool,
)
from tests.polling import wait_until_async
from tests.tunnel_env import connect, dial_config, free_port
from tunnel.aio.errors import StreamResetError, TunnelHandshakeError
from tunnel.mux import ErrorCode

pytestmark = needs_node


def test_a_closed_port_is_retried_elsewhere_and_ejected(test_pki: PkiFiles, tmp_path: Path) -> None:
    closed = f"127.0.0.1:{free_port()}"
    with node_backends(tmp_path, 2) as nodes:
        addresses = [closed, *(n.address for n in nodes)]
        config = origin_config(test_pki, [pool(addresses, health=False, algorithm="round_robin")])

        async def main() -> tuple[list[int], bool, float]:
            async with origin_in_process(config) as origin:
                connection = await connect(dial_config(test_pki, config_port(config)))
                backends = [
                    (await http_get(connection, "/ip")).json()["backend"] for _ in range(30)
                ]
                web = origin.worker.pools["web"]
                dead = web.find(closed)
                ejected = dead.ejected(time.monotonic())
                failures = sample(
                    origin, "connect_failures_total", pool="web", backend=closed, reason="refused"
                )
                connection.abort()
                return backends, ejected, failures

        backends, ejected, failures = run_async(main(), 30)
    assert len(backends) == 30 and set(backends) == {n.port for n in nodes}
    assert ejected
    assert failures == 3  # the passive policy's 3 failures, then no more tries


def sample(origin: OriginDaemon, name: str, **labels: str) -> float | None:
    assert origin.worker is not None
    registry = origin.worker.metrics.registry
    return registry.get_sample_value(f"geoedge_origin_{name}", labels)


def config_port(config: object) -> int:
    return int(config.tunnel_listener.address.rpartition(":")[2])  # type: ignore[attr-defined]


def test_all_backends_down_resets_with_connect_failed(test_pki: PkiFiles) -> None:
    closed = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    config = origin_config(test_pki, [pool(closed, health=False, connect_retries=1)])

    async def main() -> list[int]:
        async with origin_in_process(config) as origin:
            connection = await connect(dial_config(test_pki, config_port(config)))
            codes = []
            for _ in range(3):
                with pytest.raises(StreamResetError) as info:
                    await http_get(connection, "/ip")
                codes.append(info.value.code)
            connection.abort()
            retries = sample(origin, "connect_retries_total", pool="web")
            assert retries == 3
            return codes

    # two tries per stream (connect_retries = 1); after three failures a backend is
    # ejected, so by the third stream only NO_BACKEND may be left
    codes = run_async(main(), 30)
    assert codes[0] == ErrorCode.CONNECT_FAILED
    assert set(codes) <= {ErrorCode.CONNECT_FAILED, ErrorCode.NO_BACKEND}


def test_no_usable_backend_or_no_pool_resets_with_no_backend(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with node_backends(tmp_path, 1) as nodes:
        pools = [
            pool([nodes[0].address], name="api", hosts=("api.test",), default=False),
            pool([nodes[0].address], name="web", hosts=("www.test",), default=False),
        ]
        config = origin_config(test_pki, pools)

        async def main() -> tuple[int, int, int, int]:
            async with origin_in_process(config) as origin:
                connection = await connect(dial_config(test_pki, config_port(config)))
                ok = (await http_get(connection, "/ip", host="api.test:8443")).status
                by_sni = (await http_get(connection, "/ip", host="", server_name="www.test")).status
                origin.control.drain("api", nodes[0].address, True)
                codes = []
                for host in ("api.test", "nowhere.test"):
                    with pytest.raises(StreamResetError) as info:
                        await http_get(connection, "/ip", host=host)
                    codes.append(info.value.code)
                connection.abort()
                return ok, by_sni, codes[0], codes[1]

        ok, by_sni, drained, unrouted = run_async(main(), 30)
    assert ok == 200 and by_sni == 200
    assert drained == ErrorCode.NO_BACKEND
    assert unrouted == ErrorCode.NO_BACKEND


def test_pool_discovered_in_dns(test_pki: PkiFiles, tmp_path: Path) -> None:
    """``localhost`` A records (via /etc/hosts) with the backend's port."""
    with node_backends(tmp_path, 1) as nodes:
        discovered = PoolConfig(
            name="web",
            default=True,
            dns=DnsConfig(name="localhost", type="A", port=nodes[0].port, interval_s=0.5),
        )
        config = origin_config(test_pki, [discovered])

        async def main() -> tuple[int, dict[str, object]]:
            async with origin_in_process(config) as origin:
                connection = await connect(dial_config(test_pki, config_port(config)))
                backend = (await http_get(connection, "/ip")).json()["backend"]
                connection.abort()
                return backend, origin.control.status()

        backend, status = run_async(main(), 30)
    assert backend == nodes[0].port
    assert list(status["web"]) == [f"127.0.0.1:{nodes[0].port}"]  # type: ignore[call-overload]


def test_tcp_listener_admits_only_allowed_peers(test_pki: PkiFiles, tmp_path: Path) -> None:
    """transport = "tcp" (inside WireGuard): the peer's address is its identity."""
    with node_backends(tmp_path, 1) as nodes:
        allowed = origin_config(
            test_pki,
            [pool([nodes[0].address])],
            transport="tcp",
            allowed_peers=(ipaddress.ip_network("127.0.0.0/8"),),
        )
        refused = origin_config(
            test_pki,
            [pool([nodes[0].address])],
            transport="tcp",
            allowed_peers=(ipaddress.ip_network("10.77.0.0/24"),),
        )

        async def main() -> tuple[int, float]:
            async with origin_in_process(allowed):
                connection = await connect(
                    dial_config(test_pki, config_port(allowed), transport="tcp")
                )
                status = (await http_get(connection, "/ip")).status
                connection.abort()
            async with origin_in_process(refused) as origin:
                with pytest.raises((TunnelHandshakeError, OSError, ConnectionError)):
                    await connect(dial_config(test_pki, config_port(refused), transport="tcp"))
                count = await wait_until_async(  # counted once the origin closed it
                    lambda: sample(origin, "edges_refused_total", reason="peer_not_allowed"),
                    "the refusal was not counted",
                )
            return status, count

        status, count = run_async(main(), 30)
    assert status == 200
    assert count == 1
