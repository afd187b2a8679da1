"""Properties of the multiplexer (STYLE.md §12), checked by hypothesis:

- random interleavings of opens, sends, ends, resets and acknowledgements on
  both sides, and of CONTROL messages and their answers (PROTOCOL.md §5.14),
  with the byte stream split anywhere (byte at a time too): every byte arrives
  intact and in order on its stream, END_STREAM is seen exactly once, every
  CONTROL message arrives once, in order, and its answer comes back once, no
  receive window is ever exceeded and the connection never fails;
- a slow reader keeps what is in flight within its window;
- the frame reader frames the same whatever the split points;
- the stream state table agrees with a two-flag model for every input sequence.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.example_budget import examples
from tests.mux_pair import SessionPair, Side
from tunnel.mux import (
    ControlAcknowledged,
    ControlKind,
    ControlReceived,
    ControlStatus,
    ErrorCode,
    SessionConfig,
    StreamClosedError,
    StreamMetadata,
)
from tunnel.mux.errors import MetadataError
from tunnel.mux.metadata import encode_request_fields
from tunnel.mux.reader import FrameReader
from tunnel.mux.stream import TRANSITIONS, Stream, StreamInput, StreamState
from tunnel.mux.window import ReceiveWindow

#: Small windows and frames, so that a few kilobytes exercise every limit:
#: stream windows, a connection window below their sum, frame splitting.
SMALL = SessionConfig(
    max_frame_bytes=1024,
    initial_stream_window_bytes=2048,
    min_stream_window_bytes=1024,
    max_stream_window_bytes=8192,
    initial_connection_window_bytes=5000,
    max_connection_window_bytes=65536,
    max_metadata_bytes=64,
    ping_interval_s=0.5,
    ping_timeout_s=1e6,
    stall_timeout_s=1e6,
)
PROPS = settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

sides = st.sampled_from(["client", "server"])
chunks = st.one_of(st.none(), st.sampled_from([1, 2, 3, 7, 10, 11, 64, 1000]))
#: Sizes around the frame (1024) and window (2048, 5000) boundaries, and beyond.
sizes = st.one_of(st.integers(0, 3000), st.sampled_from([1023, 1024, 1025, 2048, 5000, 9000]))
opens = st.tuples(st.just("open"), sides, st.booleans())
sends = st.tuples(st.just("send"), sides, st.integers(0, 15), sizes)
ops = st.one_of(
    opens,
    sends,
    sends,
    st.tuples(st.just("end"), sides, st.integers(0, 15)),
    st.tuples(st.just("reset"), sides, st.integers(0, 15)),
    st.tuples(st.just("ack"), sides, st.integers(0, 15), st.integers(1, 5000)),
    st.tuples(st.just("deliver"), sides, chunks),
    st.tuples(st.just("deliver"), sides, chunks),
    st.tuples(st.just("advance"), st.sampled_from([0.001, 0.01, 0.1, 0.3])),
    st.tuples(
        st.just("control"),
        sides,
        st.sampled_from([ControlKind.ECHO, 0x0100, 0x0201, 0xFFFF]),
        st.integers(0, 300),
    ),
    st.tuples(st.just("answer"), sides, st.integers(0, 15), st.sampled_from(list(ControlStatus))),
)


def payload(stream_id: int, offset: int, n: int) -> bytes:
    """Bytes that differ by stream and position, so a misordering shows."""
    return random.Random(stream_id * 1_000_003 + offset).randbytes(n)


@dataclass
class Model:
    """What each side did, to compare with what the other side saw."""

    streams: list[int] = field(default_factory=list)
    sent: dict[str, dict[int, bytearray]] = field(
        default_factory=lambda: {"client": defaultdict(bytearray), "server": defaultdict(bytearray)}
    )
    ended: dict[str, set[int]] = field(default_factory=lambda: {"client": set(), "server": set()})
    reset_by: dict[str, set[int]] = field(
        default_factory=lambda: {"client": set(), "server": set()}
    )
    acked: dict[str, dict[int, int]] = field(
        default_factory=lambda: {"client": defaultdict(int), "server": defaultdict(int)}
    )
    control_sent: dict[str, list[ControlReceived]] = field(
        default_factory=lambda: {"client": [], "server": []}
    )
    answered: dict[str, dict[int, ControlAcknowledged]] = field(
        default_factory=lambda: {"client": {}, "server": {}}
    )


def _side(pair: SessionPair, name: str) -> Side:
    return pair.client if name == "client" else pair.server


def _knows(pair: SessionPair, name: str, sid: int) -> bool:
    opener = "client" if sid % 2 else "server"
    return name == opener or sid in _side(pair, name).opened


def _check(pair: SessionPair) -> None:
    pair.check_windows()
    for side in (pair.client, pair.server):
        assert side.terminated is None, side.terminated
        assert all(n == 1 for n in side.end_count.values()), side.end_count


def _apply(pair: SessionPair, model: Model, op: tuple) -> None:
    kind = op[0]
    if kind == "open":
        side = _side(pair, op[1])
        sid = side.session.open_stream(
            StreamMetadata(request_id=str(len(model.streams))), end_stream=op[2]
        )
        model.streams.append(sid)
        if op[2]:
            model.ended[op[1]].add(sid)
        return
    if kind == "deliver":
        src, dst = (pair.client, pair.server) if op[1] == "client" else (pair.server, pair.client)
        pair.chunk = op[2]
        pair._deliver(src, dst, "c2s" if op[1] == "client" else "s2c")
        _check(pair)
        return
    if kind == "advance":
        pair.advance(op[1])
        _check(pair)
        return
    if kind == "control":
        body = payload(op[2], op[3], op[3])
        message_id = _side(pair, op[1]).session.send_control(op[2], body)
        model.control_sent[op[1]].append(ControlReceived(op[2], message_id, body))
        return
    if kind == "answer":
        _answer(pair, model, op[1], op[2], op[3])
        return
    if not model.streams:
        return
    name, sid = op[1], model.streams[op[2] % len(model.streams)]
    if not _knows(pair, name, sid):
        return
    side = _side(pair, name)
    gone = sid in model.reset_by[name] or sid in side.resets
    if kind in ("send", "end"):
        sendable = not gone and sid not in model.ended[name]
        data = payload(sid, len(model.sent[name][sid]), op[3]) if kind == "send" else b""
        try:
            side.session.send_data(sid, data, end_stream=kind == "end")
        except StreamClosedError:
            assert not sendable or (kind == "send" and not data), (kind, sid)
            return
        assert sendable or (kind == "send" and not data), (kind, sid)
        model.sent[name][sid] += data
        if kind == "end":
            model.ended[name].add(sid)
    elif kind == "reset":
        if sid in side.session._streams:
            model.reset_by[name].add(sid)
        side.session.reset_stream(sid, ErrorCode.CANCEL)
    elif kind == "ack":
        unacked = len(side.received[sid]) - model.acked[name][sid]
        n = min(op[3], unacked)
        if n > 0:
            side.session.acknowledge_received_data(sid, n, pair.now)
            model.acked[name][sid] += n


def _answer(pair: SessionPair, model: Model, name: str, pick: int, status: ControlStatus) -> None:
    """``name`` answers one of the CONTROL messages it received and has not answered."""
    side = _side(pair, name)
    waiting = [e for e in side.of_type(ControlReceived) if e.message_id not in model.answered[name]]
    if not waiting:
        return
    message_id = waiting[pick % len(waiting)].message_id
    reason = f"answer {message_id}" * (message_id % 3)
    side.session.acknowledge_control(message_id, status, reason)
    model.answered[name][message_id] = ControlAcknowledged(message_id, status, reason)


def _settle(pair: SessionPair, model: Model) -> None:
    """Answer and read everything still unanswered and unread, then let the
    pair run dry."""
    pair.chunk = None
    pair.pump()
    for name in ("client", "server"):
        for _ in range(len(_side(pair, name).of_type(ControlReceived))):
            _answer(pair, model, name, 0, ControlStatus.APPLIED)
    for name in ("client", "server"):
        side = _side(pair, name)
        for sid, data in list(side.received.items()):
            unacked = len(data) - model.acked[name][sid]
            if unacked:
                side.session.acknowledge_received_data(sid, unacked, pair.now)
        side.auto_ack = True
    pair.pump()
    _check(pair)


#: A few streams first, so that most operations have a stream to act on.
scripts = st.builds(
    lambda first, rest: first + rest,
    st.lists(opens, min_size=1, max_size=4),
    st.lists(ops, min_size=20, max_size=100),
)


@PROPS
@given(scripts)
def test_every_byte_arrives_in_order_and_windows_hold(script: list[tuple]) -> None:
    pair = SessionPair(SMALL, SMALL).establish()
    pair.client.auto_ack = pair.server.auto_ack = False
    model = Model()
    for op in script:
        _apply(pair, model, op)
    _settle(pair, model)
    for sid in model.streams:
        sender = "client" if sid % 2 else "server"
        for name, receiver in (("client", pair.server), ("server", pair.client)):
            sent = bytes(model.sent[name][sid])
            got = bytes(receiver.received.get(sid, b""))
            reset = (
                sid in model.reset_by["client"]
                or sid in model.reset_by["server"]
                or sid in pair.client.resets
                or sid in pair.server.resets
            )
            if reset:
                assert sent.startswith(got), f"stream {sid} from {name}: not a prefix"
                assert receiver.end_count[sid] <= 1
            else:
                assert got == sent, f"stream {sid} from {name}: {len(got)} of {len(sent)}"
                assert receiver.end_count[sid] == (1 if sid in model.ended[name] else 0)
        opener_peer = pair.server if sender == "client" else pair.client
        assert sid in opener_peer.opened or sid in model.reset_by[sender]
    for side in (pair.client, pair.server):
        assert set(side.resets.values()) <= {ErrorCode.CANCEL}
    for sender, receiver in (("client", "server"), ("server", "client")):
        assert _side(pair, receiver).of_type(ControlReceived) == model.control_sent[sender]
        acknowledged = _side(pair, sender).of_type(ControlAcknowledged)
        assert len(acknowledged) == len(model.control_sent[sender])  # one each
        assert {a.message_id: a for a in acknowledged} == model.answered[receiver]


@PROPS
@given(
    sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=12),
    acks=st.lists(st.integers(1, 4000), max_size=12),
    chunk=chunks,
)
def test_a_slow_reader_bounds_what_is_in_flight(
    sizes: list[int], acks: list[int], chunk: int | None
) -> None:
    pair = SessionPair(SMALL, SMALL, chunk=chunk).establish()
    pair.client.auto_ack = False
    client, server = pair.client.session, pair.server.session
    sid = client.open_stream(StreamMetadata())
    pair.pump()
    window = client._streams[sid].recv_window.size
    sent = bytearray()
    for size in sizes:
        chunk_bytes = payload(sid, len(sent), size)
        server.send_data(sid, chunk_bytes)
        sent += chunk_bytes
    total = len(sent)
    acked = 0
    for n in [0, *acks]:
        n = min(n, len(pair.client.received[sid]) - acked)
        if n:
            client.acknowledge_received_data(sid, n, pair.now)
            acked += n
        pair.pump()
        pair.check_windows()
        received = len(pair.client.received[sid])
        in_flight = (total - server.send_buffered(sid)) - acked
        assert received - acked <= window
        assert in_flight == received - acked  # nothing lost, nothing duplicated
        assert client._streams[sid].recv_window.size == window  # no RTT, no tuning
    received = bytes(pair.client.received[sid])
    assert sent.startswith(received) and len(received) >= min(total, window)


def _transcript() -> bytes:
    """What a client writes during a busy little session."""
    pair = SessionPair(SMALL, SMALL)
    pair.establish()
    for i in range(3):
        sid = pair.client.session.open_stream(StreamMetadata(host=f"h{i}"))
        pair.client.session.send_data(sid, payload(sid, 0, 1500 * (i + 1)), end_stream=i == 1)
    pair.client.session.ping(pair.now)
    pair.client.session.send_control(ControlKind.ECHO, b"hello")
    pair.client.session.reset_stream(5)
    pair.client.session.send_control(0x0201, b'{"tag": "t"}')
    pair.pump()
    return bytes(pair.client.sent)


TRANSCRIPT = _transcript()


@PROPS
@given(st.lists(st.integers(1, 300), max_size=200))
def test_the_reader_frames_the_same_whatever_the_split(cuts: list[int]) -> None:
    whole = FrameReader(4096).feed(TRANSCRIPT)
    reader = FrameReader(4096)
    frames, pos = [], 0
    for cut in [*cuts, len(TRANSCRIPT)]:
        frames += reader.feed(TRANSCRIPT[pos : pos + cut])
        pos += cut
        assert reader.buffered <= 10 + 4096
        if pos >= len(TRANSCRIPT):
            break
    assert frames == whole
    assert len(whole) > 10


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.sampled_from(list(StreamInput)), max_size=8))
def test_the_state_table_matches_a_two_flag_model(inputs: list[StreamInput]) -> None:
    """OPEN/HALF_CLOSED/CLOSED is (local ended, remote ended); DATA is allowed
    while the sending side has not ended, END once per side."""
    stream = Stream(1, local=True, send_window=0, recv_window=ReceiveWindow(1, 1, 0.0))
    local_ended = remote_ended = False
    for event in inputs:
        local = event in (StreamInput.SEND_DATA, StreamInput.SEND_END)
        ended = local_ended if local else remote_ended
        allowed = not ended
        assert stream.transition(event) == allowed
        if allowed and event in (StreamInput.SEND_END, StreamInput.RECV_END):
            if local:
                local_ended = True
            else:
                remote_ended = True
        expected = {
            (False, False): StreamState.OPEN,
            (True, False): StreamState.HALF_CLOSED_LOCAL,
            (False, True): StreamState.HALF_CLOSED_REMOTE,
            (True, True): StreamState.CLOSED,
        }[(local_ended, remote_ended)]
        assert stream.state is expected
        assert stream.end_queued == local_ended and stream.peer_ended == remote_ended
    assert len(TRANSITIONS) == 8


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_ADDRESSES = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["192.0.2.1", "198.51.100.7", "2001:db8::1"]), st.integers(0, 65535)),
)
_METADATA = st.builds(
    StreamMetadata,
    client_address=_ADDRESSES,
    server_address=_ADDRESSES,
    server_name=st.none() | _TEXT,
    tls_version=st.none() | _TEXT,
    edge_id=st.none() | _TEXT,
    host=st.none() | _TEXT,
    request_id=st.none() | _TEXT,
    tls_resumed=st.none() | st.booleans(),
    method=st.none() | _TEXT,
    target=st.none() | _TEXT,
    long_poll=st.none() | st.booleans(),
    extra=st.dictionaries(st.integers(0x20, 0xFF), st.binary(max_size=6), max_size=3),
)


def _items(encoded: bytes) -> list[bytes]:
    items, pos = [], 0
    while pos < len(encoded):
        length = int.from_bytes(encoded[pos + 1 : pos + 3], "big")
        items.append(encoded[pos : pos + 3 + length])
        pos += 3 + length
    return items


@settings(max_examples=examples(200), deadline=None)
@given(meta=_METADATA, seed=st.integers(0, 2**32 - 1), twice=st.booleans())
def test_metadata_decodes_the_same_in_any_order(
    meta: StreamMetadata, seed: int, twice: bool
) -> None:
    """Items may come in any order (PROTOCOL.md §6.2); the origin decodes the
    part from the first connection item once per distinct octets, and that
    must change nothing, nor let a repeated key through."""
    items = _items(meta.encode())
    random.Random(seed).shuffle(items)
    wire = b"".join(items)
    assert StreamMetadata.decode(wire) == meta
    assert StreamMetadata.decode(wire) == meta  # the memo's answer, if it kept one
    if twice and items:
        repeated = b"".join([*items, items[0]])
        with pytest.raises(MetadataError):
            StreamMetadata.decode(repeated)


_LONG_TEXT = st.none() | _TEXT | st.builds(lambda n: "x" * n, st.integers(65530, 65540))


@settings(max_examples=examples(200), deadline=None)
@given(
    host=_LONG_TEXT,
    request_id=_LONG_TEXT,
    method=st.none() | _TEXT,
    target=_LONG_TEXT,
    long_poll=st.booleans(),
)
def test_the_request_fields_encode_as_the_metadata_does(
    host: str | None,
    request_id: str | None,
    method: str | None,
    target: str | None,
    long_poll: bool,
) -> None:
    """``encode_request_fields`` (the edge's per-request items, written out by
    hand) makes the octets ``StreamMetadata.encode`` makes of the same fields,
    and refuses what it refuses."""
    meta = StreamMetadata(
        host=host, request_id=request_id, method=method, target=target,
        long_poll=True if long_poll else None,
    )  # fmt: skip
    try:
        expected = meta.encode()
    except MetadataError:
        with pytest.raises(MetadataError):
            encode_request_fields(host, request_id, method, target, long_poll=long_poll)
        return
    assert encode_request_fields(host, request_id, method, target, long_poll=long_poll) == expected
