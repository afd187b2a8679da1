"""Health: a Node.js backend killed under load is taken out (active checks, and
connect retries until then), and rejoins after its rise count once it is back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import PkiFiles, run_async
from tests.integration.origin_harness import (
    admin_request,
    http_get,
    needs_node,
    node_backends,
    origin_config,
    origin_process,
    pool,
)
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


async def wait_health(url: str, address: str, healthy: bool, timeout: float = 10.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, status = await admin_request("GET", f"{url}/backends")
        if status["web"][address]["healthy"] is healthy:
            return time.monotonic()
        await asyncio.sleep(0.02)
    raise AssertionError(f"{address} never became healthy={healthy}")


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
                await asyncio.sleep(0.3)
                killed_at = time.monotonic()
                victim.kill()
                detected_at = await wait_health(origin.admin_url, victim.address, False)
                await asyncio.sleep(0.5)
                load.running = False
                await asyncio.gather(*clients)
                victim.start()  # back on the same port
                restarted_at = time.monotonic()
                rejoined_at = await wait_health(origin.admin_url, victim.address, True)
                load.running = True
                after = Load()
                after_clients = [
                    asyncio.get_running_loop().create_task(after.client(connections[i % 2]))
                    for i in range(4)
                ]
                await asyncio.sleep(0.5)
                after.running = False
                await asyncio.gather(*after_clients)
                return {
                    "load": load.results,
                    "after": after.results,
                    "killed_at": killed_at,
                    "detected_at": detected_at,
                    "restarted_at": restarted_at,
                    "rejoined_at": rejoined_at,
                }

            out = run_async(main(), 60)
    results: list[tuple[float, int | None]] = out["load"]  # type: ignore[assignment]
    before = [b for t, b in results if t < out["killed_at"]]  # type: ignore[operator]
    between = [b for t, b in results if out["killed_at"] <= t < out["detected_at"]]  # type: ignore[operator]
    later = [b for t, b in results if t >= out["detected_at"] + 0.05]  # type: ignore[operator]
    assert victim.port in before
    # only streams in flight at the kill can fail: one per client at most
    assert sum(1 for b in between if b is None) <= 4
    assert len(later) > 20
    assert None not in later and victim.port not in later
    # detection took about fall (2) checks at 0.2 s
    assert out["detected_at"] - out["killed_at"] < 3.0  # type: ignore[operator]
    # rise 2: two passing checks, at least one interval apart
    assert out["rejoined_at"] - out["restarted_at"] >= 0.15  # type: ignore[operator]
    after_results: list[tuple[float, int | None]] = out["after"]  # type: ignore[assignment]
    assert None not in [b for _, b in after_results]
    assert sum(1 for _, b in after_results if b == victim.port) > len(after_results) / 10
    messages = [(r.get("msg"), r.get("backend")) for r in origin.logs()]
    assert ("backend is down", victim.address) in messages
    assert ("backend is up", victim.address) in messages
