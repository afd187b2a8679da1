"""The session (PROTOCOL.md §6, §8-§10): stream lifecycle and its transition
table, ids, reset, GOAWAY, flow-control violations, the error budget, stalls,
keepalive and dead-peer detection. A manual clock throughout."""

from __future__ import annotations

import pytest

from tests.mux_pair import RawPeer, SessionPair, parse_frames, raw_frame, raw_settings_payload
from tunnel.mux import (
    ConnectionTerminated,
    DataReceived,
    ErrorCode,
    GoAwayReceived,
    PingAcknowledged,
    Session,
    SessionClosedError,
    SessionConfig,
    StreamClosedError,
    StreamEnded,
    StreamLimitError,
    StreamMetadata,
    StreamOpened,
    StreamReset,
)
from tunnel.mux.constants import MAX_STREAM_ID
from tunnel.mux.stream import StreamState

HELLO, SETTINGS, OPEN, DATA, WINDOW_UPDATE, RESET, PING, PONG, GOAWAY = range(9)
END = 0x1
META = StreamMetadata(client_address=("192.0.2.10", 40000), edge_id="test")


def u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


def resets_in(frames: list) -> dict[int, int]:
    return {f[2]: int.from_bytes(f[3], "big") for f in frames if f[0] == RESET}


def goaway_in(frames: list) -> tuple[int, int, bytes]:
    [payload] = [f[3] for f in frames if f[0] == GOAWAY]
    return int.from_bytes(payload[:4], "big"), int.from_bytes(payload[4:8], "big"), payload[8:]


# -- §6.1 opening, 0-RTT, a request/response ---------------------------------------------


def test_open_is_zero_rtt_open_and_data_leave_in_one_flight() -> None:
    pair = SessionPair().establish()
    sid = pair.client.session.open_stream(META)
    pair.client.session.send_data(sid, b"GET / HTTP/1.1\r\n\r\n")
    frames = parse_frames(b"".join(pair.client.session.data_to_send()))
    assert [(f[0], f[2]) for f in frames] == [(OPEN, sid), (DATA, sid)]


def test_a_request_and_response_stream_end_to_end() -> None:
    pair = SessionPair(chunk=7).establish()
    sid = pair.client.session.open_stream(META)
    pair.client.session.send_data(sid, b"request", end_stream=True)
    pair.pump()
    assert pair.server.opened == {sid: META}
    assert pair.server.received[sid] == b"request" and sid in pair.server.ended
    pair.server.session.send_data(sid, b"response" * 1000)
    pair.server.session.end_stream(sid)
    pair.pump()
    assert pair.client.received[sid] == b"response" * 1000
    assert pair.client.end_count[sid] == pair.server.end_count[sid] == 1
    assert pair.client.session.open_streams == pair.server.session.open_streams == 0
    assert pair.client.resets == pair.server.resets == {}


def test_a_stream_holds_a_send_queue_only_while_data_waits() -> None:
    # An empty deque is 760 B: every idle stream (a WebSocket's, for hours) paid it.
    pair = SessionPair().establish()
    sid = pair.client.session.open_stream(META)
    stream = pair.client.session._streams[sid]
    assert stream.send_queue == ()
    pair.client.session.send_data(sid, b"x" * 100)
    pair.client.session.send_data(sid, b"y" * 50)
    assert len(stream.send_queue) == 2 and stream.send_buffered == 150
    frames = parse_frames(b"".join(pair.client.session.data_to_send()))
    assert b"".join(f[3] for f in frames if f[0] == DATA) == b"x" * 100 + b"y" * 50
    assert stream.send_queue == () and stream.send_buffered == 0


def test_open_with_end_stream_carries_no_data() -> None:
    pair = SessionPair().establish()
    sid = pair.client.session.open_stream(META, end_stream=True)
    pair.pump()
    assert pair.server.of_type(StreamEnded) == [StreamEnded(sid)]
    with pytest.raises(StreamClosedError):
        pair.client.session.send_data(sid, b"late")
    pair.server.session.send_data(sid, b"reply", end_stream=True)
    pair.pump()
    assert pair.client.received[sid] == b"reply"
    assert pair.client.session.open_streams == pair.server.session.open_streams == 0


def test_half_close_lets_the_other_direction_carry_on() -> None:
    pair = SessionPair().establish()
    sid = pair.client.session.open_stream(META)
    pair.client.session.end_stream(sid)
    pair.pump()
    for i in range(3):
        pair.server.session.send_data(sid, bytes([i]) * 100)
        pair.pump()
    assert pair.client.received[sid] == b"\0" * 100 + b"\1" * 100 + b"\2" * 100
    assert pair.server.session._streams[sid].state is StreamState.HALF_CLOSED_REMOTE


def test_a_raw_metadata_block_is_passed_through() -> None:
    pair = SessionPair().establish()
    sid = pair.client.session.open_stream(META.encode())
    pair.pump()
    assert pair.server.opened[sid] == META


# -- §6.3 stream ids -------------------------------------------------------------------


def test_client_ids_are_odd_server_ids_even_and_both_increase() -> None:
    pair = SessionPair().establish()
    client_ids = [pair.client.session.open_stream(META) for _ in range(3)]
    server_ids = [pair.server.session.open_stream(META) for _ in range(3)]
    pair.pump()
    assert client_ids == [1, 3, 5] and server_ids == [2, 4, 6]
    assert set(pair.server.opened) == {1, 3, 5} and set(pair.client.opened) == {2, 4, 6}


def test_stream_id_exhaustion_sends_goaway_and_refuses_to_open() -> None:
    pair = SessionPair().establish()
    client = pair.client.session
    client._table.next_local_id = MAX_STREAM_ID  # 2^32 - 1, the last odd id
    assert client.open_stream(META) == MAX_STREAM_ID
    with pytest.raises(SessionClosedError, match="exhausted"):
        client.open_stream(META)
    pair.pump()
    assert pair.server.of_type(GoAwayReceived)[0].error_code == ErrorCode.NO_ERROR
    assert MAX_STREAM_ID in pair.server.opened


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        ([(OPEN, 2)], "wrong parity"),
        ([(OPEN, 5), (OPEN, 3)], "lower id"),
        ([(OPEN, 5), (OPEN, 5)], "reused id"),
        ([(DATA, 9)], "DATA on an idle stream"),
        ([(WINDOW_UPDATE, 9)], "WINDOW_UPDATE on an idle stream"),
        ([(RESET, 9)], "RESET on an idle stream"),
        ([(OPEN, 1), (WINDOW_UPDATE, 4)], "a server id the server never used"),
    ],
)
def test_ids_the_peer_may_not_use_are_protocol_errors(frames: list, why: str) -> None:
    peer = RawPeer()
    for frame_type, sid in frames:
        peer.send(frame_type, 0, sid, u32(1))
    assert peer.terminated.error_code == ErrorCode.PROTOCOL_ERROR, why


# -- §6.4 the stream state table --------------------------------------------------------

OPEN_S, HCL, HCR, CLOSED, GONE = "open", "hcl", "hcr", "closed", "gone"
ERROR, RESET_STREAM = "StreamClosedError", "STREAM_CLOSED reset"

#: Written from PROTOCOL.md §6.4, not from stream.TRANSITIONS.
EXPECTED = {
    (OPEN_S, "send_data"): OPEN_S,
    (OPEN_S, "send_end"): HCL,
    (OPEN_S, "recv_data"): OPEN_S,
    (OPEN_S, "recv_end"): HCR,
    (HCL, "send_data"): ERROR,
    (HCL, "send_end"): ERROR,
    (HCL, "recv_data"): HCL,
    (HCL, "recv_end"): GONE,
    (HCR, "send_data"): HCR,
    (HCR, "send_end"): GONE,  # CLOSED, then forgotten once its END is written
    (HCR, "recv_data"): RESET_STREAM,
    (HCR, "recv_end"): RESET_STREAM,
    (CLOSED, "send_data"): ERROR,
    (CLOSED, "send_end"): ERROR,
    (CLOSED, "recv_data"): RESET_STREAM,
    (CLOSED, "recv_end"): RESET_STREAM,
    (GONE, "send_data"): ERROR,
    (GONE, "send_end"): ERROR,
    (GONE, "recv_data"): GONE,  # late DATA on a forgotten stream is dropped
    (GONE, "recv_end"): GONE,
}
STATE_OF = {
    StreamState.OPEN: OPEN_S,
    StreamState.HALF_CLOSED_LOCAL: HCL,
    StreamState.HALF_CLOSED_REMOTE: HCR,
    StreamState.CLOSED: CLOSED,
}


def _stream_in(state: str) -> tuple[RawPeer, int, int]:
    """A client session with stream ``sid`` in ``state`` and a sibling that stays open;
    the server is hand-made."""
    peer = RawPeer(session_is_client=True)
    session = peer.session
    sid = session.open_stream(META)
    sibling = session.open_stream(META)
    if state in (HCL, GONE):
        session.end_stream(sid)
    peer.read()
    if state in (HCR, CLOSED, GONE):
        peer.send(DATA, END, sid)
    if state == CLOSED:
        session.end_stream(sid)  # both ended, our END not yet written: still tracked
    assert _state(session, sid) == state
    return peer, sid, sibling


def _state(session: Session, sid: int) -> str:
    stream = session._streams.get(sid)
    return GONE if stream is None else STATE_OF[stream.state]


@pytest.mark.parametrize(("state", "action"), sorted(EXPECTED))
def test_every_state_against_every_input(state: str, action: str) -> None:
    peer, sid, sibling = _stream_in(state)
    session = peer.session
    expected = EXPECTED[(state, action)]
    before = len(peer.events)
    if action == "send_data":
        call = lambda: session.send_data(sid, b"x")  # noqa: E731
    elif action == "send_end":
        call = lambda: session.end_stream(sid)  # noqa: E731
    elif action == "recv_data":
        call = lambda: peer.send(DATA, 0, sid, b"y")  # noqa: E731
    else:
        call = lambda: peer.send(DATA, END, sid)  # noqa: E731
    if expected == ERROR:
        with pytest.raises(StreamClosedError):
            call()
        already_queued = [(DATA, END, sid, b"")] if state == CLOSED else []
        assert peer.read() == already_queued  # local misuse sends nothing
        return
    call()
    frames = peer.read()
    new = peer.events[before:]
    if expected == RESET_STREAM:
        assert new == [StreamReset(sid, ErrorCode.STREAM_CLOSED, remote=False)]
        assert resets_in(frames) == {sid: ErrorCode.STREAM_CLOSED}
        assert _state(session, sid) == GONE
    else:
        assert resets_in(frames) == {}
        if action == "recv_data" and state != GONE:
            assert new == [DataReceived(sid, b"y")]
        elif action == "recv_end" and state != GONE:
            assert new == [StreamEnded(sid)]
        else:
            assert new == []
        assert _state(session, sid) == expected
    # siblings carry on, and so does the connection
    assert peer.terminated is None
    peer.send(DATA, 0, sibling, b"still here")
    assert peer.events[-1] == DataReceived(sibling, b"still here")
    session.send_data(sibling, b"and here")
    assert peer.read() == [(DATA, 0, sibling, b"and here")]


def test_an_empty_send_after_the_end_sends_nothing() -> None:
    """Found by the property test: END_STREAM went out a second time, and the
    peer reset the stream with STREAM_CLOSED."""
    pair = SessionPair().establish()
    client = pair.client.session
    on_open = client.open_stream(META, end_stream=True)
    in_data = client.open_stream(META)
    client.send_data(in_data, b"last", end_stream=True)
    pair.pump()
    client.send_data(on_open, b"")
    client.send_data(in_data, b"")
    assert client.data_to_send() == []
    pair.pump()
    assert pair.server.resets == {} and pair.server.end_count == {on_open: 1, in_data: 1}


def test_commands_on_unknown_streams_are_local_errors() -> None:
    pair = SessionPair().establish()
    with pytest.raises(StreamClosedError):
        pair.client.session.send_data(99, b"x")
    with pytest.raises(StreamClosedError):
        pair.client.session.end_stream(99)
    pair.client.session.reset_stream(99)  # a no-op: it may have closed meanwhile
    pair.client.session.acknowledge_received_data(99, 10, pair.now)
    assert pair.client.session.data_to_send() == []


# -- §6.5 reset ------------------------------------------------------------------


def test_reset_drops_queued_data_and_reaches_the_peer() -> None:
    pair = SessionPair().establish()
    sid = pair.client.session.open_stream(META)
    keep = pair.client.session.open_stream(META)
    pair.pump()
    pair.client.session.send_data(sid, b"never sent")
    pair.client.session.reset_stream(sid, ErrorCode.UPSTREAM_RESET)
    pair.client.session.send_data(keep, b"kept")
    frames = parse_frames(b"".join(pair.client.session.data_to_send()))
    assert [(f[0], f[2]) for f in frames] == [(RESET, sid), (DATA, keep)]
    pair.server.take(
        pair.server.session.receive_data(b"".join(raw_frame(*f) for f in frames), 0), 0
    )
    assert pair.server.resets == {sid: ErrorCode.UPSTREAM_RESET}
    assert pair.server.of_type(StreamReset) == [StreamReset(sid, ErrorCode.UPSTREAM_RESET, True)]
    assert pair.server.received[keep] == b"kept"
    assert pair.client.of_type(StreamReset) == []  # the local reset is not an event


def test_data_in_flight_after_a_reset_is_dropped_and_its_credit_returned() -> None:
    config = SessionConfig(initial_connection_window_bytes=100_000)
    peer = RawPeer(config)
    peer.send(OPEN, 0, 1, u32(1000))
    peer.session.reset_stream(1)
    assert resets_in(peer.read()) == {1: ErrorCode.CANCEL}
    peer.send(DATA, 0, 1, b"x" * 60_000)  # was in flight when the RESET left
    assert peer.read() == [(WINDOW_UPDATE, 0, 0, u32(60_000))]  # 100 000 available again
    assert not peer.of_type(DataReceived)
    peer.send(DATA, 0, 1, b"x" * 45_000)  # 55 000 left: no update due yet
    assert peer.read() == [] and peer.terminated is None
    peer.send(DATA, 0, 1, b"x" * 55_001)  # closed stream or not, it counts
    assert peer.terminated.error_code == ErrorCode.FLOW_CONTROL_ERROR


def test_reset_by_the_peer_after_we_ended_is_reported() -> None:
    peer = RawPeer(session_is_client=True)
    sid = peer.session.open_stream(META, end_stream=True)
    peer.send(RESET, 0, sid, u32(ErrorCode.CONNECT_FAILED))
    assert peer.events[-1] == StreamReset(sid, ErrorCode.CONNECT_FAILED, remote=True)
    assert peer.session.open_streams == 0
    peer.send(RESET, 0, sid, u32(ErrorCode.CANCEL))  # a second one is ignored
    assert peer.terminated is None


# -- §6.2 metadata on the wire ------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [bytes.fromhex("08 0005 61"), bytes.fromhex("01 0007 09 00000000 0000"), b"\x08\x00"],
)
def test_malformed_metadata_resets_only_that_stream(metadata: bytes) -> None:
    peer = RawPeer()
    peer.send(OPEN, 0, 1, u32(1000))
    peer.send(OPEN, 0, 3, u32(1000) + metadata)
    peer.send(DATA, 0, 3, b"discarded")
    peer.send(DATA, 0, 1, b"fine")
    assert resets_in(peer.read()) == {3: ErrorCode.METADATA_ERROR}
    assert [e.stream_id for e in peer.of_type(StreamOpened)] == [1]
    assert peer.of_type(DataReceived) == [DataReceived(1, b"fine")]
    assert peer.terminated is None


def test_metadata_above_our_limit_is_a_metadata_error() -> None:
    peer = RawPeer(SessionConfig(max_metadata_bytes=64))
    peer.send(OPEN, 0, 1, u32(1000) + StreamMetadata(host="h" * 61).encode())  # 64 octets
    peer.send(OPEN, 0, 3, u32(1000) + StreamMetadata(host="h" * 62).encode())  # 65
    assert resets_in(peer.read()) == {3: ErrorCode.METADATA_ERROR}
    assert [e.stream_id for e in peer.of_type(StreamOpened)] == [1]


def test_metadata_above_the_peers_limit_is_refused_locally() -> None:
    pair = SessionPair(server_config=SessionConfig(max_metadata_bytes=64)).establish()
    with pytest.raises(Exception, match="MAX_METADATA_BYTES") as info:
        pair.client.session.open_stream(StreamMetadata(host="h" * 100))
    assert info.value.code == ErrorCode.METADATA_ERROR
    assert pair.client.session.open_stream(META) == 1  # the id was not consumed


# -- §6.6 GOAWAY and drain ----------------------------------------------------------


def test_goaway_refuses_new_streams_and_lets_in_flight_ones_finish() -> None:
    pair = SessionPair().establish()
    client, server = pair.client.session, pair.server.session
    first, second = client.open_stream(META), client.open_stream(META)
    pair.pump()
    server.go_away(ErrorCode.NO_ERROR, "deploy")
    late = client.open_stream(META)  # crosses the GOAWAY on the wire
    client.send_data(late, b"unprocessed")
    pair.pump()
    assert pair.client.of_type(GoAwayReceived) == [GoAwayReceived(second, 0, "deploy")]
    assert pair.client.resets == {late: ErrorCode.REFUSED_STREAM}
    assert late not in pair.server.opened and late not in pair.server.received
    with pytest.raises(SessionClosedError):
        client.open_stream(META)
    with pytest.raises(SessionClosedError):
        server.open_stream(META)
    assert client.closing and server.closing and not client.can_open_stream
    for sid in (first, second):
        client.send_data(sid, b"req", end_stream=True)
        server.send_data(sid, b"resp", end_stream=True)
    pair.pump()
    assert [pair.client.received[s] for s in (first, second)] == [b"resp", b"resp"]
    assert client.open_streams == server.open_streams == 0
    assert pair.client.terminated is None and pair.server.terminated is None
    server.go_away()  # idempotent
    assert server.data_to_send() == []


def test_goaway_carries_the_last_stream_id_the_sender_saw() -> None:
    peer = RawPeer()
    for sid in (1, 3, 7):
        peer.send(OPEN, 0, sid, u32(10))
    peer.read()
    peer.session.go_away(ErrorCode.NO_ERROR, "bye")
    assert goaway_in(peer.read()) == (7, ErrorCode.NO_ERROR, b"bye")
    peer.send(OPEN, 0, 9, u32(10))  # sent before it saw the GOAWAY
    assert resets_in(peer.read()) == {9: ErrorCode.REFUSED_STREAM}
    assert not [e for e in peer.of_type(StreamOpened) if e.stream_id == 9]


def test_goaway_with_an_error_refuses_unprocessed_streams_and_terminates() -> None:
    peer = RawPeer(session_is_client=True)
    processed, unprocessed = peer.session.open_stream(META), peer.session.open_stream(META)
    peer.send(GOAWAY, 0, 0, u32(processed) + u32(ErrorCode.INTERNAL_ERROR) + b"crash")
    assert peer.events[-4:] == [
        GoAwayReceived(processed, ErrorCode.INTERNAL_ERROR, "crash"),
        StreamReset(unprocessed, ErrorCode.REFUSED_STREAM, remote=True),
        StreamReset(processed, ErrorCode.INTERNAL_ERROR, remote=True),
        ConnectionTerminated(ErrorCode.INTERNAL_ERROR, "crash", remote=True),
    ]
    assert all(f[0] != GOAWAY for f in peer.read())  # no GOAWAY in reply


def test_a_connection_error_sends_goaway_with_the_last_peer_stream() -> None:
    peer = RawPeer()
    peer.send(OPEN, 0, 5, u32(10))
    peer.send(PONG, 0, 0, b"unasked!")
    assert goaway_in(peer.read()) == (5, ErrorCode.PROTOCOL_ERROR, b"protocol error")
    assert peer.events[-2:] == [
        StreamReset(5, ErrorCode.PROTOCOL_ERROR, remote=False),
        ConnectionTerminated(ErrorCode.PROTOCOL_ERROR, "protocol error", remote=False),
    ]
    assert peer.feed(raw_frame(PING, 0, 0, b"12345678")) == []  # terminated: ignored


def test_connection_lost_resets_every_stream() -> None:
    pair = SessionPair().establish()
    sid = pair.client.session.open_stream(META)
    events = pair.client.session.connection_lost("eof")
    assert events == [
        StreamReset(sid, ErrorCode.CANCEL, remote=True),
        ConnectionTerminated(ErrorCode.CANCEL, "eof", remote=True),
    ]
    assert pair.client.session.connection_lost() == []
    with pytest.raises(SessionClosedError):
        pair.client.session.open_stream(META)


# -- §7.2 flow-control violations by the peer -------------------------------------------


def test_a_peer_that_exceeds_a_stream_window_is_cut_off() -> None:
    peer = RawPeer()  # announces INITIAL_STREAM_WINDOW = 256 KiB
    peer.send(OPEN, 0, 1, u32(1000))
    for _ in range(4):
        peer.send(DATA, 0, 1, b"z" * 65536)
    assert peer.terminated is None
    peer.send(DATA, 0, 1, b"z")
    assert peer.terminated == ConnectionTerminated(
        ErrorCode.FLOW_CONTROL_ERROR, "flow control error", remote=False
    )
    assert goaway_in(peer.read())[:2] == (1, ErrorCode.FLOW_CONTROL_ERROR)


def test_a_peer_that_exceeds_the_connection_window_is_cut_off() -> None:
    peer = RawPeer(SessionConfig(initial_connection_window_bytes=100_000))
    peer.send(OPEN, 0, 1, u32(10))
    peer.send(OPEN, 0, 3, u32(10))
    peer.send(DATA, 0, 1, b"a" * 60_000)
    peer.send(DATA, 0, 3, b"b" * 40_000)
    assert peer.terminated is None
    peer.send(DATA, 0, 3, b"b")
    assert peer.terminated.error_code == ErrorCode.FLOW_CONTROL_ERROR


def test_window_update_overflow() -> None:
    peer = RawPeer(session_is_client=True)
    sid, sibling = peer.session.open_stream(META), peer.session.open_stream(META)
    peer.send(WINDOW_UPDATE, 0, sid, u32(2**31 - 1))  # 256 KiB + 2^31-1 > 2^31-1
    assert peer.events[-1] == StreamReset(sid, ErrorCode.FLOW_CONTROL_ERROR, remote=False)
    peer.send(WINDOW_UPDATE, 0, sibling, u32(2**31 - 1 - 262144))  # exactly the maximum
    assert peer.terminated is None
    peer.send(WINDOW_UPDATE, 0, 0, u32(2**31 - 1))
    assert peer.terminated.error_code == ErrorCode.FLOW_CONTROL_ERROR


def test_a_zero_window_update_on_a_stream_resets_it() -> None:
    peer = RawPeer(session_is_client=True)
    sid = peer.session.open_stream(META)
    peer.send(WINDOW_UPDATE, 0, sid, u32(0))
    assert peer.events[-1] == StreamReset(sid, ErrorCode.PROTOCOL_ERROR, remote=False)
    assert peer.terminated is None


def test_an_open_window_above_the_maximum_is_a_flow_control_error() -> None:
    peer = RawPeer()
    peer.send(OPEN, 0, 1, u32(2**31))
    assert peer.terminated.error_code == ErrorCode.FLOW_CONTROL_ERROR


# -- §8 abuse resistance --------------------------------------------------------------


def _calm(peer: RawPeer) -> bool:
    t = peer.terminated
    if t is None:
        return False
    assert t.error_code == ErrorCode.ENHANCE_YOUR_CALM
    assert goaway_in(peer.read())[1] == ErrorCode.ENHANCE_YOUR_CALM
    return True


def test_ping_flood_spends_the_budget_which_refills_over_time() -> None:
    peer = RawPeer()
    peer.feed(raw_frame(PING, 0, 0, b"pingping") * 1000)  # 1000 points at once: the burst
    assert not _calm(peer)
    peer.read()
    peer.now += 1.0  # +100 points
    peer.feed(raw_frame(PING, 0, 0, b"pingping") * 100)
    assert not _calm(peer)
    peer.send(PING, 0, 0, b"pingping")
    assert _calm(peer)


def test_a_steady_ping_rate_below_the_refill_is_fine() -> None:
    peer = RawPeer()
    for _ in range(60):
        peer.now += 1.0
        peer.feed(raw_frame(PING, 0, 0, b"pingping") * 90)
        assert len([f for f in peer.read() if f[0] == PONG]) == 90
    assert peer.terminated is None


def test_settings_flood() -> None:
    peer = RawPeer()
    peer.feed(raw_frame(SETTINGS, 0, 0, raw_settings_payload({2: 5})) * 1000)
    assert not _calm(peer)
    peer.send(SETTINGS, 0, 0)
    assert _calm(peer)


def test_open_then_reset_flood() -> None:
    peer = RawPeer()
    flood = b"".join(
        raw_frame(OPEN, 0, sid, u32(1000)) + raw_frame(RESET, 0, sid, u32(ErrorCode.CANCEL))
        for sid in range(1, 2 * 1001, 2)
    )
    peer.feed(flood)
    assert _calm(peer)
    assert len(peer.of_type(StreamOpened)) == 1001


def test_streams_reset_after_their_data_cost_nothing() -> None:
    """The legitimate pattern (a client hangs up mid-request) is not punished."""
    peer = RawPeer()
    for sid in range(1, 2 * 1500, 2):
        peer.send(OPEN, 0, sid, u32(1000))
        peer.send(DATA, 0, sid, b"GET / HTTP/1.1\r\n")
        peer.send(RESET, 0, sid, u32(ErrorCode.CANCEL))
    assert peer.terminated is None


def test_empty_data_flood() -> None:
    peer = RawPeer()
    peer.send(OPEN, 0, 1, u32(1000))
    peer.feed(raw_frame(DATA, 0, 1) * 1000)
    assert not _calm(peer)
    peer.send(DATA, 0, 1)
    assert _calm(peer)


def test_empty_data_flood_on_a_closed_stream_costs_too() -> None:
    peer = RawPeer()
    peer.send(OPEN, 0, 1, u32(1000))
    peer.send(RESET, 0, 1, u32(ErrorCode.CANCEL))  # 1 point: reset before data
    peer.feed(raw_frame(DATA, 0, 1) * 999)
    assert not _calm(peer)
    peer.send(DATA, 0, 1)
    assert _calm(peer)


def test_stream_errors_cost_ten_points() -> None:
    peer = RawPeer()
    for sid in range(1, 2 * 100, 2):  # 100 streams that each send DATA after END
        peer.send(OPEN, END, sid, u32(1000))
        peer.send(DATA, 0, sid, b"x")
    assert not _calm(peer)
    assert len(resets_in(peer.read())) == 100
    peer.send(OPEN, END, 201, u32(1000))
    peer.send(DATA, 0, 201, b"x")
    assert _calm(peer)


def test_streams_above_max_concurrent_streams_are_refused() -> None:
    config = SessionConfig(max_concurrent_streams=2, initial_connection_window_bytes=100_000)
    peer = RawPeer(config)
    for sid in (1, 3, 5):
        peer.send(OPEN, 0, sid, u32(1000))
    peer.send(DATA, 0, 5, b"0-RTT data" * 6000)  # 60 000 octets, discarded
    assert [e.stream_id for e in peer.of_type(StreamOpened)] == [1, 3]
    frames = peer.read()
    assert resets_in(frames) == {5: ErrorCode.REFUSED_STREAM}
    assert (WINDOW_UPDATE, 0, 0, u32(60_000)) in frames  # its credit came back
    peer.send(RESET, 0, 1, u32(ErrorCode.CANCEL))  # one closes: room for one more
    peer.send(OPEN, 0, 7, u32(1000))
    assert peer.of_type(StreamOpened)[-1].stream_id == 7


def test_the_opener_respects_the_peers_stream_limit() -> None:
    pair = SessionPair(server_config=SessionConfig(max_concurrent_streams=2)).establish()
    client = pair.client.session
    a, _ = client.open_stream(META), client.open_stream(META)
    assert not client.can_open_stream
    with pytest.raises(StreamLimitError):
        client.open_stream(META)
    client.reset_stream(a)
    assert client.open_stream(META) == 5
    pair.pump()
    assert pair.server.resets == {a: ErrorCode.CANCEL}
    assert set(pair.server.opened) == {1, 3, 5}


def test_refused_stream_flood() -> None:
    peer = RawPeer(SessionConfig(max_concurrent_streams=1))
    peer.send(OPEN, 0, 1, u32(1000))
    peer.feed(b"".join(raw_frame(OPEN, 0, sid, u32(1)) for sid in range(3, 3 + 2 * 1000, 2)))
    assert not _calm(peer)
    peer.send(OPEN, 0, 2001 + 2, u32(1))
    assert _calm(peer)


def test_a_peer_that_floods_pings_without_reading_is_cut_off() -> None:
    """The replies a peer provokes are bounded even within its error budget."""
    config = SessionConfig(max_pending_control_frames=100, error_budget=1e9)
    peer = RawPeer(config)
    peer.read()
    peer.feed(raw_frame(PING, 0, 0, b"pingping") * 100)
    assert peer.terminated is None
    assert peer.session.statistics().pending_control_frames == 100
    peer.send(PING, 0, 0, b"pingping")
    assert peer.terminated.error_code == ErrorCode.ENHANCE_YOUR_CALM
    assert peer.session.statistics().pending_control_frames <= 101  # + the GOAWAY


def test_refusals_are_bounded_like_other_replies() -> None:
    config = SessionConfig(
        max_pending_control_frames=50, error_budget=1e9, max_concurrent_streams=1
    )
    peer = RawPeer(config)
    peer.read()
    peer.feed(b"".join(raw_frame(OPEN, 0, sid, u32(1)) for sid in range(1, 2 * 60, 2)))
    assert peer.terminated.error_code == ErrorCode.ENHANCE_YOUR_CALM
    assert peer.session.statistics().pending_control_frames <= 51


# -- §8 stalls -----------------------------------------------------------------------


def _stalled_pair(stall_timeout_s: float = 10.0) -> tuple[SessionPair, int, int]:
    config = SessionConfig(stall_timeout_s=stall_timeout_s)
    pair = SessionPair(config, config).establish()
    pair.server.auto_ack = False  # the server never returns credit
    sid = pair.client.session.open_stream(META)
    sibling = pair.client.session.open_stream(META)
    pair.client.session.send_data(sid, b"s" * (1 << 20))
    pair.pump()
    assert len(pair.server.received[sid]) == 256 * 1024
    return pair, sid, sibling


def test_a_stream_without_credit_for_the_stall_timeout_is_reset() -> None:
    pair, sid, sibling = _stalled_pair()
    for _ in range(4):  # 8 s: pings keep the connection alive, the stream waits
        pair.advance(2.0)
        pair.pump()
    assert pair.client.resets == {}
    for _ in range(2):
        pair.advance(2.0)
        pair.pump()
    assert pair.client.of_type(StreamReset) == [StreamReset(sid, ErrorCode.STALLED, remote=False)]
    assert pair.server.of_type(StreamReset) == [StreamReset(sid, ErrorCode.STALLED, remote=True)]
    assert pair.client.session.send_buffered(sid) == 0
    pair.client.session.send_data(sibling, b"unaffected")
    pair.pump()
    assert pair.server.received[sibling] == b"unaffected"
    assert pair.client.terminated is None


def test_credit_before_the_stall_timeout_saves_the_stream() -> None:
    pair, sid, _ = _stalled_pair()
    for _ in range(4):
        pair.advance(2.0)
        pair.pump()
    pair.server.session.acknowledge_received_data(sid, 256 * 1024, pair.now)
    pair.server.auto_ack = True
    pair.pump()
    for _ in range(4):
        pair.advance(2.0)
        pair.pump()
    assert pair.client.resets == {}
    assert len(pair.server.received[sid]) == 1 << 20


def test_a_stream_with_nothing_to_send_never_stalls() -> None:
    config = SessionConfig(stall_timeout_s=5.0)
    pair = SessionPair(config, config).establish()
    sid = pair.client.session.open_stream(META)
    pair.client.session.send_data(sid, b"")  # nothing to send, window open
    server_sid = pair.server.session.open_stream(META)
    pair.pump()
    pair.client.session._streams[server_sid].send_window = 0  # as if spent
    pair.client.session.send_data(server_sid, b"")  # nothing to send, no window
    for _ in range(5):
        pair.advance(2.0)
        pair.pump()
    assert pair.client.resets == {} and pair.server.resets == {}


# -- §10 keepalive, RTT, dead peers ---------------------------------------------------


def test_ping_measures_the_round_trip() -> None:
    pair = SessionPair().establish()
    pair.client.session.ping(pair.now)
    pair.round_trip(0.0425)
    assert pair.client.of_type(PingAcknowledged)[-1].rtt_s == pytest.approx(0.085)
    assert pair.client.session.rtt.latest == pytest.approx(0.085)
    stats = pair.client.session.statistics()
    assert stats.min_rtt_s == 0.0  # the first ping, answered at once by pump()
    assert stats.srtt_s == pytest.approx(0.085 / 8)  # RFC 6298: 7/8 old + 1/8 new


def test_keepalive_pings_every_interval() -> None:
    pair = SessionPair().establish()
    acked = len(pair.client.of_type(PingAcknowledged))
    assert pair.client.session.next_deadline() == pytest.approx(pair.now + 2.0)
    pair.advance(2.0)
    frames = parse_frames(b"".join(pair.client.session.data_to_send()))
    assert [f[0] for f in frames] == [PING]
    pair.server.take(
        pair.server.session.receive_data(b"".join(raw_frame(*f) for f in frames), 0), 0
    )
    pair.pump()
    assert len(pair.client.of_type(PingAcknowledged)) == acked + 1


def test_a_silent_peer_is_declared_dead_after_the_ping_timeout() -> None:
    config = SessionConfig(ping_interval_s=1.0, ping_timeout_s=3.0)
    pair = SessionPair(config, config).establish()
    sid = pair.client.session.open_stream(META)
    start = pair.now
    assert pair.client.session.next_deadline() == start + 1.0
    pair.now = start + 2.999
    pair.client.take(pair.client.session.handle_timer(pair.now), pair.now)
    assert pair.client.terminated is None
    assert pair.client.session.next_deadline() == pytest.approx(start + 3.0)
    pair.now = start + 3.0
    pair.client.take(pair.client.session.handle_timer(pair.now), pair.now)
    assert pair.client.events[-2:] == [
        StreamReset(sid, ErrorCode.TIMEOUT, remote=False),
        ConnectionTerminated(ErrorCode.TIMEOUT, "ping timeout", remote=False),
    ]
    assert goaway_in(parse_frames(b"".join(pair.client.session.data_to_send())))[1] == 0xC


def test_a_peer_that_never_sends_hello_times_out() -> None:
    session = Session(SessionConfig(ping_timeout_s=6.0), client=True, now=0.0)
    session.receive_data(b"GEOEDGE\n", 1.0)  # the preface, then nothing
    assert session.handle_timer(6.9) == []
    assert session.handle_timer(7.0)[-1].error_code == ErrorCode.TIMEOUT


def test_any_frame_proves_the_peer_alive() -> None:
    config = SessionConfig(ping_interval_s=1.0, ping_timeout_s=3.0)
    peer = RawPeer(config)
    for _ in range(10):
        peer.advance(1.0)
        peer.send(WINDOW_UPDATE, 0, 0, u32(1))
    assert peer.terminated is None
    pings = [f for f in peer.read() if f[0] == PING]
    assert 8 <= len(pings) <= 9  # at most 8 outstanding, plus the one at HELLO


def test_statistics_is_a_snapshot() -> None:
    pair = SessionPair().establish()
    sid = pair.client.session.open_stream(META)
    pair.client.session.send_data(sid, b"x" * 1000)
    stats = pair.client.session.statistics()
    assert (stats.streams_open, stats.send_buffered, stats.established) == (1, 1000, True)
    pair.pump()
    assert stats.send_buffered == 1000
    after = pair.client.session.statistics()
    assert after.send_buffered == 0 and after.bytes_sent > stats.bytes_sent
    assert pair.server.session.statistics().bytes_received == after.bytes_sent


def test_window_update_and_reset_for_a_forgotten_stream_are_ignored() -> None:
    peer = RawPeer()
    peer.send(OPEN, 0, 1, u32(1000))
    peer.send(RESET, 0, 1, u32(ErrorCode.CANCEL))
    peer.send(WINDOW_UPDATE, 0, 1, u32(5))
    peer.send(RESET, 0, 1, u32(ErrorCode.CANCEL))
    assert peer.terminated is None


def test_stalled_streams_spend_the_budget_too() -> None:
    config = SessionConfig(stall_timeout_s=4.0, error_budget=8, error_budget_refill_per_s=0.001)
    pair = SessionPair(config, SessionConfig()).establish()
    pair.server.auto_ack = False
    for _ in range(2):
        sid = pair.client.session.open_stream(META)
        pair.client.session.send_data(sid, b"s" * (300 * 1024))
    pair.pump()
    for _ in range(3):
        pair.advance(2.0)
        pair.pump()
    assert pair.client.terminated.error_code == ErrorCode.ENHANCE_YOUR_CALM  # 2 x 5 > 8


@pytest.mark.parametrize(
    "changes",
    [
        {"max_frame_bytes": 1023},
        {"max_frame_bytes": 2**24 + 1},
        {"min_stream_window_bytes": 0},
        {"initial_stream_window_bytes": 1 << 20, "max_stream_window_bytes": 1 << 19},
        {"max_stream_window_bytes": 2**31},
        {"initial_connection_window_bytes": 1 << 30, "max_connection_window_bytes": 1 << 20},
        {"initial_rate_bytes_per_s": 0},
        {"max_concurrent_streams": 0},
        {"ping_interval_s": 6.0, "ping_timeout_s": 6.0},
        {"max_metadata_bytes": 63},
        {"max_metadata_bytes": 65536},
    ],
)
def test_config_rejects_inconsistent_values(changes: dict) -> None:
    with pytest.raises(ValueError):
        SessionConfig(**changes)


def test_statistics_count_the_time_streams_waited_for_credit() -> None:
    pair, sid, _ = _stalled_pair()
    before = pair.client.session.statistics()
    assert before.stream_credit_stalls == 1 and before.stream_credit_wait_s == 0.0
    for _ in range(2):  # 4 s without credit
        pair.advance(2.0)
        pair.pump()
    pair.server.session.acknowledge_received_data(sid, 256 * 1024, pair.now)
    pair.pump()
    after = pair.client.session.statistics()
    assert after.stream_credit_wait_s == pytest.approx(4.0)
    # The credit the server granted is counted on its side, stream and connection.
    granted = pair.server.session.statistics()
    assert granted.stream_credit_sent >= 256 * 1024
    assert granted.connection_window_wait_s == 0.0


def test_statistics_count_the_time_data_waited_for_the_connection_window() -> None:
    config = SessionConfig(initial_connection_window_bytes=128 * 1024)
    pair = SessionPair(config, config).establish()
    pair.server.auto_ack = False
    sid = pair.client.session.open_stream(META)
    pair.client.session.send_data(sid, b"c" * (512 * 1024))
    pair.pump()
    assert len(pair.server.received[sid]) < 512 * 1024  # the connection window held it
    pair.advance(1.5)
    pair.server.session.acknowledge_received_data(sid, len(pair.server.received[sid]), pair.now)
    pair.pump()
    stats = pair.client.session.statistics()
    assert stats.connection_window_wait_s == pytest.approx(1.5)
    assert pair.server.session.statistics().connection_credit_sent > 0
