"""The pure decisions: reconnect backoff, tunnel connection choice, origin
choice, the pacing of CONTROL messages."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from edge.origins import RTT_SLACK, OriginCandidate, choose_origin
from tests.example_budget import examples
from tunnel.policy import Backoff, Pacer, choose_connection


@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=2**32))
def test_backoff_full_jitter_stays_within_the_exponential_ceiling(attempt: int, seed: int) -> None:
    backoff = Backoff(base_s=0.1, cap_s=10.0)
    delay = backoff.delay(attempt, random.Random(seed))
    assert 0.0 <= delay <= min(10.0, 0.1 * 2**attempt)


def test_backoff_spreads_a_fleet_instead_of_lockstep() -> None:
    backoff = Backoff(base_s=0.1, cap_s=10.0)
    rng = random.Random(7)
    delays = [backoff.delay(6, rng) for _ in range(1000)]
    assert min(delays) < 0.5 and max(delays) > 5.9  # uniform over [0, 6.4]
    assert len({round(d, 3) for d in delays}) > 900


@dataclass
class Conn:
    can_open_stream: bool
    open_streams: int
    warming: bool = False


def test_choose_connection_prefers_usable_and_least_loaded() -> None:
    a, b, c = Conn(True, 5), Conn(False, 0), Conn(True, 2)
    assert choose_connection([a, b, c]) is c
    assert choose_connection([b]) is None
    assert choose_connection([]) is None
    d = Conn(True, 2)
    assert choose_connection([c, d]) is c  # first on ties


def test_choose_connection_prefers_a_warm_connection_to_a_warming_one() -> None:
    """A new stream waits behind no warm-up padding while a warm connection exists."""
    warming, warm = Conn(True, 0, warming=True), Conn(True, 9)
    assert choose_connection([warming, warm]) is warm
    assert choose_connection([warm, warming]) is warm
    # Only warming ones: the least loaded of them (better than no tunnel).
    other = Conn(True, 3, warming=True)
    assert choose_connection([other, warming]) is warming
    assert choose_connection([Conn(False, 0), other]) is other


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(min_value=0, max_value=50), st.booleans()),
        max_size=8,
    )
)
def test_choose_connection_picks_the_least_loaded_of_the_warmest_usable(
    specs: list[tuple[bool, int, bool]],
) -> None:
    conns = [Conn(usable, streams, warming) for usable, streams, warming in specs]
    chosen = choose_connection(conns)
    usable = [c for c in conns if c.can_open_stream]
    if not usable:
        assert chosen is None
        return
    warm = [c for c in usable if not c.warming] or usable
    assert chosen is not None and chosen in warm
    assert chosen.open_streams == min(c.open_streams for c in warm)
    assert chosen is next(c for c in warm if c.open_streams == chosen.open_streams)


def test_choose_origin_skips_unusable_and_far_origins() -> None:
    rng = random.Random(1)
    near = OriginCandidate("dublin", True, 0.130, 1)
    far = OriginCandidate("virginia", True, 0.300, 1)
    down = OriginCandidate("london", False, 0.120, 1)
    picks = {choose_origin([near, far, down], rng) for _ in range(200)}
    assert picks == {"dublin"}
    assert choose_origin([down], rng) is None
    assert choose_origin([far, down], rng) == "virginia"


def test_choose_origin_shares_between_close_origins_by_weight() -> None:
    rng = random.Random(2)
    a = OriginCandidate("a", True, 0.100, 3)
    b = OriginCandidate("b", True, 0.100 * RTT_SLACK, 1)
    picks = [choose_origin([a, b], rng) for _ in range(4000)]
    share = picks.count("a") / len(picks)
    assert 0.70 < share < 0.80  # weights 3:1
    unmeasured = OriginCandidate("c", True, None, 1)
    assert choose_origin([unmeasured], rng) == "c"


def test_pacer_lets_a_burst_through_then_spaces_the_rest() -> None:
    pacer = Pacer(50, 50)
    assert [pacer.delay(10.0) for _ in range(50)] == [0.0] * 50
    assert [round(pacer.delay(10.0), 6) for _ in range(3)] == [0.02, 0.04, 0.06]
    assert pacer.delay(20.0) == 0.0  # idle long enough: the burst is back


def test_a_steady_rate_at_the_pacers_rate_never_waits() -> None:
    pacer = Pacer(50, 1)
    assert all(pacer.delay(i / 50) < 1e-9 for i in range(1000))  # float rounding only


@settings(max_examples=examples(200))
@given(
    st.lists(st.floats(0.0, 5.0), max_size=300).map(sorted),
    st.sampled_from([(50.0, 50), (10.0, 1), (100.0, 5)]),
)
def test_no_window_of_a_second_holds_more_than_burst_plus_rate(
    arrivals: list[float], shape: tuple[float, int]
) -> None:
    rate, burst = shape
    pacer = Pacer(rate, burst)
    sends = [now + pacer.delay(now) for now in arrivals]
    assert sends == sorted(sends)  # in arrival order
    assert all(send >= now for send, now in zip(sends, arrivals, strict=True))
    for i, start in enumerate(sends):
        in_window = sum(1 for send in sends[i:] if send < start + 1.0 - 1e-9)
        assert in_window <= burst + rate
