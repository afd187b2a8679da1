"""Properties of the balancing decisions, tried by hypothesis over random pools,
weights, loads and availability."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from origin.balancer import BackendPool, effective_weight
from origin.snapshot import BackendSpec, PoolSnapshot
from tests.example_budget import examples

ALGORITHMS = ["least_connections", "round_robin", "weighted", "consistent_hash"]

weights_st = st.lists(st.integers(1, 10), min_size=1, max_size=8)


def build(weights: list[int], algorithm: str, cap: int = 0) -> BackendPool:
    specs = tuple(BackendSpec(f"10.0.{i}.1:80", w) for i, w in enumerate(weights))
    return BackendPool.from_snapshot(
        PoolSnapshot(name="p", algorithm=algorithm, backends=specs, max_connections_per_backend=cap)
    )


@settings(max_examples=examples(200), deadline=None)
@given(
    weights=weights_st,
    algorithm=st.sampled_from(ALGORITHMS),
    down=st.lists(st.booleans(), max_size=8),
    drained=st.lists(st.booleans(), max_size=8),
    active=st.lists(st.integers(0, 5), max_size=8),
    cap=st.integers(0, 4),
    key=st.binary(max_size=16),
)
def test_choice_is_available_or_none_only_when_none_is(
    weights: list[int],
    algorithm: str,
    down: list[bool],
    drained: list[bool],
    active: list[int],
    cap: int,
    key: bytes,
) -> None:
    pool = build(weights, algorithm, cap)
    for i, backend in enumerate(pool.backends):
        backend.healthy = not (down[i] if i < len(down) else False)
        backend.drained = drained[i] if i < len(drained) else False
        backend.active = active[i] if i < len(active) else 0
    choice = pool.choose(0.0, key)
    available = [b for b in pool.backends if b.available(0.0, cap)]
    if choice is None:
        assert available == []
    else:
        assert choice in available


@settings(max_examples=examples(100), deadline=None)
@given(weights=weights_st, rounds=st.integers(1, 5))
def test_smooth_weighted_gives_exact_shares_per_cycle(weights: list[int], rounds: int) -> None:
    pool = build(weights, "weighted")
    total = sum(weights)
    counts = Counter(pool.choose(0.0).address for _ in range(total * rounds))  # type: ignore[union-attr]
    for backend, weight in zip(pool.backends, weights, strict=True):
        assert counts[backend.address] == weight * rounds


@settings(max_examples=examples(100), deadline=None)
@given(weights=weights_st)
def test_smooth_weighted_never_bunches_beyond_the_weight(weights: list[int]) -> None:
    """Within one cycle no backend is picked more than its weight times."""
    pool = build(weights, "weighted")
    sequence = [pool.choose(0.0).address for _ in range(sum(weights))]  # type: ignore[union-attr]
    for backend, weight in zip(pool.backends, weights, strict=True):
        assert sequence.count(backend.address) == weight


@settings(max_examples=examples(100), deadline=None)
@given(weights=weights_st, streams=st.integers(1, 60))
def test_least_connections_keeps_load_within_one_stream_of_fair(
    weights: list[int], streams: int
) -> None:
    """Equal weights, streams that never finish: counts differ by at most one."""
    pool = build([1] * len(weights), "least_connections")
    for _ in range(streams):
        pool.choose(0.0).active += 1  # type: ignore[union-attr]
    counts = [b.active for b in pool.backends]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=examples(50), deadline=None)
@given(
    weights=st.lists(st.integers(1, 3), min_size=2, max_size=6),
    gone=st.integers(0, 5),
    keys=st.lists(st.binary(min_size=1, max_size=8), min_size=1, max_size=50, unique=True),
)
def test_consistent_hash_remaps_only_keys_of_the_removed_backend(
    weights: list[int], gone: int, keys: list[bytes]
) -> None:
    pool = build(weights, "consistent_hash")
    victim = pool.backends[gone % len(pool.backends)]
    before = {k: pool.choose(0.0, k) for k in keys}
    victim.healthy = False
    for key in keys:
        after = pool.choose(0.0, key)
        if before[key] is not victim:
            assert after is before[key]
        else:
            assert after is not victim and after is not None


@settings(max_examples=examples(200), deadline=None)
@given(
    weight=st.integers(1, 1000),
    slow=st.floats(0.1, 100.0),
    t1=st.floats(0.0, 200.0),
    t2=st.floats(0.0, 200.0),
)
def test_slow_start_weight_is_monotonic_and_bounded(
    weight: int, slow: float, t1: float, t2: float
) -> None:
    from origin.balancer import Backend

    backend = Backend("a:1", "a", 1, weight=weight, up_since=0.0)
    low, high = sorted((t1, t2))
    w_low, w_high = effective_weight(backend, low, slow), effective_weight(backend, high, slow)
    assert 0 < w_low <= w_high <= weight
