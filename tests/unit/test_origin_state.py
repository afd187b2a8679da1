"""The control plane's pure state: membership, health verdicts, drains, reloads,
and the snapshots they render."""

from __future__ import annotations

from dataclasses import replace

import pytest

from origin.config import (
    BackendConfig,
    DnsConfig,
    HealthCheckConfig,
    OriginConfig,
    PoolConfig,
)
from origin.state import ControlState, UnknownBackend
from tunnel.aio.transport import TunnelListenerConfig

LISTENER = TunnelListenerConfig(
    address="127.0.0.1:1",
    transport="tcp",
    allowed_peers=(__import__("ipaddress").ip_network("10.0.0.0/8"),),
)
CHECK = HealthCheckConfig(interval_s=1.0, timeout_s=0.5, rise=2, fall=2)


def config(*pools: PoolConfig) -> OriginConfig:
    return OriginConfig(tunnel_listener=LISTENER, pools=pools)


def web(*addresses: str, health: HealthCheckConfig | None = CHECK, **kw: object) -> PoolConfig:
    return PoolConfig(
        name="web",
        default=True,
        health=health,
        backends=tuple(BackendConfig(a) for a in addresses),
        **kw,  # type: ignore[arg-type]
    )


def backends(state: ControlState, pool: str = "web") -> dict[str, tuple[bool, bool, float]]:
    snap = next(s for s in state.snapshots() if s.name == pool)
    return {b.address: (b.healthy, b.drained, b.up_since) for b in snap.backends}


def test_backends_start_healthy_without_slow_start() -> None:
    state = ControlState(config(web("10.0.0.1:80", "10.0.0.2:80")), now=0.0)
    assert backends(state) == {
        "10.0.0.1:80": (True, False, float("-inf")),
        "10.0.0.2:80": (True, False, float("-inf")),
    }
    assert state.usable_backends() == 2


def test_fall_and_rise_flip_the_verdict_and_start_slow_start() -> None:
    state = ControlState(config(web("10.0.0.1:80")), now=0.0)
    assert not state.observe_health("web", "10.0.0.1:80", False, 1.0)
    assert state.observe_health("web", "10.0.0.1:80", False, 2.0)
    assert backends(state)["10.0.0.1:80"][0] is False
    assert state.usable_backends() == 0
    assert not state.observe_health("web", "10.0.0.1:80", True, 3.0)
    assert state.observe_health("web", "10.0.0.1:80", True, 4.0)
    assert backends(state)["10.0.0.1:80"] == (True, False, 4.0)


def test_results_for_unknown_backends_are_ignored() -> None:
    state = ControlState(config(web("10.0.0.1:80")), now=0.0)
    assert not state.observe_health("web", "10.9.9.9:80", False, 1.0)
    assert not state.observe_health("nope", "10.0.0.1:80", False, 1.0)


def test_drain_is_kept_and_checked() -> None:
    state = ControlState(config(web("10.0.0.1:80", "10.0.0.2:80")), now=0.0)
    assert state.set_drained("web", "10.0.0.1:80", True)
    assert not state.set_drained("web", "10.0.0.1:80", True)
    assert backends(state)["10.0.0.1:80"][1] is True
    assert state.usable_backends() == 1
    with pytest.raises(UnknownBackend):
        state.set_drained("web", "10.0.0.3:80", True)
    with pytest.raises(UnknownBackend):
        state.set_drained("api", "10.0.0.1:80", True)
    assert state.set_drained("web", "10.0.0.1:80", False)
    assert state.usable_backends() == 2


def test_discovered_members_join_static_ones_with_slow_start() -> None:
    dns = DnsConfig(name="app.test", port=80)
    pool = replace(web("10.0.0.1:80"), dns=dns)
    state = ControlState(config(pool), now=0.0)
    assert state.set_discovered("web", (("10.0.0.2:80", 1), ("10.0.0.1:80", 5)), now=7.0)
    assert not state.set_discovered("web", (("10.0.0.1:80", 5), ("10.0.0.2:80", 1)), now=8.0)
    snap = state.snapshots()[0]
    assert [(b.address, b.weight, b.up_since) for b in snap.backends] == [
        ("10.0.0.1:80", 1, float("-inf")),  # the static entry wins
        ("10.0.0.2:80", 1, 7.0),
    ]
    assert set(state.check_targets()) == {("web", "10.0.0.1:80"), ("web", "10.0.0.2:80")}
    assert state.set_discovered("web", (), now=9.0)
    assert list(backends(state)) == ["10.0.0.1:80"]


def test_reload_keeps_what_stays_and_drops_what_goes() -> None:
    state = ControlState(config(web("10.0.0.1:80", "10.0.0.2:80")), now=0.0)
    state.observe_health("web", "10.0.0.1:80", False, 1.0)
    state.observe_health("web", "10.0.0.1:80", False, 2.0)
    state.set_drained("web", "10.0.0.2:80", True)
    state.reload(config(web("10.0.0.1:80", "10.0.0.3:80", algorithm="round_robin")), now=5.0)
    snap = state.snapshots()[0]
    assert snap.algorithm == "round_robin"
    assert backends(state) == {
        "10.0.0.1:80": (False, False, float("-inf")),
        "10.0.0.3:80": (True, False, 5.0),
    }
    # dropping the health checks brings a down backend back
    state.reload(config(web("10.0.0.1:80", health=None)), now=6.0)
    assert backends(state) == {"10.0.0.1:80": (True, False, 6.0)}
    assert state.check_targets() == {}


def test_a_cap_per_host_is_shared_among_the_workers() -> None:
    """max_connections_per_backend is the host's: four workers enforce a
    quarter each (rounded up), one worker all of it, and no cap stays none."""
    from origin.config import OriginSection

    capped = web("10.0.0.1:80", max_connections_per_backend=10)
    for workers, share in ((1, 10), (4, 3), (16, 1)):
        state = ControlState(
            replace(config(capped), origin=OriginSection(workers=workers)), now=0.0
        )
        [snapshot] = state.snapshots()
        assert snapshot.max_connections_per_backend == share, workers
    state = ControlState(replace(config(web("10.0.0.1:80")), origin=OriginSection(workers=4)), 0.0)
    assert state.snapshots()[0].max_connections_per_backend == 0
