"""Health: a Node.js backend killed under load is taken out (active checks, and
connect retries until then), and rejoins after its rise count once it is back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import PkiFiles, run_async, scaled
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
from tests.tunnel_env import connect, dial_config
from tunnel.aio.connection import TunnelConnection

pytestmark = needs_node


@dataclass
class Load:
    """Requests in a loop until stopped: (start time, backend port or None)."""

    results: list[tuple[float, int | None]] = field(default_factory=list)
    running: bool = True

    async def client(self, connection: TunnelConnection) -> None:
        while self.running:
            began = time.monotonic()
            try:
                backend = (await http_get(connection, "/ip")).json()["backend"]
            except (ConnectionError, ValueError):
                backend = None
            self.results.append((began, backend))


async def wait_health(url: str, address: str, healthy: bool, timeout: float = 20.0) -> float:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        _, status = await admin_request("GET", f"{url}/backends")
        if status["web"][address]["healthy"] is healthy:
            return time.monotonic()
        await asyncio.sleep(0.02)
    raise AssertionError(f"{address} never became healthy={healthy}")


async def passed_checks(url: str, address: str) -> float:
    _, text = await admin_request("GET", f"{url}/metrics")
    having = f'backend="{address}"'
    return sum(
        v
        for k, v in metric_values(str(text), "geoedge_origin_health_checks_total").items()
        if having in k and 'result="pass"' in k
    )


async def wait_count(load: Load, count: int, what: str) -> None:
    await wait_until_async(lambda: len(load.results) >= count, what, interval_s=0.05)


def test_killed_backend_is_taken_out_and_rejoins_after_rise(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with node_backends(tmp_path, 3) as nodes:
        victim = nodes[1]
        config = origin_config(test_pki, [pool([n.address for n in nodes])], workers=2)
        with origin_process(tmp_path, config) as origin:

            async def main() -> dict[str, object]:
                await origin.wait_ready()
                dial = dial_config(test_pki, origin.port)
                connections = [await connect(dial) for _ in range(2)]
                load = Load()
                clients = [
                    asyncio.get_running_loop().create_task(load.client(connections[i % 2]))
                    for i in range(4)
                ]
                await wait_until_async(  # the victim served some of the load
                    lambda: any(b == victim.port for _, b in load.results), "victim unused"
                )
                killed_at = time.monotonic()
                victim.kill()
                detected_at = await wait_health(origin.admin_url, victim.address, False)
                await wait_until_async(  # the streams the assertions call "later"
                    lambda: sum(t >= detected_at + 0.05 for t, _ in load.results) > 20,
                    "the load stopped after the kill",
                )
                load.running = False
                await asyncio.gather(*clients)
                passes = await passed_checks(origin.admin_url, victim.address)  # none while down
                victim.start()  # back on the same port
                rejoined_at = await wait_health(origin.admin_url, victim.address, True)
                # Read right after the state: the checks that made it healthy.
                rise = await passed_checks(origin.admin_url, victim.address) - passes
                # Each connection's worker has the news once it sends the victim a stream.
                for connection in connections:

                    async def victim_serves(c: TunnelConnection = connection) -> bool:
                        return (await http_get(c, "/ip")).json()["backend"] == victim.port

                    await wait_until_async(victim_serves, "the victim got no stream back")
                after = Load()
                after_clients = [
                    asyncio.get_running_loop().create_task(after.client(connections[i % 2]))
                    for i in range(4)
                ]
                await wait_count(after, 60, "the load after the rejoin stopped")
                after.running = False
                await asyncio.gather(*after_clients)
                return {
                    "load": load.results,
                    "after": after.results,
                    "killed_at": killed_at,
                    "detected_at": detected_at,
                    "rejoined_at": rejoined_at,
                    "rise": rise,
                }

            out = run_async(main(), 120)
    results: list[tuple[float, int | None]] = out["load"]  # type: ignore[assignment]
    before = [b for t, b in results if t < out["killed_at"]]  # type: ignore[operator]
    between = [b for t, b in results if out["killed_at"] <= t < out["detected_at"]]  # type: ignore[operator]
    later = [b for t, b in results if t >= out["detected_at"] + 0.05]  # type: ignore[operator]
    assert victim.port in before
    # only streams in flight at the kill can fail: one per client at most
    assert sum(1 for b in between if b is None) <= 4
    assert len(later) > 20
    assert None not in later and victim.port not in later
    # Detection takes about fall (2) checks at 0.2 s: the bound is the point
    # (active checks, not the next failed connect), scaled; 5 s is 12 intervals.
    assert out["detected_at"] - out["killed_at"] < scaled(5.0)  # type: ignore[operator]
    # rise 2: two passing checks (read right after the state changed)
    assert out["rise"] >= 2, out["rise"]  # type: ignore[operator]
    after_results: list[tuple[float, int | None]] = out["after"]  # type: ignore[assignment]
    assert None not in [b for _, b in after_results]
    assert sum(1 for _, b in after_results if b == victim.port) > len(after_results) / 10
    messages = [(r.get("msg"), r.get("backend")) for r in origin.logs()]
    assert ("backend is down", victim.address) in messages
    assert ("backend is up", victim.address) in messages
