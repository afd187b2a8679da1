"""The WAN emulator's pure logic: pair parsing, defaults, the link model and the delay loop.

No namespaces, no root: the delay loop is fed packet stand-ins that record the
verdict they get, with a fixed clock where time matters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from loadtests.wan import delay as delay_module
from loadtests.wan import emulator as emulator_module
from loadtests.wan.cli import _sysctls
from loadtests.wan.delay import DelayLoop, delay_config
from loadtests.wan.emulator import unsupported_reason
from loadtests.wan.shaper import DelayScheduler, DirectedLink
from loadtests.wan.topology import (
    ADDRESSES,
    DEFAULT_DELAYS_MS,
    ROUTER_ADDRESSES,
    LinkParams,
    WanConfigError,
    build_links,
    directed_pairs,
    parse_assignment,
    parse_pair,
    rtt_ms,
    update_link,
)

# ------------------------------------------------------------------- topology


def test_addresses_are_in_the_benchmark_range_and_distinct() -> None:
    every = [*ADDRESSES.values(), *ROUTER_ADDRESSES.values()]
    assert len(set(every)) == 8
    assert all(a.startswith("198.18.") for a in every)
    assert ADDRESSES["user"] == "198.18.1.2" and ROUTER_ADDRESSES["app"] == "198.18.4.1"


def test_defaults_cover_every_pair_with_the_issue_numbers() -> None:
    links = build_links()
    assert set(links) == set(directed_pairs()) and len(links) == 12
    assert rtt_ms(links, "user", "origin") == 265.0
    assert rtt_ms(links, "user", "edge") == 10.0
    assert rtt_ms(links, "edge", "origin") == 265.0
    assert rtt_ms(links, "origin", "app") == 0.5
    assert rtt_ms(links, "edge", "edge") == 0.0
    assert len(DEFAULT_DELAYS_MS) == 6


def test_pair_spellings() -> None:
    assert parse_pair("user-edge") == ([("user", "edge"), ("edge", "user")], False)
    assert parse_pair("user>edge") == ([("user", "edge")], True)
    assert parse_pair(("origin", "app")) == ([("origin", "app"), ("app", "origin")], False)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [("user-mars", "unknown host 'mars'"), ("user-user", "two different"), ("useredge", "a-b")],
)
def test_bad_pairs_are_named(spec: str, fragment: str) -> None:
    with pytest.raises(WanConfigError, match=fragment) as caught:
        parse_pair(spec)
    assert caught.value.key == spec


def test_directed_settings_beat_undirected_ones_whatever_the_order() -> None:
    links = build_links(delays_ms={"origin>user": 140, "user-origin": 100})
    assert links[("user", "origin")].delay_ms == 100
    assert links[("origin", "user")].delay_ms == 140
    assert rtt_ms(links, "user", "origin") == 240


def test_loss_and_bandwidth_apply_per_direction() -> None:
    links = build_links(loss={"edge>origin": 0.01}, bandwidth_mbit={"user-edge": 20})
    assert links[("edge", "origin")].loss == 0.01 and links[("origin", "edge")].loss == 0.0
    assert links[("user", "edge")].bandwidth_mbit == links[("edge", "user")].bandwidth_mbit == 20
    assert links[("user", "origin")].bandwidth_mbit is None


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"delays_ms": {"user-edge": -1}}, "user>edge.delay_ms"),
        ({"loss": {"user-edge": 1.5}}, "user>edge.loss"),
        ({"bandwidth_mbit": {"user-edge": 0}}, "user>edge.bandwidth_mbit"),
        ({"delays_ms": {"user-edge": "soon"}}, "delays_ms['user-edge']"),
    ],
)
def test_bad_values_name_the_pair_and_field(kwargs: dict, key: str) -> None:
    with pytest.raises(WanConfigError) as caught:
        build_links(**kwargs)
    assert caught.value.key == key


def test_update_link_keeps_unnamed_fields_and_none_lifts_the_rate() -> None:
    base = LinkParams(delay_ms=5, loss=0.1, bandwidth_mbit=10)
    assert update_link(base, delay_ms=7) == LinkParams(7, 0.1, 10)
    assert update_link(base, bandwidth_mbit=None) == LinkParams(5, 0.1, None)
    assert update_link(base) == base


def test_link_params_round_trip_and_reject_unknown_keys() -> None:
    params = LinkParams(delay_ms=1.5, loss=0.2, bandwidth_mbit=3)
    assert LinkParams.from_json(params.to_json()) == params
    with pytest.raises(WanConfigError, match="jitter_ms"):
        LinkParams.from_json({"delay_ms": 1, "jitter_ms": 2})


def test_command_line_assignments() -> None:
    assert parse_assignment("user-edge=5") == ("user-edge", 5.0)
    assert parse_assignment(" user>origin = 0.5") == ("user>origin", 0.5)
    for bad in ("user-edge", "user-edge=fast", "user-pluto=3"):
        with pytest.raises(WanConfigError):
            parse_assignment(bad)
    assert _sysctls(["origin:net.ipv4.tcp_slow_start_after_idle=0", "net.x=1 2"]) == {
        "origin": {"net.ipv4.tcp_slow_start_after_idle": "0"},
        "*": {"net.x": "1 2"},
    }


# ---------------------------------------------------------------------- shaper


def test_delay_only_link_releases_after_the_delay() -> None:
    link: DirectedLink[str] = DirectedLink(LinkParams(delay_ms=132.5))
    assert link.admit(10.0, 1500, draw=0.5) == pytest.approx(10.1325)
    assert link.counters.packets == 1 and link.counters.bytes == 1500


def test_loss_uses_the_draw() -> None:
    link: DirectedLink[str] = DirectedLink(LinkParams(delay_ms=1, loss=0.25))
    assert link.admit(0.0, 100, draw=0.2) is None
    assert link.admit(0.0, 100, draw=0.3) is not None
    assert link.counters.dropped_loss == 1 and link.counters.packets == 1


def test_serialisation_spaces_back_to_back_packets_by_size_over_rate() -> None:
    # 1250 bytes at 10 Mbit/s take exactly 1 ms on the wire.
    link: DirectedLink[str] = DirectedLink(LinkParams(delay_ms=5, bandwidth_mbit=10))
    releases = [link.admit(0.0, 1250, draw=0.9) for _ in range(3)]
    assert releases == pytest.approx([0.006, 0.007, 0.008])
    # After the link has drained, a packet waits only for itself.
    assert link.admit(1.0, 1250, draw=0.9) == pytest.approx(1.006)


def test_serialisation_queue_is_drop_tail_in_transmission_time() -> None:
    link: DirectedLink[str] = DirectedLink(LinkParams(delay_ms=0, bandwidth_mbit=10), queue_ms=3.5)
    admitted = [link.admit(0.0, 1250, draw=0.9) for _ in range(5)]
    assert admitted[:3] == pytest.approx([0.001, 0.002, 0.003])
    assert admitted[3:] == [None, None]
    assert link.counters.dropped_queue == 2
    # A packet bigger than the whole queue still goes when the link is idle.
    slow: DirectedLink[str] = DirectedLink(LinkParams(delay_ms=0, bandwidth_mbit=0.01), 1.0)
    assert slow.admit(0.0, 1500, draw=0.9) == pytest.approx(1.2)


def test_lowering_the_delay_never_reorders_a_link() -> None:
    link: DirectedLink[str] = DirectedLink(LinkParams(delay_ms=100))
    first = link.admit(0.0, 100, draw=0.9)
    link.set_params(LinkParams(delay_ms=10))
    second = link.admit(0.001, 100, draw=0.9)
    assert first == pytest.approx(0.1) and second == first
    assert link.admit(0.2, 100, draw=0.9) == pytest.approx(0.21)


def test_scheduler_reports_the_earliest_head_and_pops_only_due_packets() -> None:
    fast: DirectedLink[str] = DirectedLink(LinkParams(delay_ms=1))
    slow: DirectedLink[str] = DirectedLink(LinkParams(delay_ms=50))
    sched: DelayScheduler[str, str] = DelayScheduler({"fast": fast, "slow": slow})
    assert sched.next_deadline() is None
    for name, link in (("s1", slow), ("f1", fast), ("f2", fast)):
        release = link.admit(0.0, 100, draw=0.9)
        assert release is not None
        sched.push(link, release, name)
    assert sched.next_deadline() == pytest.approx(0.001)
    assert [item for _, item in sched.pop_due(0.01)] == ["f1", "f2"]
    assert sched.held() == 1 and sched.next_deadline() == pytest.approx(0.05)
    assert [item for _, item in sched.pop_due(0.05)] == ["s1"]
    assert fast.counters.max_in_flight == 2


# ------------------------------------------------------------------ delay loop


@dataclass
class FakePacket:
    """What the loop reads of a netfilterqueue packet, and the verdict it gave."""

    indev: int
    outdev: int
    size: int = 100
    verdict: str | None = None

    def get_payload(self) -> bytes:
        return b"\x45\x00" + self.size.to_bytes(2, "big") + bytes(16)

    def accept(self) -> None:
        assert self.verdict is None
        self.verdict = "accept"

    def drop(self) -> None:
        assert self.verdict is None
        self.verdict = "drop"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(delay_module.time, "monotonic", lambda: now[0])
    return now


def make_loop(**kwargs: object) -> DelayLoop:
    interfaces = {"user": "r-user", "edge": "r-edge", "origin": "r-origin", "app": "r-app"}
    numbers = {name: i for i, name in enumerate(interfaces.values(), start=10)}
    return DelayLoop(interfaces, build_links(**kwargs), 100.0, if_index=numbers.__getitem__)


def test_delay_loop_holds_a_packet_for_its_pair_and_releases_it_on_time(
    clock: list[float],
) -> None:
    loop = make_loop()
    to_origin, to_edge = FakePacket(10, 12, 1500), FakePacket(10, 11)
    loop.on_packet(to_origin)
    loop.on_packet(to_edge)
    assert to_origin.verdict is None and to_edge.verdict is None
    assert loop.scheduler.next_deadline() == pytest.approx(100.005)
    clock[0] = 100.0051
    loop.release_due()
    assert to_edge.verdict == "accept" and to_origin.verdict is None
    clock[0] = 100.1326
    loop.release_due()
    assert to_origin.verdict == "accept"
    stats = loop.statistics()
    assert stats["released"] == 2 and stats["held"] == 0
    assert stats["links"]["user>origin"]["bytes"] == 1500
    assert stats["late_max_us"] == pytest.approx(100, abs=1)


def test_delay_loop_passes_zero_delay_and_unknown_pairs_at_once(clock: list[float]) -> None:
    loop = make_loop(delays_ms={"origin-app": 0})
    direct, stranger = FakePacket(12, 13), FakePacket(99, 12)
    loop.on_packet(direct)
    loop.on_packet(stranger)
    assert direct.verdict == stranger.verdict == "accept"
    assert loop.statistics()["unmatched"] == 1


def test_delay_loop_control_requests(clock: list[float]) -> None:
    loop = make_loop()
    reply = loop.handle({"op": "set", "pair": "user>edge", "params": {"delay_ms": 0, "loss": 1.0}})
    assert reply == {"ok": True}
    lost = FakePacket(10, 11)
    loop.on_packet(lost)
    assert lost.verdict == "drop"
    assert loop.handle({"op": "stats"})["links"]["user>edge"]["dropped_loss"] == 1
    with pytest.raises(WanConfigError):
        loop.handle({"op": "set", "pair": "user-edge", "params": {"delay_ms": 1}})
    with pytest.raises(WanConfigError):
        loop.handle({"op": "reboot"})
    assert loop.handle({"op": "stop"}) == {"ok": True} and loop.stopping


def test_unsupported_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulator_module.os, "geteuid", lambda: 1000)
    assert unsupported_reason() == "the WAN emulator needs root"


def test_delay_config_names_every_directed_pair() -> None:
    config = delay_config({"user": "r-user"}, build_links(), queue_maxlen=1000)
    assert sorted(config["links"]) == sorted(f"{a}>{b}" for a, b in directed_pairs())
    assert config["queue_maxlen"] == 1000
    assert json.loads(json.dumps(config)) == config  # travels on the child's command line
