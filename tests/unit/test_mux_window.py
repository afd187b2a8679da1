"""Flow control (PROTOCOL.md §7): windows, credit on consumption, fair sending,
auto-tuning, seeding new streams from the connection's estimate; and the small
pure pieces it rests on (ReceiveWindow, RttEstimator, ErrorBudget, RoundRobin).

Latency is simulated with a manual clock: ``SessionPair.flight`` moves one
flight of frames across a link of a given one-way delay.
"""

from __future__ import annotations

import itertools

import pytest

from tests.mux_pair import SessionPair, parse_frames
from tunnel.mux import SessionConfig, StreamMetadata
from tunnel.mux.budget import ErrorBudget
from tunnel.mux.errors import FlowControlError
from tunnel.mux.scheduler import RoundRobin
from tunnel.mux.window import QUEUE_SLACK_S, ReceiveWindow, RttEstimator

KiB = 1024
MiB = 1024 * KiB
DATA, WINDOW_UPDATE, SETTINGS = 3, 4, 1
META = StreamMetadata(edge_id="test")


def rtt_of(min_s: float, latest_s: float | None = None) -> RttEstimator:
    rtt = RttEstimator()
    rtt.add_sample(min_s)
    if latest_s is not None:
        rtt.add_sample(latest_s)
    return rtt


# -- ReceiveWindow ---------------------------------------------------------------------


def test_receiving_beyond_the_limit_is_a_flow_control_error() -> None:
    window = ReceiveWindow(1000, 1000, now=0.0)
    window.receive(1000)
    with pytest.raises(FlowControlError):
        window.receive(1)


def test_credit_is_announced_once_half_the_window_is_consumed() -> None:
    window = ReceiveWindow(1000, 1000, now=0.0)
    window.receive(1000)
    assert window.consume(499, now=0.0) == 0
    assert window.consume(1, now=0.0) == 500  # limit 1000 -> 1500
    assert (window.limit, window.unconsumed) == (1500, 500)
    window.receive(499)
    assert window.consume(499, now=0.0) == 0
    assert window.consume(1, now=0.0) == 500  # half a window since the last announcement


def test_without_rtt_the_window_keeps_its_size() -> None:
    window = ReceiveWindow(64 * KiB, 16 * MiB, now=0.0)
    for i in range(100):
        window.receive(64 * KiB)
        window.consume(64 * KiB, now=i * 0.001)
    assert window.size == 64 * KiB


def test_a_window_bound_flow_doubles_up_to_the_cap() -> None:
    rtt = rtt_of(0.1)
    window = ReceiveWindow(64 * KiB, 256 * KiB, now=0.0)
    sizes = []
    now = 0.0
    for _ in range(5):  # a window per RTT: the window, not the reader, is the bottleneck
        now += 0.1
        window.receive(window.limit - window.received)
        window.consume(window.unconsumed, now, rtt)
        sizes.append(window.size)
    assert sizes == [128 * KiB, 256 * KiB, 256 * KiB, 256 * KiB, 256 * KiB]


def test_a_reader_bound_flow_does_not_grow() -> None:
    rtt = rtt_of(0.1)
    window = ReceiveWindow(64 * KiB, 16 * MiB, now=0.0)
    now = 0.0
    for _ in range(20):  # half a window consumed per 0.15 s > 2 * 0.5 * 0.1 s
        now += 0.15
        window.receive(32 * KiB)
        window.consume(32 * KiB, now, rtt)
    assert window.size == 64 * KiB


def test_the_growth_test_is_two_fraction_rtt() -> None:
    rtt = rtt_of(0.1)
    fast = ReceiveWindow(64 * KiB, 16 * MiB, now=0.0)
    fast.receive(32 * KiB)
    fast.consume(32 * KiB, 0.0999, rtt)  # half a window in < 2 * 0.5 * RTT
    slow = ReceiveWindow(64 * KiB, 16 * MiB, now=0.0)
    slow.receive(32 * KiB)
    slow.consume(32 * KiB, 0.1, rtt)
    assert (fast.size, slow.size) == (128 * KiB, 64 * KiB)


def test_a_standing_queue_halves_the_window_down_to_its_floor() -> None:
    queued = rtt_of(0.05, 0.05 * 2 + QUEUE_SLACK_S + 0.0001)
    window = ReceiveWindow(1 * MiB, 16 * MiB, now=0.0, min_size=256 * KiB)
    sizes, limits = [], []
    for i in range(4):
        window.receive(window.limit - window.received)
        window.consume(window.unconsumed, 0.001 * (i + 1), queued)
        sizes.append(window.size)
        limits.append(window.limit)
    assert sizes == [512 * KiB, 256 * KiB, 256 * KiB, 256 * KiB]
    assert limits == sorted(limits)  # a limit never goes down, even as the size shrinks


def test_no_queue_no_shrink() -> None:
    fine = rtt_of(0.05, 0.05 * 2 + QUEUE_SLACK_S)  # at the edge: tolerated
    window = ReceiveWindow(1 * MiB, 1 * MiB, now=0.0, min_size=64 * KiB)
    window.receive(1 * MiB)
    window.consume(1 * MiB, 0.001, fine)
    assert window.size == 1 * MiB


def test_raise_size_grows_now_and_never_shrinks() -> None:
    window = ReceiveWindow(1000, 5000, now=0.0)
    window.receive(600)
    window.consume(100, 0.0)
    assert window.raise_size(800) == 0
    assert window.raise_size(3000) == 100 + 3000 - 1000
    assert window.raise_size(10**9) == 2000  # capped at max_size 5000
    assert (window.size, window.limit) == (5000, 5100)


def test_rtt_estimator_smooths_and_keeps_the_minimum() -> None:
    rtt = RttEstimator()
    assert (rtt.smoothed, rtt.min, rtt.latest) == (None, None, None)
    for sample in (0.1, 0.3, 0.05, -1.0):
        rtt.add_sample(sample)
    assert rtt.min == 0.0 and rtt.latest == 0.0
    expected = 0.1
    for sample in (0.3, 0.05, 0.0):
        expected = 0.875 * expected + 0.125 * sample
    assert rtt.smoothed == pytest.approx(expected)


def test_error_budget_refills_up_to_its_capacity() -> None:
    budget = ErrorBudget(10, 5, now=0.0)
    assert all(budget.charge(1, 0.0) for _ in range(10))
    assert not budget.charge(1, 0.0)
    assert budget.charge(4, 1.0)  # -1 + 5 = 4 -> 0
    assert not budget.charge(0.5, 1.0)
    budget.charge(0, 100.0)
    assert budget.tokens == 10


def test_round_robin_serves_each_ready_stream_in_turn() -> None:
    rr = RoundRobin()
    for sid in (1, 3, 5, 3):
        rr.push(sid)
    assert len(rr) == 3 and 3 in rr
    order = []
    for _ in range(7):
        sid = rr.pop()
        order.append(sid)
        if sid in (1, 5):
            rr.push(sid)
    assert order == [1, 3, 5, 1, 5, 1, 5]
    rr.discard(1)
    rr.discard(42)
    assert rr.pop() == 5 and rr.pop() is None


# -- §7.1-7.3 through sessions -----------------------------------------------------


def test_the_sender_never_exceeds_the_stream_or_connection_window() -> None:
    small = SessionConfig(
        initial_stream_window_bytes=64 * KiB,
        initial_connection_window_bytes=100 * KiB,
        max_frame_bytes=16 * KiB,
    )
    pair = SessionPair(small, small, chunk=4096).establish()
    pair.server.auto_ack = False
    sids = [pair.client.session.open_stream(META) for _ in range(3)]
    for sid in sids:
        pair.client.session.send_data(sid, bytes([sid]) * MiB)
    for _ in range(20):
        out = b"".join(bytes(c) for c in pair.client.session.data_to_send())
        for frame in parse_frames(out):
            assert frame[0] != DATA or len(frame[3]) <= 16 * KiB
        pair.server.take(pair.server.session.receive_data(out, pair.now), pair.now)
        pair.check_windows()
    received = [len(pair.server.received[sid]) for sid in sids]
    # all the connection window allows (raised to carry two new streams, §N7.3), fairly spread
    assert sum(received) == pair.server.session._credit.window.limit == 128 * KiB
    assert all(n <= 64 * KiB for n in received) and min(received) > 30 * KiB
    assert pair.server.terminated is None


def test_credit_returns_on_consumption_not_on_receipt() -> None:
    pair = SessionPair().establish()
    pair.client.auto_ack = False
    sid = pair.client.session.open_stream(META)
    pair.pump()
    window = pair.client.session._streams[sid].recv_window.size
    pair.server.session.send_data(sid, b"r" * (4 * window))
    pair.pump()
    assert len(pair.client.received[sid]) == window  # the slow reader caps what is in flight
    assert pair.server.session.send_buffered(sid) == 3 * window
    assert not [f for f in parse_frames(b"".join(pair.client.session.data_to_send()))]
    pair.client.session.acknowledge_received_data(sid, window // 2, pair.now)
    frames = parse_frames(b"".join(bytes(c) for c in pair.client.session.data_to_send()))
    assert (WINDOW_UPDATE, 0, sid, (window // 2).to_bytes(4, "big")) in frames


def test_an_over_acknowledgement_grants_no_extra_credit() -> None:
    pair = SessionPair().establish()
    pair.client.auto_ack = False
    sid = pair.client.session.open_stream(META)
    pair.pump()
    pair.server.session.send_data(sid, b"r" * 40_000)
    pair.pump()
    pair.client.session.acknowledge_received_data(sid, 10 * MiB, pair.now)
    window = pair.client.session._streams[sid].recv_window
    assert window.limit == 40_000 + window.size
    assert pair.client.session.statistics().connection_receive_unconsumed == 0


def test_a_stream_that_ends_unread_returns_its_connection_credit() -> None:
    pair = SessionPair().establish()
    pair.client.auto_ack = False
    sid = pair.client.session.open_stream(META, end_stream=True)
    pair.pump()
    pair.server.session.send_data(sid, b"r" * 50_000, end_stream=True)
    pair.pump()
    assert pair.client.session.open_streams == 0
    assert pair.client.session.statistics().connection_receive_unconsumed == 0


# -- §7.4 fair sending ------------------------------------------------------------------


def test_a_small_response_waits_behind_at_most_one_frame_of_a_bulk_transfer() -> None:
    wide = SessionConfig(min_stream_window_bytes=1 * MiB, initial_stream_window_bytes=1 * MiB)
    pair = SessionPair(wide, wide).establish()
    server = pair.server.session
    bulk = pair.client.session.open_stream(META)
    small = pair.client.session.open_stream(META)
    pair.pump()
    server.send_data(bulk, b"b" * (4 * MiB))
    server.send_data(small, b"s" * 100, end_stream=True)
    frames = [f for f in parse_frames(b"".join(bytes(c) for c in server.data_to_send())) if f[0]]
    assert [(f[2], len(f[3])) for f in frames[:3]] == [(bulk, 65536), (small, 100), (bulk, 65536)]


def test_data_to_send_respects_its_byte_budget_in_whole_frames() -> None:
    pair = SessionPair().establish()
    sid = pair.client.session.open_stream(META)
    pair.pump()
    pair.client.session.send_data(sid, b"x" * MiB)
    out = pair.client.session.data_to_send(100_000)
    frames = parse_frames(b"".join(bytes(c) for c in out))
    assert [len(f[3]) for f in frames] == [65536, 65536]


# -- §N7 auto-tuning and seeding new streams -----------------------------------------


def _bulk(pair: SessionPair, sid: int, rounds: int, one_way_s: float) -> list[int]:
    """The server sends as fast as the windows allow; the client reads at once."""
    sizes = []
    server = pair.server.session
    if sid not in server._streams:
        pair.round_trip(one_way_s)  # the OPEN arrives
    for _ in range(rounds):
        if server.send_buffered(sid) < 8 * MiB:
            server.send_data(sid, b"x" * (8 * MiB))
        pair.round_trip(one_way_s)
        pair.check_windows()
        sizes.append(pair.client.session._streams[sid].recv_window.size)
    return sizes


TUNED = SessionConfig(
    initial_stream_window_bytes=64 * KiB,
    min_stream_window_bytes=64 * KiB,
    initial_rate_bytes_per_s=64 * KiB,  # so the first stream starts small at 50 ms
    max_stream_window_bytes=4 * MiB,
)


def test_a_window_bound_stream_grows_to_the_cap_and_new_streams_start_there() -> None:
    pair = SessionPair(TUNED, TUNED).establish_with_rtt(0.05)
    client = pair.client.session
    assert client.stream_window_estimate() == 64 * KiB
    sid = client.open_stream(META)
    sizes = _bulk(pair, sid, 9, 0.025)
    assert sizes[0] <= 128 * KiB
    assert sizes[-3:] == [4 * MiB] * 3  # doubled once per RTT, then held at the cap
    assert all(b >= a for a, b in itertools.pairwise(sizes))
    assert client.learned_stream_window == 4 * MiB == client.stream_window_estimate()
    fresh = client.open_stream(META)
    pair.round_trip(0.025)
    assert pair.server.session._streams[fresh].send_window == 4 * MiB  # its OPEN said so
    # the learned estimate also reaches streams the *server* opens (SETTINGS, §5.2)
    assert pair.server.session.peer_settings[3] == 4 * MiB
    assert pair.client.session._credit.window.size >= 2 * 4 * MiB


def test_a_standing_queue_shrinks_a_tuned_window() -> None:
    pair = SessionPair(TUNED, TUNED).establish_with_rtt(0.05)
    sid = pair.client.session.open_stream(META)
    assert _bulk(pair, sid, 9, 0.025)[-1] == 4 * MiB
    sizes = _bulk(pair, sid, 4, 0.075)  # 150 ms: 3x the minimum, a queue
    assert sizes[-1] < 4 * MiB
    assert sizes[-1] >= TUNED.min_stream_window_bytes


def test_a_fresh_stream_at_265_ms_carries_768_kb_in_one_round_trip() -> None:
    """DESIGN.md principle 4 / §N7.4: the first stream over a long link starts from
    min RTT x the assumed rate, not from a small default."""
    pair = SessionPair().establish_with_rtt(0.265)
    client, server = pair.client.session, pair.server.session
    assert client.rtt.min == pytest.approx(0.265)
    assert client.stream_window_estimate() >= 768 * KiB
    sid = client.open_stream(META)
    client.send_data(sid, b"GET /big HTTP/1.1\r\n\r\n", end_stream=True)
    start = pair.now
    pair.flight(pair.client, pair.server, 0.1325)
    server.send_data(sid, b"r" * (768 * KiB), end_stream=True)
    pair.flight(pair.server, pair.client, 0.1325)
    assert len(pair.client.received[sid]) == 768 * KiB
    assert pair.client.end_count[sid] == 1
    assert pair.now - start == pytest.approx(0.265)


def test_without_the_estimate_the_same_response_takes_several_round_trips() -> None:
    slow = SessionConfig(initial_rate_bytes_per_s=1)
    pair = SessionPair(slow, slow).establish_with_rtt(0.265)
    sid = pair.client.session.open_stream(META)
    pair.flight(pair.client, pair.server, 0.1325)
    pair.server.session.send_data(sid, b"r" * (768 * KiB), end_stream=True)
    flights = 0
    while sid not in pair.client.ended and flights < 20:
        pair.flight(pair.server, pair.client, 0.1325)
        pair.flight(pair.client, pair.server, 0.1325)
        flights += 1
    assert flights >= 3


def test_the_estimate_before_and_after_an_rtt_sample() -> None:
    config = SessionConfig()
    pair = SessionPair(config, config)
    client = pair.client.session
    assert client.stream_window_estimate() == config.initial_stream_window_bytes
    pair.establish_with_rtt(0.001)  # loopback: 8 KiB by the rate, the floor wins
    assert client.stream_window_estimate() == config.min_stream_window_bytes
    pair = SessionPair(config, config).establish_with_rtt(5.0)  # capped
    assert pair.client.session.stream_window_estimate() == config.max_stream_window_bytes


def test_a_learned_window_hint_seeds_a_new_connection() -> None:
    from tunnel.mux import Session

    session = Session(SessionConfig(), client=True, now=0.0, learned_window_hint=3 * MiB)
    assert session.stream_window_estimate() == 3 * MiB
    capped = Session(SessionConfig(), client=True, now=0.0, learned_window_hint=1 << 40)
    assert capped.learned_stream_window == SessionConfig().max_stream_window_bytes
