"""The origin's pure balancing decisions: algorithms, slow start, caps, ejection,
routing and rise/fall, without sockets (examples here, properties in
test_origin_balancer_props.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from origin.balancer import (
    SLOW_START_FLOOR,
    Backend,
    BackendPool,
    PoolRouter,
    RiseFall,
    effective_weight,
    record_connect_failure,
    record_connect_success,
)
from origin.config import PassiveHealthConfig
from origin.snapshot import BackendSpec, PoolSnapshot, decode_snapshots, encode_snapshots


def make_pool(
    weights: dict[str, int] | list[str], algorithm: str = "least_connections", **settings: object
) -> BackendPool:
    if isinstance(weights, list):
        weights = dict.fromkeys(weights, 1)
    specs = tuple(BackendSpec(f"10.0.0.{i + 1}:80", w) for i, w in enumerate(weights.values()))
    pool = BackendPool.from_snapshot(
        PoolSnapshot(name="p", algorithm=algorithm, backends=specs, **settings)  # type: ignore[arg-type]
    )
    for backend, name in zip(pool.backends, weights, strict=True):
        backend.tag = name
    return pool


def picks(pool: BackendPool, n: int, now: float = 0.0, key: bytes = b"") -> list[str]:
    return [pool.choose(now, key).tag for _ in range(n)]  # type: ignore[union-attr]


# --------------------------------------------------------------------------- algorithms


def test_least_connections_rotates_among_idle_backends() -> None:
    pool = make_pool(["a", "b", "c", "d"])
    assert Counter(picks(pool, 400)) == {"a": 100, "b": 100, "c": 100, "d": 100}


def test_least_connections_prefers_fewest_in_flight() -> None:
    pool = make_pool(["a", "b", "c"])
    pool.backends[0].active = 5
    pool.backends[1].active = 1
    pool.backends[2].active = 3
    assert pool.choose(0.0).tag == "b"  # type: ignore[union-attr]


@pytest.mark.parametrize("order", [["heavy", "light"], ["light", "heavy"]])
def test_least_connections_counts_relative_to_weight(order: list[str]) -> None:
    weights = {"heavy": 4, "light": 1}
    pool = make_pool({name: weights[name] for name in order})
    active = {"heavy": 6, "light": 2}  # 6/4 = 1.5 against 2/1 = 2
    for backend in pool.backends:
        backend.active = active[backend.tag]
    assert pool.choose(0.0).tag == "heavy"  # type: ignore[union-attr]


def test_least_connections_shares_equal_relative_load_by_weight() -> None:
    """3 in flight on weight 3 and 2 on weight 2 are the same load: a tie, which
    the tie-break shares 3 : 2, rather than the first backend taking every stream."""
    pool = make_pool({"a": 3, "b": 2})
    pool.backends[0].active = 3
    pool.backends[1].active = 2
    assert Counter(picks(pool, 5)) == {"a": 3, "b": 2}


def test_least_connections_spreads_a_burst_when_streams_are_counted() -> None:
    pool = make_pool(["a", "b", "c"])
    for _ in range(9):
        pool.choose(0.0).active += 1  # type: ignore[union-attr]
    assert [b.active for b in pool.backends] == [3, 3, 3]


def test_least_connections_ties_follow_weights() -> None:
    pool = make_pool({"a": 3, "b": 1})
    assert Counter(picks(pool, 400)) == {"a": 300, "b": 100}


def test_round_robin_ignores_weights() -> None:
    pool = make_pool({"a": 5, "b": 1, "c": 1}, "round_robin")
    assert picks(pool, 6) == ["a", "b", "c", "a", "b", "c"]


def test_round_robin_steps_over_an_unavailable_backend_and_keeps_rotating() -> None:
    pool = make_pool(["a", "b", "c", "d"], "round_robin")
    pool.backends[1].healthy = False
    assert picks(pool, 6) == ["a", "c", "d", "a", "c", "d"]


def test_smooth_weighted_is_smooth() -> None:
    """nginx's example: weights 5, 1, 1 give a a b a c a a, not a a a a a b c."""
    pool = make_pool({"a": 5, "b": 1, "c": 1}, "weighted")
    assert picks(pool, 7) == ["a", "a", "b", "a", "c", "a", "a"]


def test_consistent_hash_is_sticky_and_spreads_clients() -> None:
    pool = make_pool(["a", "b", "c", "d"], "consistent_hash")
    keys = [f"198.51.100.{i}".encode() for i in range(200)] + [
        f"2001:db8::{i:x}".encode() for i in range(200)
    ]
    first = {key: pool.choose(0.0, key).tag for key in keys}  # type: ignore[union-attr]
    again = {key: pool.choose(0.0, key).tag for key in keys}  # type: ignore[union-attr]
    assert first == again
    counts = Counter(first.values())
    assert set(counts) == {"a", "b", "c", "d"}
    assert min(counts.values()) > 50  # 100 expected each


def test_consistent_hash_moves_only_the_keys_of_an_unavailable_backend() -> None:
    pool = make_pool(["a", "b", "c", "d"], "consistent_hash")
    keys = [f"192.0.2.{i}:{j}".encode() for i in range(50) for j in range(4)]
    before = {key: pool.choose(0.0, key).tag for key in keys}  # type: ignore[union-attr]
    pool.backends[1].healthy = False  # "b"
    after = {key: pool.choose(0.0, key).tag for key in keys}  # type: ignore[union-attr]
    for key in keys:
        if before[key] != "b":
            assert after[key] == before[key]
        else:
            assert after[key] != "b"
    moved = Counter(after[key] for key in keys if before[key] == "b")
    assert len(moved) >= 2  # b's keys spread over several backends (virtual nodes)


def test_consistent_hash_without_a_client_key_falls_back_to_rotation() -> None:
    pool = make_pool(["a", "b"], "consistent_hash")
    assert Counter(picks(pool, 10)) == {"a": 5, "b": 5}


@pytest.mark.parametrize(
    "algorithm", ["least_connections", "round_robin", "weighted", "consistent_hash"]
)
def test_unavailable_backends_are_never_chosen(algorithm: str) -> None:
    pool = make_pool(
        ["up", "down", "drained", "ejected", "full"], algorithm, max_connections_per_backend=2
    )
    pool.backends[1].healthy = False
    pool.backends[2].drained = True
    pool.backends[3].ejected_until = 100.0
    pool.backends[4].active = 2
    for i in range(50):
        assert pool.choose(10.0, f"10.1.1.{i}".encode()).tag == "up"  # type: ignore[union-attr]
    pool.backends[0].healthy = False
    assert pool.choose(10.0, b"10.1.1.1") is None
    assert pool.backends[3].available(100.0, 0)  # the ejection is over


@pytest.mark.parametrize(
    "algorithm", ["least_connections", "round_robin", "weighted", "consistent_hash"]
)
def test_excluded_backends_are_skipped(algorithm: str) -> None:
    pool = make_pool(["a", "b", "c"], algorithm)
    tried = [pool.backends[0], pool.backends[2]]
    for i in range(10):
        assert pool.choose(0.0, f"k{i}".encode(), tried).tag == "b"  # type: ignore[union-attr]
    assert pool.choose(0.0, b"k", pool.backends) is None


# --------------------------------------------------------------------------- slow start


def test_slow_start_ramps_linearly_from_a_floor() -> None:
    backend = Backend("a:1", "a", 1, weight=10, up_since=100.0)
    assert effective_weight(backend, 100.0, 10.0) == pytest.approx(10 * SLOW_START_FLOOR)
    assert effective_weight(backend, 105.0, 10.0) == pytest.approx(5.0)
    assert effective_weight(backend, 110.0, 10.0) == 10.0
    assert effective_weight(backend, 100.0, 0.0) == 10.0  # slow start off
    assert effective_weight(backend, 100.5, 1.0) == pytest.approx(5.0)  # a 1 s ramp is one too


def test_slow_start_follows_the_end_of_an_ejection() -> None:
    backend = Backend("a:1", "a", 1, weight=4, ejected_until=50.0)
    assert effective_weight(backend, 52.0, 4.0) == pytest.approx(2.0)


def test_a_returning_backend_gets_a_growing_share() -> None:
    pool = make_pool(["old", "new"], "weighted", slow_start_s=10.0)
    pool.backends[1].up_since = 0.0
    early = Counter(picks(pool, 1000, now=1.0))["new"]
    late = Counter(picks(pool, 1000, now=9.0))["new"]
    full = Counter(picks(pool, 1000, now=20.0))["new"]
    assert early < 100 < late < full
    assert full == 500


def test_least_connections_under_slow_start_shares_by_ramped_weight() -> None:
    pool = make_pool(["old", "new"], slow_start_s=10.0)
    pool.backends[1].up_since = 0.0
    # idle backends tie at 0 in flight: the tie-break shares by weight, 0.1 : 1
    assert Counter(picks(pool, 110, now=1.0))["new"] == 10
    assert Counter(picks(pool, 100, now=11.0))["new"] == 50


# --------------------------------------------------------------------------- ejection


def test_consecutive_failures_eject_with_doubling_backoff() -> None:
    policy = PassiveHealthConfig(failures=3, eject_base_s=1.0, eject_max_s=5.0)
    backend = Backend("a:1", "a", 1)
    assert not record_connect_failure(backend, 0.0, policy)
    assert not record_connect_failure(backend, 0.0, policy)
    assert record_connect_failure(backend, 0.0, policy)
    assert backend.ejected(0.5) and not backend.ejected(1.0)
    # probation: one more failure ejects again, for twice as long
    assert record_connect_failure(backend, 1.0, policy)
    assert backend.ejected_until == 3.0
    assert record_connect_failure(backend, 3.0, policy)
    assert backend.ejected_until == 7.0
    assert record_connect_failure(backend, 7.0, policy)
    assert backend.ejected_until == 12.0  # capped at 5 s
    record_connect_success(backend)
    # a clean record again: `failures` failures to eject, for the base time
    assert not record_connect_failure(backend, 20.0, policy)
    assert not record_connect_failure(backend, 20.0, policy)
    assert record_connect_failure(backend, 20.0, policy)
    assert backend.ejected_until == 21.0


def test_a_success_between_failures_resets_the_count() -> None:
    policy = PassiveHealthConfig(failures=2)
    backend = Backend("a:1", "a", 1)
    for _ in range(5):
        assert not record_connect_failure(backend, 0.0, policy)
        record_connect_success(backend)


# --------------------------------------------------------------------------- pools


def test_apply_keeps_the_state_of_backends_that_stay() -> None:
    pool = make_pool(["a", "b"])
    a = pool.backends[0]
    a.active = 7
    snapshot = PoolSnapshot(
        name="p",
        backends=(
            BackendSpec("10.0.0.1:80", healthy=False),
            BackendSpec("10.0.0.9:80"),
        ),
    )
    added, removed = pool.apply(snapshot)
    assert pool.backends[0] is a and a.active == 7 and not a.healthy
    assert [b.address for b in added] == ["10.0.0.9:80"]
    assert [b.address for b in removed] == ["10.0.0.2:80"]
    assert pool.find("10.0.0.9:80") is pool.backends[1]
    assert pool.find("10.0.0.2:80") is None


def test_apply_switches_algorithm() -> None:
    pool = make_pool({"a": 5, "b": 1}, "round_robin")
    pool.apply(
        PoolSnapshot(
            name="p",
            algorithm="weighted",
            backends=(BackendSpec("10.0.0.1:80", 5), BackendSpec("10.0.0.2:80", 1)),
        )
    )
    assert Counter(b.address for b in (pool.choose(0.0) for _ in range(6))) == {  # type: ignore[union-attr]
        "10.0.0.1:80": 5,
        "10.0.0.2:80": 1,
    }


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("weighted", ["a", "a", "b", "a", "c", "a", "a"]),
        ("round_robin", ["a", "b", "c", "a", "b", "c", "a"]),
    ],
)
def test_a_snapshot_that_changes_nothing_keeps_the_rotation_going(
    algorithm: str, expected: list[str]
) -> None:
    """The parent pushes a snapshot on every change anywhere (a health flip, a
    drain, another pool); a rotation that restarted on each would send what
    falls between two snapshots to the first backends only."""
    pool = make_pool({"a": 5, "b": 1, "c": 1}, algorithm)
    snapshot = pool.settings
    chosen = []
    for _ in range(7):
        chosen += picks(pool, 1)
        pool.apply(snapshot)
    assert chosen == expected


def test_consistent_hash_follows_a_weight_change() -> None:
    pool = make_pool({"a": 1, "b": 1}, "consistent_hash")
    keys = [f"198.51.100.{i}".encode() for i in range(200)] + [
        f"203.0.113.{i}".encode() for i in range(200)
    ]
    even = Counter(pool.choose(0.0, key).address for key in keys)  # type: ignore[union-attr]
    pool.apply(
        PoolSnapshot(
            name="p",
            algorithm="consistent_hash",
            backends=(BackendSpec("10.0.0.1:80", 3), BackendSpec("10.0.0.2:80", 1)),
        )
    )
    heavier = Counter(pool.choose(0.0, key).address for key in keys)  # type: ignore[union-attr]
    assert even["10.0.0.1:80"] < 240  # about half
    assert heavier["10.0.0.1:80"] > 260  # about three quarters


def test_a_snapshot_drains_and_undrains_a_backend() -> None:
    pool = make_pool(["a", "b"], "round_robin")
    specs = pool.settings.backends
    pool.apply(
        PoolSnapshot(
            name="p",
            algorithm="round_robin",
            backends=(specs[0], BackendSpec(specs[1].address, drained=True)),
        )
    )
    assert picks(pool, 4) == ["a", "a", "a", "a"]
    pool.apply(PoolSnapshot(name="p", algorithm="round_robin", backends=specs))
    assert Counter(picks(pool, 4)) == {"a": 2, "b": 2}


def test_usable_counts_a_backend_at_its_cap_but_not_one_that_is_down() -> None:
    """A pool whose backends are all at their cap is busy (a stream may queue for
    a slot), not down."""
    pool = make_pool(["a", "b"], max_connections_per_backend=1)
    pool.backends[0].active = 1
    pool.backends[1].drained = True
    assert pool.choose(0.0) is None
    assert pool.usable(0.0)
    pool.backends[0].healthy = False
    assert not pool.usable(0.0)
    pool.backends[0].healthy = True
    pool.backends[0].ejected_until = 5.0
    assert not pool.usable(1.0)
    assert pool.usable(5.0)


def test_backend_connect_address_comes_from_its_spec() -> None:
    v4 = Backend.from_spec(BackendSpec("10.0.0.7:8080"))
    v6 = Backend.from_spec(BackendSpec("[2001:db8::7]:8443"))
    assert (v4.host, v4.port) == ("10.0.0.7", 8080)
    assert (v6.host, v6.port) == ("2001:db8::7", 8443)


def test_snapshots_round_trip_through_json() -> None:
    import json

    pools = (
        PoolSnapshot(
            name="p",
            hosts=("a.test",),
            default=True,
            proxy_protocol="v2",
            passive=PassiveHealthConfig(failures=5),
            backends=(BackendSpec("[::1]:80", 3, False, 12.5, True), BackendSpec("10.0.0.1:80")),
        ),
    )
    assert decode_snapshots(json.loads(json.dumps(encode_snapshots(pools)))) == pools


# --------------------------------------------------------------------------- routing


def test_router_matches_host_then_sni_then_default() -> None:
    router = PoolRouter(
        [
            PoolSnapshot(name="api", hosts=("api.example.com",)),
            PoolSnapshot(name="wild", hosts=("*.example.com",)),
            PoolSnapshot(name="deep", hosts=("*.eu.example.com",)),
            PoolSnapshot(name="web", hosts=("example.com",), default=True),
        ]
    )
    assert router.route("API.Example.com:8443") == "api"
    assert router.route("api.example.com.") == "api"
    assert router.route("x.example.com") == "wild"
    assert router.route("a.b.example.com") == "wild"
    assert router.route("x.eu.example.com") == "deep"
    assert router.route("example.com") == "web"
    assert router.route("other.test") == "web"
    assert router.route(None, "api.example.com") == "api"
    assert router.route("unknown.test", "api.example.com") == "api"
    assert router.route("[::1]:443") == "web"


def test_router_hosts_are_matched_case_and_trailing_dot_blind() -> None:
    router = PoolRouter([PoolSnapshot(name="api", hosts=("API.Example.COM.", "*.Apps.Test."))])
    assert router.route("api.example.com") == "api"
    assert router.route("x.apps.test") == "api"


def test_router_wildcard_does_not_match_its_bare_domain() -> None:
    """``*.example.com`` covers the names under example.com, not example.com
    itself (as in nginx and HAProxy)."""
    router = PoolRouter(
        [
            PoolSnapshot(name="wild", hosts=("*.example.com",)),
            PoolSnapshot(name="web", hosts=("other.test",), default=True),
        ]
    )
    assert router.route("www.example.com") == "wild"
    assert router.route("example.com") == "web"


def test_router_without_default_gives_none() -> None:
    router = PoolRouter([PoolSnapshot(name="api", hosts=("api.test",))])
    assert router.route("other.test") is None
    assert router.route(None, None) is None


# --------------------------------------------------------------------------- rise / fall


def test_rise_and_fall_need_consecutive_results() -> None:
    verdict = RiseFall(rise=2, fall=3)
    assert [verdict.observe(False) for _ in range(3)] == [False, False, True]
    assert not verdict.healthy
    assert not verdict.observe(True)
    assert not verdict.observe(False)  # the streak is broken
    assert [verdict.observe(True) for _ in range(2)] == [False, True]
    assert verdict.healthy


def test_coming_back_up_ends_a_passive_ejection() -> None:
    """A backend ejected for connect failures while it was down takes streams
    again as soon as the active checks bring it back, not after the ejection."""
    policy = PassiveHealthConfig(failures=1, eject_base_s=30.0, eject_max_s=60.0)
    backend = Backend.from_spec(BackendSpec("10.0.0.9:80", 1))
    assert record_connect_failure(backend, 100.0, policy)
    backend.update(BackendSpec("10.0.0.9:80", 1, healthy=False))
    assert not backend.available(101.0, 0)
    backend.update(BackendSpec("10.0.0.9:80", 1, healthy=True, up_since=102.0))
    assert backend.available(102.0, 0)
    assert backend.ejections == 0
    # Staying up is not a reason to forgive: a still-healthy backend keeps its ejection.
    assert record_connect_failure(backend, 103.0, policy)
    backend.update(BackendSpec("10.0.0.9:80", 1, healthy=True, up_since=102.0))
    assert not backend.available(104.0, 0)


def test_coming_back_up_starts_a_clean_failure_count() -> None:
    """After the active checks bring a backend back, it takes ``failures``
    connect failures again to eject it, not one fewer."""
    policy = PassiveHealthConfig(failures=2, eject_base_s=30.0, eject_max_s=60.0)
    backend = Backend.from_spec(BackendSpec("10.0.0.9:80", 1))
    assert not record_connect_failure(backend, 100.0, policy)
    assert record_connect_failure(backend, 100.0, policy)
    backend.update(BackendSpec("10.0.0.9:80", 1, healthy=False))
    backend.update(BackendSpec("10.0.0.9:80", 1, healthy=True, up_since=110.0))
    assert not record_connect_failure(backend, 111.0, policy)
    assert backend.available(111.0, 0)
    assert record_connect_failure(backend, 112.0, policy)
