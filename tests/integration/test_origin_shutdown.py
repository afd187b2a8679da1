"""Operations on the real daemon (``python -m origin``): SIGTERM drains (GOAWAY,
an in-flight request finishes, new streams go to the other origin), the drain
deadline resets what is left, SIGHUP reloads the pools and refuses a bad file.

The in-flight request is held at Node (``/gate``) until the test releases it,
so it is in flight at the moment that matters however slow the machine; not a
large ``/bytes`` download read at a throttled pace, which would make the test
measure flow control instead of the drain."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from geoedge.config_render import config_to_toml
from tests.conftest import PkiFiles, run_async, scaled
from tests.integration.origin_harness import (
    gate,
    http_get,
    needs_node,
    node_backends,
    origin_config,
    origin_process,
    pool,
    release_gate,
    streams_started,
    wait_streams_started,
    with_pools,
)
from tests.polling import wait_until_async
from tests.tunnel_env import connect, dial_config
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.errors import StreamResetError
from tunnel.policy import choose_connection

pytestmark = needs_node


def test_sigterm_drains_while_new_streams_go_to_the_other_origin(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with node_backends(tmp_path, 2) as nodes:
        backends = [pool([n.address for n in nodes])]
        config_a = origin_config(test_pki, backends, workers=2, drain_timeout_s=20.0)
        config_b = origin_config(test_pki, backends, workers=1)
        with (
            origin_process(tmp_path, config_a, "a") as origin_a,
            origin_process(tmp_path, config_b, "b") as origin_b,
        ):

            async def main() -> dict[str, object]:
                await origin_a.wait_ready()
                await origin_b.wait_ready()
                conn_a = await connect(dial_config(test_pki, origin_a.port))
                conn_b = await connect(dial_config(test_pki, origin_b.port))
                # a request in flight on A, held at Node until the test releases it
                started = await streams_started(config_a)
                download = asyncio.get_running_loop().create_task(
                    http_get(conn_a, gate("download"))
                )
                await wait_streams_started(config_a, started)
                origin_a.signal(signal.SIGTERM)
                await wait_until_async(lambda: conn_a.goaway_received, "no GOAWAY from A")
                chosen, statuses = [], []
                for _ in range(20):
                    connection = choose_connection([conn_a, conn_b])
                    assert connection is not None
                    chosen.append("a" if connection is conn_a else "b")
                    statuses.append((await http_get(connection, "/ip")).status)
                alive_during = origin_a.process.poll() is None  # type: ignore[union-attr]
                await release_gate(nodes, "download")
                slow = await asyncio.wait_for(download, scaled(30))
                finished_at = time.monotonic()
                code = await asyncio.to_thread(origin_a.wait, 30)
                exited_at = time.monotonic()
                conn_b.abort()
                return {
                    "goaway": conn_a.goaway_received,
                    "chosen": chosen,
                    "statuses": statuses,
                    "alive_during": alive_during,
                    "slow": (slow.status, slow.body),
                    "code": code,
                    "exit_after_s": exited_at - finished_at,
                }

            out = run_async(main(), 120)
            logs = origin_a.logs()
    assert out["goaway"] is True
    assert out["chosen"] == ["b"] * 20 and out["statuses"] == [200] * 20
    assert out["alive_during"] is True  # still serving the download
    assert out["slow"] == (200, b'{"together":2}\n')  # in flight: completed
    assert out["code"] == 0
    # Out once the last stream ended, well short of drain_timeout_s (20 s); the
    # log has no "drain deadline passed" either (below).
    assert out["exit_after_s"] < 0.75 * config_a.origin.drain_timeout_s
    assert any(r.get("msg") == "draining: GOAWAY sent to edges" for r in logs)
    assert not any("drain deadline passed" in str(r.get("msg")) for r in logs)


def test_drain_deadline_resets_what_is_left(test_pki: PkiFiles, tmp_path: Path) -> None:
    with node_backends(tmp_path, 1) as nodes:
        config = origin_config(test_pki, [pool([nodes[0].address])], drain_timeout_s=1.0)
        with origin_process(tmp_path, config) as origin:

            async def main() -> tuple[float, int]:
                await origin.wait_ready()
                connection = await connect(dial_config(test_pki, origin.port))
                started = await streams_started(config)
                held = asyncio.get_running_loop().create_task(
                    http_get(connection, gate("never"))  # held at Node, never released
                )
                await wait_streams_started(config, started)
                began = time.monotonic()
                origin.signal(signal.SIGTERM)
                # Only the deadline can end it: Node holds it for two minutes.
                with pytest.raises((StreamResetError, ConnectionError)):
                    await asyncio.wait_for(held, scaled(30))
                reset_after = time.monotonic() - began
                code = await asyncio.to_thread(origin.wait, 30)
                return reset_after, code

            reset_after, code = run_async(main(), 90)
    assert reset_after > 0.8  # not before the 1 s deadline (a lower bound: load only adds)
    assert code == 0


def test_sighup_reloads_the_pools_in_new_workers_and_keeps_them_on_a_bad_file(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    """SIGHUP replaces the workers (geoedge.reload): the old ones send GOAWAY
    once the new ones listen, a stream in flight finishes on its old worker,
    new connections see the new pools. A bad file is refused: nothing changes,
    no connection is told to go away, and the log names the key."""
    with node_backends(tmp_path, 2) as nodes:
        first, second = nodes
        config = origin_config(test_pki, [pool([first.address])], workers=2)
        with origin_process(tmp_path, config) as origin:

            async def backends_seen(connection: TunnelConnection, n: int = 10) -> set[int]:
                return {(await http_get(connection, "/ip")).json()["backend"] for _ in range(n)}

            async def main() -> dict[str, object]:
                await origin.wait_ready()
                dial = dial_config(test_pki, origin.port)
                connections = [await connect(dial) for _ in range(3)]  # likely both workers
                before = set().union(*[await backends_seen(c) for c in connections])
                started = await streams_started(config)
                in_flight = asyncio.get_running_loop().create_task(
                    http_get(connections[0], gate("reload"))
                )
                await wait_streams_started(config, started)  # held at the first backend
                origin.config_path.write_text(
                    config_to_toml(with_pools(config, [pool([second.address])]))
                )
                origin.signal(signal.SIGHUP)
                # The old workers hand over (GOAWAY) once the new ones serve the
                # new pool; the stream held at the first backend is still theirs.
                await wait_until_async(
                    lambda: all(c.goaway_received for c in connections),
                    "the old workers never sent GOAWAY",
                )
                await release_gate([first], "reload")
                slow_status = (await in_flight).status
                fresh = await connect(dial)
                after = await backends_seen(fresh)
                origin.config_path.write_text(
                    origin.config_path.read_text().replace("[[pools]]", "[[poolz]]")
                )
                origin.signal(signal.SIGHUP)
                # The parent read the bad file and said so: nothing was replaced.
                await wait_until_async(
                    lambda: any("reload refused" in str(r.get("msg")) for r in origin.logs()),
                    "the bad file was never refused",
                )
                after_bad = await backends_seen(fresh)
                alive = origin.process.poll() is None  # type: ignore[union-attr]
                told_to_go = fresh.goaway_received
                for connection in [*connections, fresh]:
                    connection.abort()
                return {
                    "before": before,
                    "after": after,
                    "slow": slow_status,
                    "after_bad": after_bad,
                    "alive": alive,
                    "told_to_go": told_to_go,
                }

            out = run_async(main(), 90)
            logs = origin.logs()
    assert out["before"] == {first.port}
    assert out["after"] == {second.port}
    assert out["slow"] == 200  # the stream in flight across the reload finished
    assert out["after_bad"] == {second.port} and out["alive"] is True
    assert out["told_to_go"] is False  # the refused reload replaced no worker
    rejected = [r for r in logs if "reload refused" in str(r.get("msg"))]
    assert len(rejected) == 1 and "poolz" in rejected[0]["msg"]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited (nobody may reap an orphan here)


def test_workers_leave_when_the_parent_dies(test_pki: PkiFiles, tmp_path: Path) -> None:
    """SIGKILL on the parent: workers see their control pipe close and drain out."""
    with node_backends(tmp_path, 1) as nodes:
        config = origin_config(
            test_pki, [pool([nodes[0].address])], workers=2, drain_timeout_s=60.0
        )
        with origin_process(tmp_path, config) as origin:

            async def main() -> tuple[list[int], float]:
                await origin.wait_ready()
                pid = origin.process.pid  # type: ignore[union-attr]
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                workers = [int(p) for p in children]
                origin.signal(signal.SIGKILL)
                began = time.monotonic()
                while any(alive(p) for p in workers) and time.monotonic() - began < 45:
                    await asyncio.sleep(0.05)
                return workers, time.monotonic() - began

            workers, took = run_async(main(), 90)
    assert len(workers) == 2
    assert not any(alive(p) for p in workers)
    # Nothing was in flight: out well before drain_timeout_s (60 s), which is
    # what a worker that missed its parent's death would wait for at most.
    assert took < 30
