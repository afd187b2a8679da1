"""CONTROL messages (PROTOCOL.md §5.14, §8.1; IMPLEMENTATION.md §N8.1): the
frame's layout, a message and its ACK across a session pair (byte at a time
too), message ids, what the application may not do, every malformed payload
as a connection error with its code, and the bounds a peer cannot push past:
the free rate, the unanswered messages, the outstanding ones."""

from __future__ import annotations

import pytest

from tests.mux_pair import RawPeer, SessionPair, parse_frames, raw_frame
from tunnel.mux import (
    ControlAcknowledged,
    ControlError,
    ControlKind,
    ControlReceived,
    ControlStatus,
    ErrorCode,
    FrameType,
    Session,
    SessionClosedError,
    SessionConfig,
    StreamMetadata,
)
from tunnel.mux import frames as codec
from tunnel.mux.control import (
    BUSY_REASON,
    FREE_CONTROL_PER_S,
    MAX_OUTSTANDING,
    MAX_UNANSWERED,
    MAX_UNANSWERED_BYTES,
)

CONTROL, GOAWAY, DATA = 0xA, 0x8, 0x3
APPLIED, REFUSED, UNKNOWN_KIND = ControlStatus
PURGE = 0x0201  # a kind of the CACHE range, as the cache branch will use it


def control_payload(kind: int, message_id: int, body: bytes = b"") -> bytes:
    """Kind(16) Message Id(32) Body, as §5.14 draws it."""
    return kind.to_bytes(2, "big") + message_id.to_bytes(4, "big") + body


def ack_payload(message_id: int, status: int, reason: bytes = b"") -> bytes:
    return control_payload(0, message_id, bytes((status,)) + reason)


def goaway_code(frames: list) -> int:
    [payload] = [f[3] for f in frames if f[0] == GOAWAY]
    return int.from_bytes(payload[4:8], "big")


def controls_in(frames: list) -> list[tuple[int, int, bytes]]:
    return [
        (int.from_bytes(f[3][:2], "big"), int.from_bytes(f[3][2:6], "big"), f[3][6:])
        for f in frames
        if f[0] == CONTROL
    ]


# -- §5.14: the numbers and the layout ------------------------------------------------


def test_control_numbers_match_the_spec() -> None:
    assert FrameType.CONTROL == 0xA
    assert [(k.name, k.value) for k in ControlKind] == [
        ("ACK", 0),
        ("ECHO", 1),
        ("ACME_CHALLENGE_SET", 0x0100),
        ("ACME_CHALLENGE_CLEAR", 0x0101),
        ("ACME_CERTIFICATE_SET", 0x0102),
        ("CACHE_PURGE", 0x0200),
    ]
    assert [(s.name, s.value) for s in ControlStatus] == [
        ("APPLIED", 0),
        ("REFUSED", 1),
        ("UNKNOWN_KIND", 2),
    ]


def test_encoders_follow_the_layout() -> None:
    body = b'{"url": "/a"}'
    assert parse_frames(codec.encode_control(PURGE, 7, body)) == [
        (CONTROL, 0, 0, bytes.fromhex("0201 00000007") + body)
    ]
    assert parse_frames(codec.encode_control_ack(7, REFUSED, "no cache")) == [
        (CONTROL, 0, 0, bytes.fromhex("0000 00000007 01") + b"no cache")
    ]


def test_an_ack_reason_is_cut_to_256_octets_between_characters() -> None:
    [(_, _, _, payload)] = parse_frames(codec.encode_control_ack(1, REFUSED, "é" * 200))
    reason = payload[7:]
    assert len(reason) == 256 and reason.decode("utf-8") == "é" * 128
    [(_, _, _, payload)] = parse_frames(codec.encode_control_ack(1, REFUSED, "a" + "é" * 200))
    assert len(payload[7:]) == 255 and payload[7:].decode("utf-8") == "a" + "é" * 127


# -- a message and its ACK --------------------------------------------------------------


@pytest.mark.parametrize("chunk", [None, 1, 5])
def test_a_message_and_its_ack_cross_a_session_pair(chunk: int | None) -> None:
    pair = SessionPair(chunk=chunk).establish()
    server, client = pair.server.session, pair.client.session
    body = b'{"tag": "product-7"}'
    message_id = server.send_control(PURGE, body)
    pair.pump()
    assert pair.client.of_type(ControlReceived) == [ControlReceived(PURGE, message_id, body)]
    client.acknowledge_control(message_id, APPLIED, "purged 3")
    pair.pump()
    assert pair.server.of_type(ControlAcknowledged) == [
        ControlAcknowledged(message_id, APPLIED, "purged 3")
    ]
    assert pair.server.of_type(ControlReceived) == []  # an ACK is not a message
    assert pair.client.terminated is None and pair.server.terminated is None


def test_both_directions_have_their_own_ids_from_one() -> None:
    pair = SessionPair().establish()
    server, client = pair.server.session, pair.client.session
    assert [server.send_control(PURGE, b"x") for _ in range(3)] == [1, 2, 3]
    assert client.send_control(ControlKind.ECHO, b"hi") == 1
    pair.pump()
    assert [e.message_id for e in pair.client.of_type(ControlReceived)] == [1, 2, 3]
    assert pair.server.of_type(ControlReceived) == [ControlReceived(ControlKind.ECHO, 1, b"hi")]
    # Answered out of order: each ACK names its message (§5.14).
    for message_id, status in ((3, UNKNOWN_KIND), (1, APPLIED), (2, REFUSED)):
        client.acknowledge_control(message_id, status, f"m{message_id}")
    server.acknowledge_control(1, APPLIED, "hi")
    pair.pump()
    assert pair.server.of_type(ControlAcknowledged) == [
        ControlAcknowledged(3, UNKNOWN_KIND, "m3"),
        ControlAcknowledged(1, APPLIED, "m1"),
        ControlAcknowledged(2, REFUSED, "m2"),
    ]
    assert pair.client.of_type(ControlAcknowledged) == [ControlAcknowledged(1, APPLIED, "hi")]


def test_control_goes_out_ahead_of_queued_data() -> None:
    pair = SessionPair().establish()
    client = pair.client.session
    stream_id = client.open_stream(StreamMetadata())
    client.send_data(stream_id, b"d" * 200_000)
    client.data_to_send(0)  # the OPEN; the data waits
    client.send_control(ControlKind.ECHO, b"first")
    frames = parse_frames(b"".join(bytes(c) for c in client.data_to_send()))
    assert frames[0][0] == CONTROL and any(f[0] == DATA for f in frames[1:])


def test_messages_flow_while_draining_after_goaway() -> None:
    pair = SessionPair().establish()
    pair.server.session.go_away(ErrorCode.NO_ERROR, "deploy")
    pair.pump()
    message_id = pair.server.session.send_control(PURGE, b"{}")
    pair.pump()
    pair.client.session.acknowledge_control(message_id, APPLIED)
    pair.pump()
    assert pair.server.of_type(ControlAcknowledged) == [ControlAcknowledged(1, APPLIED, "")]


# -- what the application may not do: a local error, nothing sent ----------------------


def test_no_message_before_the_peers_hello_or_after_the_end() -> None:
    session = Session(SessionConfig(), client=True, now=0.0)
    session.data_to_send()
    with pytest.raises(SessionClosedError):
        session.send_control(PURGE, b"")
    pair = SessionPair().establish()
    pair.client.take(pair.client.session.connection_lost("gone"), pair.now)
    with pytest.raises(SessionClosedError):
        pair.client.session.send_control(PURGE, b"")
    pair.client.session.acknowledge_control(99, APPLIED)  # after the end: a no-op
    assert pair.client.session.data_to_send() == []


def test_misuse_raises_and_sends_nothing() -> None:
    pair = SessionPair(server_config=SessionConfig(max_frame_bytes=1024)).establish()
    client = pair.client.session
    for kind in (ControlKind.ACK, -1, 0x10000):
        with pytest.raises(ControlError):
            client.send_control(kind, b"")
    with pytest.raises(ControlError):  # 6 + 1019 > the peer's 1024
        client.send_control(PURGE, bytes(1019))
    with pytest.raises(ControlError):  # nothing received to answer
        client.acknowledge_control(1, APPLIED)
    assert client.data_to_send() == []
    assert client.send_control(PURGE, bytes(1018)) == 1  # exactly MAX_FRAME_BYTES
    pair.pump()
    assert pair.server.terminated is None
    [received] = pair.server.of_type(ControlReceived)
    pair.server.session.acknowledge_control(received.message_id, APPLIED)
    with pytest.raises(ControlError):  # exactly once
        pair.server.session.acknowledge_control(received.message_id, APPLIED)


def test_message_ids_exhausted_refuse_further_messages() -> None:
    pair = SessionPair().establish()
    pair.client.session._control.last_sent_id = 2**32 - 2
    assert pair.client.session.send_control(PURGE, b"") == 2**32 - 1
    with pytest.raises(SessionClosedError):
        pair.client.session.send_control(PURGE, b"")
    pair.pump()
    assert [e.message_id for e in pair.server.of_type(ControlReceived)] == [2**32 - 1]


# -- malformed CONTROL: connection errors with their codes --------------------------


def _peer_with_one_sent() -> RawPeer:
    """A session that has sent message 1 to the hand-made peer."""
    peer = RawPeer(SessionConfig(max_frame_bytes=1024, max_metadata_bytes=4096))
    peer.read()
    assert peer.session.send_control(PURGE, b"{}") == 1
    assert controls_in(peer.read()) == [(PURGE, 1, b"{}")]
    return peer


@pytest.mark.parametrize(
    ("stream_id", "payload", "code"),
    [
        (3, control_payload(PURGE, 1), ErrorCode.PROTOCOL_ERROR),
        (0, b"", ErrorCode.FRAME_SIZE_ERROR),
        (0, bytes.fromhex("0201 000000"), ErrorCode.FRAME_SIZE_ERROR),  # 5 octets
        (0, control_payload(PURGE, 1, bytes(1019)), ErrorCode.FRAME_SIZE_ERROR),  # > 1024
        (0, control_payload(PURGE, 0), ErrorCode.PROTOCOL_ERROR),  # id 0
        (0, control_payload(0, 1), ErrorCode.FRAME_SIZE_ERROR),  # ACK without its status
        (0, ack_payload(1, 3), ErrorCode.PROTOCOL_ERROR),  # no such status
        (0, ack_payload(1, 0xFF, b"x"), ErrorCode.PROTOCOL_ERROR),
        (0, ack_payload(1, 1, b"r" * 257), ErrorCode.FRAME_SIZE_ERROR),  # reason too long
        (0, ack_payload(0, 0), ErrorCode.PROTOCOL_ERROR),  # names id 0
        (0, ack_payload(2, 0), ErrorCode.PROTOCOL_ERROR),  # names a message never sent
    ],
)
def test_malformed_control_is_a_connection_error(stream_id: int, payload: bytes, code: int) -> None:
    peer = _peer_with_one_sent()
    peer.send(CONTROL, 0, stream_id, payload)
    terminated = peer.terminated
    assert terminated is not None and terminated.error_code == code and not terminated.remote
    assert goaway_code(peer.read()) == code


@pytest.mark.parametrize("chunk", [None, 1])
def test_message_ids_must_increase(chunk: int | None) -> None:
    peer = RawPeer()
    peer.feed(raw_frame(CONTROL, 0, 0, control_payload(PURGE, 5)), chunk)
    peer.feed(raw_frame(CONTROL, 0, 0, control_payload(PURGE, 9)), chunk)  # gaps are fine
    assert peer.terminated is None
    peer.feed(raw_frame(CONTROL, 0, 0, control_payload(PURGE, 9)), chunk)
    assert peer.terminated is not None and peer.terminated.error_code == ErrorCode.PROTOCOL_ERROR
    assert [e.message_id for e in peer.of_type(ControlReceived)] == [5, 9]


def test_control_before_hello_is_a_protocol_error() -> None:
    peer = RawPeer(hello=False)
    peer.feed(b"GEOEDGE\n" + raw_frame(CONTROL, 0, 0, control_payload(PURGE, 1)))
    assert peer.terminated is not None and peer.terminated.error_code == ErrorCode.PROTOCOL_ERROR


def test_edge_cases_an_ack_may_carry() -> None:
    """A 256-octet reason is the most allowed; a reason that is not UTF-8 is
    replaced, not rejected (it is only for logs); undefined flags are ignored."""
    peer = _peer_with_one_sent()
    assert peer.session.send_control(PURGE, b"") == 2
    peer.send(CONTROL, 0xFF, 0, ack_payload(1, REFUSED, b"r" * 256))
    peer.send(CONTROL, 0, 0, ack_payload(2, APPLIED, b"\xff\xfeok"))
    assert peer.terminated is None
    assert peer.of_type(ControlAcknowledged) == [
        ControlAcknowledged(1, REFUSED, "r" * 256),
        ControlAcknowledged(2, APPLIED, "\ufffd\ufffdok"),
    ]


def test_a_second_or_late_ack_is_ignored_and_costs_a_point() -> None:
    peer = _peer_with_one_sent()
    peer.send(CONTROL, 0, 0, ack_payload(1, APPLIED))
    left = peer.session.statistics().error_budget_left
    peer.send(CONTROL, 0, 0, ack_payload(1, REFUSED))
    assert peer.of_type(ControlAcknowledged) == [ControlAcknowledged(1, APPLIED, "")]
    assert peer.session.statistics().error_budget_left == left - 1
    assert peer.terminated is None


# -- bounds: the free rate, unanswered and outstanding messages --------------------------


def _flood(peer: RawPeer, first_id: int, count: int) -> None:
    """``count`` messages at one instant, each answered as it arrives (so
    only the rate is being tested)."""
    for message_id in range(first_id, first_id + count):
        for event in peer.send(CONTROL, 0, 0, control_payload(PURGE, message_id)):
            if isinstance(event, ControlReceived):
                peer.session.acknowledge_control(event.message_id, APPLIED)
        if peer.terminated:
            return


def test_a_burst_within_the_free_allowance_costs_nothing() -> None:
    peer = RawPeer()
    before = peer.session.statistics().error_budget_left
    _flood(peer, 1, FREE_CONTROL_PER_S)
    assert len(peer.of_type(ControlReceived)) == FREE_CONTROL_PER_S
    assert peer.session.statistics().error_budget_left == before


def test_messages_beyond_the_allowance_spend_the_budget_until_calm() -> None:
    peer = RawPeer(SessionConfig(error_budget=50, error_budget_refill_per_s=0.001))
    _flood(peer, 1, FREE_CONTROL_PER_S + 50)
    assert peer.terminated is None
    assert peer.session.statistics().error_budget_left == pytest.approx(0, abs=0.01)
    _flood(peer, FREE_CONTROL_PER_S + 51, 1)
    assert peer.terminated is not None
    assert peer.terminated.error_code == ErrorCode.ENHANCE_YOUR_CALM
    assert goaway_code(peer.read()) == ErrorCode.ENHANCE_YOUR_CALM


def test_a_steady_rate_at_the_allowance_is_free_for_ever() -> None:
    peer = RawPeer(SessionConfig(error_budget=5, error_budget_refill_per_s=0.001))
    before = peer.session.statistics().error_budget_left
    for i in range(1, 3001):  # 30 s of 100 a second, ACKed by the session each time
        peer.now += 1 / FREE_CONTROL_PER_S
        _flood(peer, i, 1)
    assert peer.terminated is None
    assert peer.session.statistics().error_budget_left == pytest.approx(before, abs=0.1)


def test_unanswered_messages_past_the_bound_are_refused_by_the_session() -> None:
    peer = RawPeer(SessionConfig(error_budget=1e9))
    peer.read()
    for message_id in range(1, MAX_UNANSWERED + 3):
        peer.send(CONTROL, 0, 0, control_payload(PURGE, message_id, b"{}"))
    assert len(peer.of_type(ControlReceived)) == MAX_UNANSWERED
    busy = bytes((REFUSED,)) + BUSY_REASON.encode()
    assert controls_in(peer.read()) == [
        (ControlKind.ACK, MAX_UNANSWERED + 1, busy),
        (ControlKind.ACK, MAX_UNANSWERED + 2, busy),
    ]
    peer.session.acknowledge_control(1, APPLIED)  # one answered: room for one more
    peer.send(CONTROL, 0, 0, control_payload(PURGE, MAX_UNANSWERED + 3))
    assert peer.of_type(ControlReceived)[-1].message_id == MAX_UNANSWERED + 3
    assert peer.terminated is None


def test_unanswered_bodies_are_bounded_in_octets_too() -> None:
    big = 1024 * 1024
    peer = RawPeer(SessionConfig(max_frame_bytes=big, error_budget=1e9))
    peer.read()
    body = bytes(big - 6)
    fits = MAX_UNANSWERED_BYTES // len(body)
    for message_id in range(1, fits + 2):
        peer.send(CONTROL, 0, 0, control_payload(PURGE, message_id, body))
    assert len(peer.of_type(ControlReceived)) == fits
    [(kind, message_id, ack)] = controls_in(peer.read())
    assert (kind, message_id, ack[0]) == (ControlKind.ACK, fits + 1, REFUSED)


def test_outstanding_messages_are_bounded_the_oldest_forgotten() -> None:
    """An older peer never answers: the sender keeps a bounded record."""
    peer = RawPeer()
    for _ in range(MAX_OUTSTANDING + 1):
        peer.session.send_control(PURGE, b"")
    assert len(peer.session._control.outstanding) == MAX_OUTSTANDING
    peer.send(CONTROL, 0, 0, ack_payload(1, APPLIED))  # forgotten: ignored
    peer.send(CONTROL, 0, 0, ack_payload(MAX_OUTSTANDING + 1, APPLIED))
    assert peer.of_type(ControlAcknowledged) == [
        ControlAcknowledged(MAX_OUTSTANDING + 1, APPLIED, "")
    ]
    assert peer.terminated is None
