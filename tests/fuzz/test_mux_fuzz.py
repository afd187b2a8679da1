"""Fuzzing the receive path (as h11's fuzz harness says in its first line: the
only way out of ``receive_data`` is an event).

Whatever bytes arrive, a session returns events, ending at worst with a
:class:`ConnectionTerminated` that carries a protocol error code; no other
exception escapes, and its memory stays bounded: the reader holds at most one
header and one maximal payload, the queue of replies at most
``max_pending_control_frames`` (plus the GOAWAY), the streams at most
``max_concurrent_streams``, the CONTROL messages unanswered and outstanding at
most their bounds (PROTOCOL.md §5.14). Inputs: random bytes with and without a valid
preface and HELLO, random frame sequences, and mutations of a real session's
bytes. Bounded by example count, never by time (tests.example_budget).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.example_budget import examples
from tests.mux_pair import PREFACE, SessionPair, raw_frame, raw_hello
from tunnel.mux import (
    ConnectionTerminated,
    ControlAcknowledged,
    ControlKind,
    ControlReceived,
    DataReceived,
    ErrorCode,
    GoAwayReceived,
    PingAcknowledged,
    Session,
    SessionConfig,
    SessionEstablished,
    StreamEnded,
    StreamMetadata,
    StreamOpened,
    StreamReset,
)
from tunnel.mux.constants import HEADER_SIZE
from tunnel.mux.control import MAX_OUTSTANDING, MAX_UNANSWERED, MAX_UNANSWERED_BYTES
from tunnel.mux.errors import MetadataError

CONFIG = SessionConfig(
    max_frame_bytes=2048,
    max_metadata_bytes=256,
    max_concurrent_streams=4,
    initial_stream_window_bytes=4096,
    min_stream_window_bytes=1024,
    initial_connection_window_bytes=8192,
    max_pending_control_frames=32,
    error_budget=200,
)
#: Codes a session may close with on its own after bad input (PROTOCOL.md §9).
PROTOCOL_CODES = {
    ErrorCode.PROTOCOL_ERROR,
    ErrorCode.FRAME_SIZE_ERROR,
    ErrorCode.FLOW_CONTROL_ERROR,
    ErrorCode.VERSION_MISMATCH,
    ErrorCode.ENHANCE_YOUR_CALM,
}
EVENT_TYPES = (
    SessionEstablished,
    StreamOpened,
    DataReceived,
    StreamEnded,
    StreamReset,
    PingAcknowledged,
    GoAwayReceived,
    ControlReceived,
    ControlAcknowledged,
    ConnectionTerminated,
)
FUZZ = settings(
    max_examples=examples(400),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def assert_bounded(session: Session) -> None:
    reader = session._reader
    assert reader.buffered <= reader.max_payload + HEADER_SIZE
    assert reader.max_payload == max(CONFIG.max_frame_bytes, 4 + CONFIG.max_metadata_bytes)
    assert len(session._out.control) <= CONFIG.max_pending_control_frames + 4  # + GOAWAY, HELLO..
    assert session._table.peer_open <= CONFIG.max_concurrent_streams
    control = session._control
    assert len(control.unanswered) <= MAX_UNANSWERED
    assert control.unanswered_bytes <= MAX_UNANSWERED_BYTES
    assert len(control.outstanding) <= MAX_OUTSTANDING


def feed(data: bytes, cuts: list[int], *, client: bool = False, drain_every: int = 3) -> list:
    """Feed ``data`` to a fresh session in pieces of the given sizes (cycling);
    every few pieces the adapter would write out, and the clock moves."""
    now = 1000.0
    session = Session(CONFIG, client=client, now=now)
    session.data_to_send()
    events: list = []
    pos, i = 0, 0
    sizes = cuts or [len(data) or 1]
    sent_controls = False
    while pos < len(data):
        size = max(1, sizes[i % len(sizes)])
        events += session.receive_data(data[pos : pos + size], now)
        pos += size
        i += 1
        assert_bounded(session)
        if session.established and not session.terminated and not sent_controls:
            # Messages 1-3 of ours, so that ACKs the input carries can be valid.
            for _ in range(3):
                session.send_control(ControlKind.ECHO, b"x")
            sent_controls = True
        if i % drain_every == 0:
            session.data_to_send()
            now += 0.01
            events += session.handle_timer(now)
        if session.terminated:
            break
    check_events(events, session)
    return events


def check_events(events: list, session: Session) -> None:
    assert all(isinstance(e, EVENT_TYPES) for e in events), events
    ends = [e for e in events if isinstance(e, ConnectionTerminated)]
    assert len(ends) <= 1 and (not ends or events[-1] is ends[0])
    assert session.terminated == bool(ends)
    if ends and not ends[0].remote:
        assert ends[0].error_code in PROTOCOL_CODES, ends[0]
    if ends and ends[0].remote:  # the peer's own GOAWAY with an error, just before
        assert any(isinstance(e, GoAwayReceived) for e in events)
    if session.terminated:
        assert session.receive_data(b"more", 2000.0) == []
    acknowledged = [e.message_id for e in events if isinstance(e, ControlAcknowledged)]
    assert len(set(acknowledged)) == len(acknowledged) and set(acknowledged) <= {1, 2, 3}


HELLO = raw_hello()


def _transcript() -> bytes:
    """What a real client writes in a busy little session: the seed for mutations."""
    pair = SessionPair(CONFIG, CONFIG)
    pair.establish()
    client = pair.client.session
    for i in range(3):
        sid = client.open_stream(StreamMetadata(client_address=("::1", i), host=f"h{i}"))
        client.send_data(sid, bytes([i]) * 3000, end_stream=i != 1)
    client.ping(pair.now)
    client.send_control(ControlKind.ECHO, b"are you there")
    client.reset_stream(3, ErrorCode.CANCEL)
    client.send_control(0x0201, b'{"prefix": "/img/"}')
    pair.pump()
    client.go_away(ErrorCode.NO_ERROR, "bye")
    pair.pump()
    return bytes(pair.client.sent)


TRANSCRIPT = _transcript()


def test_the_seed_transcript_is_valid() -> None:
    events = feed(TRANSCRIPT, [])
    assert not any(isinstance(e, ConnectionTerminated) for e in events)
    assert sum(isinstance(e, StreamOpened) for e in events) == 3
    assert [e.kind for e in events if isinstance(e, ControlReceived)] == [ControlKind.ECHO, 0x0201]


# -- random bytes --------------------------------------------------------------------


cuts = st.lists(st.integers(1, 64), max_size=8)


@FUZZ
@given(st.binary(max_size=400), cuts)
def test_random_bytes_without_a_preface(data: bytes, pieces: list[int]) -> None:
    events = feed(data, pieces)
    if data and not PREFACE.startswith(data[:8]):
        assert events[-1].error_code == ErrorCode.PROTOCOL_ERROR


@FUZZ
@given(st.binary(max_size=600), cuts, st.booleans())
def test_random_bytes_after_a_valid_hello(data: bytes, pieces: list[int], client: bool) -> None:
    feed(HELLO + data, pieces, client=client)


# -- random frames -------------------------------------------------------------------

frame_types = st.one_of(st.integers(0, 10), st.integers(0, 255))
stream_ids = st.one_of(st.integers(0, 12), st.sampled_from([2**31, 2**32 - 1]))


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    frame_type = draw(frame_types)
    flags = draw(st.sampled_from([0, 1, 0xFF]))
    stream_id = draw(stream_ids)
    if frame_type in (4, 5):  # WINDOW_UPDATE, RESET: mostly well-formed
        payload = draw(
            st.one_of(
                st.integers(0, 2**32 - 1).map(lambda n: n.to_bytes(4, "big")), st.binary(max_size=6)
            )
        )
    elif frame_type == 2:  # OPEN: a window and some metadata
        payload = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big") + draw(st.binary(max_size=40))
    elif frame_type in (6, 7):
        payload = draw(st.binary(min_size=8, max_size=8))
    elif frame_type == 10:  # CONTROL: mostly a kind, a small id and a body
        kind = draw(st.sampled_from([0, 0, 1, 0x0201, 0xFFFF]))
        message_id = draw(st.one_of(st.integers(0, 6), st.integers(0, 2**32 - 1)))
        status = bytes([draw(st.integers(0, 4))]) if kind == 0 else b""
        payload = draw(
            st.one_of(
                st.builds(
                    lambda body: (
                        kind.to_bytes(2, "big") + message_id.to_bytes(4, "big") + status + body
                    ),
                    st.binary(max_size=40),
                ),
                st.binary(max_size=8),
            )
        )
    elif frame_type == 3:
        payload = draw(
            st.one_of(st.binary(max_size=64), st.sampled_from([b"x" * 2048, b"y" * 2049]))
        )
    else:
        payload = draw(st.binary(max_size=30))
    return raw_frame(frame_type, flags, stream_id, payload)


@FUZZ
@given(st.lists(frames(), max_size=40), cuts, st.booleans())
def test_random_frame_sequences(sequence: list[bytes], pieces: list[int], client: bool) -> None:
    feed(HELLO + b"".join(sequence), pieces, client=client)


@FUZZ
@given(st.lists(frames(), max_size=20), st.booleans())
def test_random_frames_before_hello(sequence: list[bytes], client: bool) -> None:
    events = feed(PREFACE + b"".join(sequence), [], client=client)
    if sequence and sequence[0][0] != 0:
        oversize = int.from_bytes(sequence[0][6:10], "big") > 2048  # caught from the header
        code = ErrorCode.FRAME_SIZE_ERROR if oversize else ErrorCode.PROTOCOL_ERROR
        assert events[-1].error_code == code


# -- mutations of a real session's bytes ---------------------------------------------


def mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        kind = rng.randrange(6)
        pos = rng.randrange(len(buf)) if buf else 0
        if kind == 0 and buf:
            buf[pos] ^= 1 << rng.randrange(8)
        elif kind == 1 and buf:
            buf[pos] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif kind == 2:
            del buf[pos : pos + rng.randint(1, 16)]
        elif kind == 3:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif kind == 4 and buf:
            end = min(len(buf), pos + rng.randint(1, 64))
            buf[end:end] = buf[pos:end]  # a duplicated segment
        else:
            del buf[pos:]
    return bytes(buf)


@FUZZ
@given(st.integers(0, 2**32 - 1), cuts)
def test_mutated_sessions(seed: int, pieces: list[int]) -> None:
    feed(mutate(TRANSCRIPT, random.Random(seed)), pieces)


MUTATIONS = examples(20_000)


def test_many_mutated_sessions() -> None:
    """More volume than hypothesis gives, bounded by a count (never by time); the
    seed of a failure is in the assertion message."""
    rng = random.Random(20261122)
    done = 0
    while done < MUTATIONS:
        seed = rng.randrange(2**32)
        local = random.Random(seed)
        data = mutate(TRANSCRIPT, local)
        pieces = [local.randint(1, 300) for _ in range(local.randint(0, 4))]
        try:
            feed(data, pieces, client=bool(seed & 1))
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc
        done += 1
    assert done == MUTATIONS


# -- the split does not matter ---------------------------------------------------------


def events_of(data: bytes, size: int | list[int]) -> list:
    session = Session(CONFIG, client=False, now=0.0)
    sizes = [size] if isinstance(size, int) else size or [len(data) or 1]
    events: list = []
    pos = i = 0
    while pos < len(data):
        step = max(1, sizes[i % len(sizes)])
        events += session.receive_data(data[pos : pos + step], 0.0)
        pos, i = pos + step, i + 1
    return events


@FUZZ
@given(
    st.one_of(
        st.lists(frames(), max_size=25).map(lambda fs: HELLO + b"".join(fs)),
        st.integers(0, 2**32 - 1).map(lambda seed: mutate(TRANSCRIPT, random.Random(seed))),
    ),
    cuts,
)
def test_the_outcome_does_not_depend_on_how_the_bytes_are_split(data: bytes, pieces: list) -> None:
    """Frames are processed in order and the first error wins, so the events (and
    the error code) are the same whether the bytes come whole, in random pieces
    or one at a time."""
    whole = events_of(data, len(data) or 1)
    assert events_of(data, pieces) == whole
    assert events_of(data, 1) == whole


# -- metadata --------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=200))
def test_metadata_decoding_never_raises_anything_else(data: bytes) -> None:
    try:
        meta = StreamMetadata.decode(data)
    except MetadataError:
        return
    assert StreamMetadata.decode(meta.encode()) == meta
