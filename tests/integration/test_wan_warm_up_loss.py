"""The tunnel's warm-up on a path that loses packets (tunnel/aio/warmup.py, IMPLEMENTATION.md §N10).

A real tunnel (plain TCP, as inside WireGuard) between the emulator's ``edge``
and ``origin`` namespaces, 40 ms apart with 5% random loss each way, so that
the padding meets a loss within its first few dozen segments. Under CUBIC the
padding must stop at that first retransmission (padding on only buys more
30% cuts); under BBR, which does not take random loss as congestion, it must
pad on past it. Each side reports its own direction's outcome. Skipped where
the emulator cannot run.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests.wan.emulator import WanEmulator, available_congctls, unsupported_reason

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
PORT = 7443

# argv: role (server|client), origin address, congestion control. Brings one
# tunnel connection up, waits for its warm-up to end, prints one JSON line:
# the warm-up's last log message and the socket's retransmits, then exits.
PEER = textwrap.dedent(
    """
    import asyncio, ipaddress, json, logging, sys
    from tunnel.aio.tcp_info import congestion_control
    from tunnel.aio.transport import (
        TunnelDialConfig, TunnelListenerConfig, dial_tunnel, serve_tunnel)
    from tunnel.mux import SessionConfig

    role, origin, cc = sys.argv[1], sys.argv[2], sys.argv[3]
    said = []
    class Keep(logging.Handler):
        def emit(self, record):
            if "warm-up" in record.getMessage():
                said.append(record.getMessage())
    logging.getLogger("geoedge.tunnel").addHandler(Keep())
    logging.getLogger("geoedge.tunnel").setLevel(logging.INFO)
    config = SessionConfig(congestion_control=cc)

    async def report(connection):
        for _ in range(400):
            if connection.warm_up is not None and not connection.warm_up.active:
                break
            await asyncio.sleep(0.05)
        info = connection.tcp_info()
        print(json.dumps({"said": said[-1] if said else None,
                          "cc": congestion_control(connection.get_extra_info("socket")),
                          "sent": connection.warm_up.sent if connection.warm_up else None,
                          "retrans": info.total_retrans if info else None}), flush=True)

    async def main():
        if role == "server":
            done = asyncio.get_running_loop().create_future()
            listener = TunnelListenerConfig(
                address=f"{origin}:7443", transport="tcp",
                allowed_peers=(ipaddress.ip_network("198.18.0.0/15"),),
                allow_public_plaintext=True)
            server = await serve_tunnel(
                listener, config, lambda stream: None,
                on_connection=lambda c: c.established.add_done_callback(
                    lambda _: done.set_result(c)))
            print("ready", flush=True)
            connection = await asyncio.wait_for(done, 30)
            await report(connection)
            await asyncio.sleep(2)
            server.close()
        else:
            connection = await dial_tunnel(
                TunnelDialConfig(address=f"{origin}:7443", transport="tcp"), config)
            await report(connection)
            await asyncio.sleep(2)
            connection.abort("done")

    asyncio.run(main())
    """
)


@pytest.fixture(scope="module")
def wan() -> Iterator[WanEmulator]:
    reason = unsupported_reason()
    if reason is not None:
        pytest.skip(f"WAN emulator unavailable: {reason}")
    with WanEmulator(delays_ms={"edge-origin": 20.0}, loss={"edge-origin": 0.05}) as emulator:
        yield emulator


def warm_up(wan: WanEmulator, cc: str) -> dict[str, dict[str, object]]:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    origin = wan.address("origin")
    server = wan.popen(
        "origin", [sys.executable, "-c", PEER, "server", origin, cc],
        stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    assert server.stdout is not None
    ready, _, _ = select.select([server.stdout], [], [], 20.0)
    assert ready and server.stdout.readline().strip() == "ready"
    client = wan.popen(
        "edge", [sys.executable, "-c", PEER, "client", origin, cc],
        stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    out: dict[str, dict[str, object]] = {}
    for role, proc in (("edge", client), ("origin", server)):
        stdout, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, (role, stdout)
        out[role] = json.loads(stdout.strip().splitlines()[-1])
    return out


def test_under_cubic_the_padding_stops_at_the_first_loss(wan: WanEmulator) -> None:
    outcome = warm_up(wan, "cubic")
    for side, seen in outcome.items():
        assert seen["cc"] == "cubic", outcome
        # 5% loss: padding of a few hundred KB meets a loss early, and stops there.
        assert seen["retrans"] and "stopped at the first loss" in str(seen["said"]), (side, seen)


def test_under_bbr_the_padding_goes_on_past_a_loss(wan: WanEmulator) -> None:
    if "bbr" not in available_congctls():
        pytest.skip("this kernel has no BBR")
    outcome = warm_up(wan, "bbr")
    for side, seen in outcome.items():
        assert seen["cc"] == "bbr", outcome
        assert seen["retrans"], (side, seen)  # it met loss, and went on
        assert "stopped at the first loss" not in str(seen["said"]), (side, seen)
        assert seen["said"] is not None, (side, seen)
