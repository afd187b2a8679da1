"""Framing (PROTOCOL.md §2-§5): every frame type encoded and decoded, the
preface, HELLO and version negotiation, sizes, and the metadata codec (§6.2).

Frames are built by hand with ``tests.mux_pair.raw_frame`` and what a session
writes is read back with ``parse_frames``, both written from the spec rather
than from ``tunnel.mux.frames``.
"""

from __future__ import annotations

import pytest

from tests.mux_pair import (
    PREFACE,
    RawPeer,
    SessionPair,
    parse_frames,
    raw_frame,
    raw_hello,
    raw_settings_payload,
)
from tunnel.mux import (
    ConnectionTerminated,
    DataReceived,
    ErrorCode,
    FrameType,
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
from tunnel.mux import frames as codec
from tunnel.mux.constants import (
    HEADER_SIZE,
    MAX_FRAME_BYTES_LIMIT,
    MAX_VERSION,
    MIN_FRAME_BYTES,
    SETTING_DEFAULTS,
    Flag,
    SettingId,
)
from tunnel.mux.errors import FrameSizeError, MetadataError, ProtocolError
from tunnel.mux.metadata import MetaKey
from tunnel.mux.reader import FrameReader

HELLO, SETTINGS, OPEN, DATA, WINDOW_UPDATE, RESET, PING, PONG, GOAWAY = range(9)
END = 0x1


def u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


# -- §2 / §5: the numbers on the wire ----------------------------------------------


def test_wire_numbers_match_the_spec_tables() -> None:
    assert PREFACE == b"GEOEDGE\n"
    assert HEADER_SIZE == 10
    assert [t.value for t in FrameType] == list(range(11))
    assert [t.name for t in FrameType] == [
        "HELLO", "SETTINGS", "OPEN", "DATA", "WINDOW_UPDATE", "RESET", "PING", "PONG", "GOAWAY",
        "PADDING", "CONTROL",
    ]  # fmt: skip
    assert Flag.END_STREAM == 0x1
    assert [c.value for c in ErrorCode] == list(range(17))
    assert [s.value for s in SettingId] == [1, 2, 3, 4, 5]
    assert SETTING_DEFAULTS == {1: 65536, 2: 16384, 3: 262144, 4: 16777216, 5: 4096}
    assert (MIN_FRAME_BYTES, MAX_FRAME_BYTES_LIMIT) == (1024, 16 * 1024 * 1024)


def test_header_is_network_byte_order() -> None:
    assert codec.header(DATA, END, 0x01020304, 0x0A0B0C0D) == bytes.fromhex("0301010203040a0b0c0d")


@pytest.mark.parametrize(
    ("encoded", "expected"),
    [
        (codec.encode_settings({3: 1 << 20}), (SETTINGS, 0, 0, bytes.fromhex("0003 00100000"))),
        (codec.encode_open(5, 70000, b"meta", True), (OPEN, END, 5, u32(70000) + b"meta")),
        (codec.encode_open(7, 1, b"", False), (OPEN, 0, 7, u32(1))),
        (codec.encode_window_update(0, 123456), (WINDOW_UPDATE, 0, 0, u32(123456))),
        (codec.encode_window_update(9, 1), (WINDOW_UPDATE, 0, 9, u32(1))),
        (codec.encode_reset(3, ErrorCode.CANCEL), (RESET, 0, 3, u32(7))),
        (codec.encode_ping(b"12345678"), (PING, 0, 0, b"12345678")),
        (codec.encode_pong(b"abcdefgh"), (PONG, 0, 0, b"abcdefgh")),
        (codec.encode_goaway(41, 0xB, "bye"), (GOAWAY, 0, 0, u32(41) + u32(0xB) + b"bye")),
    ],
)
def test_encoders_follow_the_layouts(encoded: bytes, expected: tuple) -> None:
    assert parse_frames(encoded) == [expected]


def test_hello_is_preface_versions_then_sorted_settings() -> None:
    encoded = codec.encode_hello(1, 3, {5: 4096, 1: 65536})
    assert encoded.startswith(PREFACE)
    [(frame_type, flags, stream_id, payload)] = parse_frames(encoded, preface=True)
    assert (frame_type, flags, stream_id) == (HELLO, 0, 0)
    assert payload == bytes.fromhex("0001 0003") + raw_settings_payload({1: 65536, 5: 4096})


def test_goaway_reason_is_capped_at_256_octets() -> None:
    [(_, _, _, payload)] = parse_frames(codec.encode_goaway(0, 0, "é" * 300))
    assert len(payload) == 8 + 256


def test_a_session_opens_with_preface_and_hello_announcing_its_settings() -> None:
    config = SessionConfig(max_frame_bytes=32768, max_concurrent_streams=7, max_metadata_bytes=512)
    session = Session(config, client=True, now=0.0)
    [hello] = parse_frames(b"".join(session.data_to_send()), preface=True)
    assert hello[:3] == (HELLO, 0, 0)
    assert hello[3][:4] == bytes.fromhex("0001 0001")
    settings = {
        int.from_bytes(hello[3][i : i + 2], "big"): int.from_bytes(hello[3][i + 2 : i + 6], "big")
        for i in range(4, len(hello[3]), 6)
    }
    assert settings == {1: 32768, 2: 7, 3: 262144, 4: 16777216, 5: 512}


# -- every frame type through a session ------------------------------------------


def test_every_frame_type_round_trips_through_a_session() -> None:
    """The server is real; the client is hand-made. Each frame the client sends is
    decoded by the session, and each reply is read back from its bytes."""
    peer = RawPeer()
    assert [type(e) for e in peer.events] == [SessionEstablished]
    written = peer.read()
    assert [f[0] for f in written] == [HELLO, PING]  # HELLO, then a PING to learn the RTT
    ping_opaque = written[1][3]

    meta = StreamMetadata(client_address=("203.0.113.9", 5555), host="example.com")
    peer.send(OPEN, 0, 1, u32(4096) + meta.encode())
    peer.send(DATA, 0, 1, b"hello")
    peer.send(DATA, END, 1, b"!")
    assert peer.events[1:] == [
        StreamOpened(1, meta),
        DataReceived(1, b"hello"),
        DataReceived(1, b"!"),
        StreamEnded(1),
    ]
    peer.session.send_data(1, b"response", end_stream=True)
    assert peer.read() == [(DATA, END, 1, b"response")]

    peer.send(SETTINGS, 0, 0, raw_settings_payload({2: 10}))
    assert peer.session.peer_settings[2] == 10

    peer.send(OPEN, 0, 3, u32(0))
    peer.session.send_data(3, b"x" * 10)
    assert peer.read() == []  # the OPEN granted no window
    peer.send(WINDOW_UPDATE, 0, 3, u32(4))
    assert peer.read() == [(DATA, 0, 3, b"xxxx")]

    peer.send(RESET, 0, 3, u32(ErrorCode.CANCEL))
    assert peer.events[-1] == StreamReset(3, ErrorCode.CANCEL, remote=True)

    peer.send(PING, 0, 0, b"\x00\x01\x02\x03\x04\x05\x06\x07")
    assert peer.read() == [(PONG, 0, 0, b"\x00\x01\x02\x03\x04\x05\x06\x07")]
    peer.now += 0.25
    peer.send(PONG, 0, 0, ping_opaque)
    assert peer.events[-1] == PingAcknowledged(0.25)

    peer.send(GOAWAY, 0, 0, u32(0) + u32(ErrorCode.NO_ERROR) + b"maintenance")
    assert peer.events[-1] == GoAwayReceived(0, ErrorCode.NO_ERROR, "maintenance")
    peer.send(WINDOW_UPDATE, 0, 0, u32(1000))
    assert peer.terminated is None


def test_server_opened_streams_carry_even_ids_and_the_open_layout() -> None:
    peer = RawPeer(session_is_client=False)
    peer.read()
    stream_id = peer.session.open_stream(StreamMetadata(edge_id="e1"), end_stream=True)
    assert stream_id == 2
    [(frame_type, flags, sid, payload)] = peer.read()
    assert (frame_type, flags, sid) == (OPEN, END, 2)
    assert int.from_bytes(payload[:4], "big") == peer.session.stream_window_estimate()
    assert StreamMetadata.decode(payload[4:]) == StreamMetadata(edge_id="e1")


def test_unknown_frame_types_and_undefined_flags_are_ignored() -> None:
    peer = RawPeer()
    peer.send(0x42, 0xFF, 7, b"from the future")
    peer.send(OPEN, 0xFE, 1, u32(1000))  # undefined flags set, END_STREAM clear
    peer.send(DATA, 0xFE, 1, b"abc")
    assert peer.terminated is None
    assert peer.events[-2:] == [StreamOpened(1, StreamMetadata()), DataReceived(1, b"abc")]


def test_padding_is_discarded_whole_and_costs_nothing() -> None:
    """§5.13: PADDING on the connection, of any length up to the frame limit."""
    peer = RawPeer()
    peer.send(0x9, 0, 0, bytes(16 * 1024))
    peer.send(0x9, 0, 0, b"")
    peer.send(OPEN, 0, 1, u32(1000))
    assert peer.terminated is None
    assert peer.events[-1:] == [StreamOpened(1, StreamMetadata())]
    assert codec.encode_padding(5) == raw_frame(0x9, 0, 0, bytes(5))


# -- §2 the reader ------------------------------------------------------------------


def _stream_of_frames() -> bytes:
    return PREFACE + b"".join(
        [
            raw_frame(HELLO, 0, 0, bytes.fromhex("00010001")),
            raw_frame(OPEN, END, 1, u32(5)),
            raw_frame(DATA, 0, 1, b""),
            raw_frame(DATA, 0, 1, b"x" * 300),
            raw_frame(PING, 0, 0, b"8octets!"),
        ]
    )


@pytest.mark.parametrize("chunk", [1, 2, 3, 9, 10, 11, 64, 1000])
def test_reader_frames_are_the_same_however_the_bytes_are_split(chunk: int) -> None:
    data = _stream_of_frames()
    whole = FrameReader(1024).feed(data)
    reader = FrameReader(1024)
    pieces = []
    for i in range(0, len(data), chunk):
        pieces += reader.feed(data[i : i + chunk])
        assert reader.buffered <= HEADER_SIZE + 1024
    assert pieces == whole
    assert [f[0] for f in whole] == [HELLO, OPEN, DATA, DATA, PING]
    assert reader.buffered == 0


@pytest.mark.parametrize("chunk", [None, 1])
def test_reader_refuses_an_oversize_frame_from_its_header_alone(chunk: int | None) -> None:
    reader = FrameReader(1024)
    reader.feed(PREFACE)
    header = raw_frame(DATA, 0, 1)[:6] + u32(1025)
    with pytest.raises(FrameSizeError):
        for i in range(0, len(header), chunk or len(header)):
            reader.feed(header[i : i + (chunk or len(header))])
    assert reader.buffered <= HEADER_SIZE


@pytest.mark.parametrize(
    "junk",
    [b"GET / HTTP/1.1\r\n", bytes.fromhex("160301020001"), b"GEOEDGE\r\n", b"geoedge\n", b"\0" * 8],
)
def test_preface_mismatch_is_a_protocol_error_at_the_first_wrong_octet(junk: bytes) -> None:
    first_bad = next(i for i, (a, b) in enumerate(zip(junk, PREFACE, strict=False)) if a != b)
    session = Session(SessionConfig(), client=False, now=0.0)
    for i, octet in enumerate(junk[: first_bad + 1]):
        events = session.receive_data(bytes([octet]), 0.0)
        assert (events == []) == (i < first_bad)
    assert events[-1] == ConnectionTerminated(ErrorCode.PROTOCOL_ERROR, "protocol error", False)
    frames = parse_frames(b"".join(session.data_to_send()), preface=True)
    assert frames[-1][0] == GOAWAY
    assert frames[-1][3][4:8] == u32(ErrorCode.PROTOCOL_ERROR)
    assert frames[-1][3][8:] == b"protocol error"  # a fixed text, never the exception's


# -- §3 connection start -----------------------------------------------------------------


@pytest.mark.parametrize("first", [PING, SETTINGS, OPEN, DATA, GOAWAY, 0x42])
def test_a_first_frame_other_than_hello_is_a_protocol_error(first: int) -> None:
    peer = RawPeer(hello=False)
    events = peer.feed(PREFACE + raw_frame(first, 0, 0, b"12345678"))
    assert events == [ConnectionTerminated(ErrorCode.PROTOCOL_ERROR, "protocol error", False)]
    assert not peer.session.established


def test_a_second_hello_is_a_protocol_error() -> None:
    peer = RawPeer()
    peer.feed(raw_hello()[len(PREFACE) :])
    assert peer.terminated.error_code == ErrorCode.PROTOCOL_ERROR


def test_hello_split_byte_by_byte_establishes() -> None:
    pair = SessionPair(chunk=1).establish()
    assert pair.client.session.version == pair.server.session.version == 1
    established = pair.client.of_type(SessionEstablished)
    assert established == [SessionEstablished(1, dict(SETTING_DEFAULTS))]


@pytest.mark.parametrize(
    ("peer_min", "peer_max", "outcome"),
    [
        (1, 1, 1),
        (0, 1, 1),
        (1, 9, 1),  # a newer peer that still speaks 1: the highest common version
        (0, 0, ErrorCode.VERSION_MISMATCH),
        (2, 9, ErrorCode.VERSION_MISMATCH),
        (3, 1, ErrorCode.VERSION_MISMATCH),  # an empty range
    ],
)
def test_version_negotiation_picks_the_highest_common_version(
    peer_min: int, peer_max: int, outcome: int
) -> None:
    assert MAX_VERSION == 1
    peer = RawPeer(hello=False)
    events = peer.feed(raw_hello(peer_min, peer_max))
    if outcome == 1:
        assert isinstance(events[0], SessionEstablished)
        assert events[0].version == peer.session.version == 1
    else:
        assert events == [ConnectionTerminated(outcome, "version mismatch", False)]
        goaway = peer.read()[-1]
        assert goaway[0] == GOAWAY and goaway[3][:8] == u32(0) + u32(outcome)


def test_nothing_but_hello_ping_and_goaway_is_sent_before_the_peers_hello() -> None:
    session = Session(SessionConfig(), client=True, now=0.0)
    session.ping(0.0)
    with pytest.raises(Exception, match="not established"):
        session.open_stream(StreamMetadata())
    session.go_away(ErrorCode.NO_ERROR, "never mind")
    frames = parse_frames(b"".join(session.data_to_send()), preface=True)
    assert [f[0] for f in frames] == [HELLO, PING, GOAWAY]


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"\x00\x01", ErrorCode.FRAME_SIZE_ERROR),  # no room for the versions
        (bytes.fromhex("00010001") + b"\x00\x01\x00", ErrorCode.FRAME_SIZE_ERROR),  # not 6n
        (bytes.fromhex("00010001") + b"\0" * 6 * 65, ErrorCode.FRAME_SIZE_ERROR),  # > 64
        (bytes.fromhex("00010001") + raw_settings_payload({1: 1023}), ErrorCode.PROTOCOL_ERROR),
        (
            bytes.fromhex("00010001") + raw_settings_payload({1: 2**24 + 1}),
            ErrorCode.PROTOCOL_ERROR,
        ),
        (bytes.fromhex("00010001") + raw_settings_payload({3: 0}), ErrorCode.FLOW_CONTROL_ERROR),
        (
            bytes.fromhex("00010001") + raw_settings_payload({4: 2**31}),
            ErrorCode.FLOW_CONTROL_ERROR,
        ),
    ],
)
def test_malformed_hello_is_a_connection_error(payload: bytes, code: int) -> None:
    peer = RawPeer(hello=False)
    peer.feed(PREFACE + raw_frame(HELLO, 0, 0, payload))
    assert peer.terminated.error_code == code


def test_hello_on_a_stream_is_a_protocol_error() -> None:
    peer = RawPeer(hello=False)
    peer.feed(PREFACE + raw_frame(HELLO, 0, 1, bytes.fromhex("00010001")))
    assert peer.terminated.error_code == ErrorCode.PROTOCOL_ERROR


def test_hello_settings_apply_and_unknown_settings_are_kept_but_ignored() -> None:
    peer = RawPeer(peer_settings={1: 1024, 2: 3, 3: 1000, 4: 5000, 5: 64, 0x7777: 9})
    assert peer.session.peer_settings[0x7777] == 9
    peer.read()
    sid = peer.session.open_stream(StreamMetadata())
    peer.session.send_data(sid, b"z" * 3000)
    frames = peer.read()
    sizes = [len(f[3]) for f in frames if f[0] == DATA]
    assert sizes == [1000]  # the stream window the peer announced, in frames of <= 1024
    with pytest.raises(MetadataError):
        peer.session.open_stream(StreamMetadata(host="h" * 100))  # > the peer's 64 octets


# -- §4 limits ---------------------------------------------------------------------


def test_a_data_frame_above_max_frame_bytes_is_a_frame_size_error() -> None:
    """The reader also admits OPEN frames of 4 + MAX_METADATA_BYTES; DATA frames
    are held to MAX_FRAME_BYTES all the same."""
    config = SessionConfig(max_frame_bytes=1024, max_metadata_bytes=8192)
    peer = RawPeer(config)
    peer.send(OPEN, 0, 1, u32(1 << 20))
    peer.send(DATA, 0, 1, b"d" * 1024)
    assert peer.terminated is None
    peer.send(DATA, 0, 1, b"d" * 1025)
    assert peer.terminated.error_code == ErrorCode.FRAME_SIZE_ERROR


def test_any_frame_longer_than_the_readers_limit_is_refused_before_its_payload() -> None:
    peer = RawPeer(SessionConfig(max_frame_bytes=2048, max_metadata_bytes=1024))
    peer.feed(raw_frame(PING, 0, 0)[:6] + u32(2049))
    assert peer.terminated.error_code == ErrorCode.FRAME_SIZE_ERROR


@pytest.mark.parametrize(
    ("frame_type", "stream_id", "payload"),
    [
        (SETTINGS, 0, b"\0" * 5),
        (SETTINGS, 0, b"\0" * 390),
        (OPEN, 1, b"\0\0\0"),
        (WINDOW_UPDATE, 0, b"\0\0\0\1\0"),
        (WINDOW_UPDATE, 1, b"\0\0\1"),
        (RESET, 1, b"\0\0\0\0\0"),
        (PING, 0, b"7octets"),
        (PONG, 0, b"9 octets!"),
        (GOAWAY, 0, b"\0" * 7),
        (GOAWAY, 0, b"\0" * (8 + 257)),
    ],
)
def test_control_frames_of_the_wrong_length_are_frame_size_errors(
    frame_type: int, stream_id: int, payload: bytes
) -> None:
    peer = RawPeer()
    peer.send(frame_type, 0, stream_id, payload)
    assert peer.terminated.error_code == ErrorCode.FRAME_SIZE_ERROR


@pytest.mark.parametrize(
    ("frame_type", "stream_id", "payload"),
    [
        (SETTINGS, 1, b""),
        (PING, 1, b"12345678"),
        (PONG, 3, b"12345678"),
        (GOAWAY, 1, b"\0" * 8),
        (RESET, 0, u32(0)),
        (DATA, 0, b"x"),
        (OPEN, 0, u32(0)),
        (WINDOW_UPDATE, 0, u32(0)),
    ],
)
def test_frames_on_the_wrong_stream_or_with_a_zero_increment_are_protocol_errors(
    frame_type: int, stream_id: int, payload: bytes
) -> None:
    peer = RawPeer()
    peer.send(frame_type, 0, stream_id, payload)
    assert peer.terminated.error_code == ErrorCode.PROTOCOL_ERROR


# -- §5.2 SETTINGS after HELLO -------------------------------------------------------


def test_settings_may_raise_the_stream_window_and_change_the_stream_limit() -> None:
    peer = RawPeer(peer_settings={3: 1000, 2: 5})
    peer.send(SETTINGS, 0, 0, raw_settings_payload({3: 5000, 2: 1, 0x99: 1}))
    assert peer.terminated is None
    assert peer.session.peer_settings[3] == 5000
    peer.read()
    sid = peer.session.open_stream(StreamMetadata())
    assert peer.session._streams[sid].send_window == 5000  # streams opened afterwards
    with pytest.raises(Exception, match="MAX_CONCURRENT_STREAMS"):
        peer.session.open_stream(StreamMetadata())
    peer.send(SETTINGS, 0, 0, raw_settings_payload({3: 5000, 1: 65536}))  # unchanged: fine
    assert peer.terminated is None


@pytest.mark.parametrize(
    ("setting", "value", "code"),
    [
        (3, 999, ErrorCode.PROTOCOL_ERROR),  # INITIAL_STREAM_WINDOW may only grow
        (1, 32768, ErrorCode.PROTOCOL_ERROR),
        (4, 1 << 25, ErrorCode.PROTOCOL_ERROR),
        (5, 8192, ErrorCode.PROTOCOL_ERROR),
        (3, 2**31, ErrorCode.FLOW_CONTROL_ERROR),
        (1, 100, ErrorCode.PROTOCOL_ERROR),
    ],
)
def test_settings_that_may_not_change_after_hello(setting: int, value: int, code: int) -> None:
    peer = RawPeer(peer_settings={3: 1000})
    peer.send(SETTINGS, 0, 0, raw_settings_payload({setting: value}))
    assert peer.terminated.error_code == code


# -- §6.2 metadata ---------------------------------------------------------------------


def test_metadata_round_trips_every_key() -> None:
    meta = StreamMetadata(
        client_address=("2001:db8::1", 443),
        server_address=("192.0.2.1", 8443),
        server_name="www.example.com",
        alpn="http/1.1",
        tls_version="TLSv1.3",
        tls_cipher="TLS_AES_128_GCM_SHA256",
        edge_id="tokyo-1",
        host="www.example.com:8443",
        request_id="0f1e2d3c",
        tls_resumed=True,
        method="GET",
        target="/events?since=7",
        long_poll=True,
        extra={0x42: b"\x00\xffopaque", 0xE0: b""},
    )
    encoded = meta.encode()
    assert StreamMetadata.decode(encoded) == meta
    assert StreamMetadata.decode(memoryview(encoded)) == meta
    assert StreamMetadata.decode(b"") == StreamMetadata()
    assert StreamMetadata.decode(StreamMetadata(tls_resumed=False).encode()).tls_resumed is False
    assert StreamMetadata.decode(StreamMetadata(long_poll=False).encode()).long_poll is False


def test_metadata_item_layouts() -> None:
    assert StreamMetadata(client_address=("198.51.100.7", 54321)).encode() == bytes.fromhex(
        "01 0007 04 c6336407 d431"
    )
    assert StreamMetadata(server_address=("::1", 80)).encode() == bytes.fromhex(
        "02 0013 06 00000000000000000000000000000001 0050"
    )
    assert StreamMetadata(alpn="h2", tls_resumed=False).encode() == bytes.fromhex(
        "04 0002 6832 0a 0001 00"
    )
    assert StreamMetadata(long_poll=True).encode() == bytes.fromhex("0d 0001 01")
    assert [k.value for k in MetaKey] == list(range(1, 14))


def test_unknown_metadata_keys_are_kept_and_passed_on() -> None:
    raw = bytes.fromhex("ee 0003 616263 08 0001 68")
    meta = StreamMetadata.decode(raw)
    assert meta.host == "h"
    assert meta.extra == {0xEE: b"abc"}
    assert StreamMetadata.decode(meta.encode()) == meta


@pytest.mark.parametrize(
    "raw",
    [
        bytes.fromhex("01"),  # truncated item header
        bytes.fromhex("08 0005 6162"),  # overruns
        bytes.fromhex("08 0002 ff fe"),  # not UTF-8
        bytes.fromhex("01 0007 05 01020304 0050"),  # unknown family
        bytes.fromhex("01 0006 04 01020304 00"),  # short address
        bytes.fromhex("02 0013 04" + "00" * 18),  # family 4 with 16 octets
        bytes.fromhex("0a 0001 02"),  # TLS_RESUMED not 0/1
        bytes.fromhex("0a 0000"),
        bytes.fromhex("0d 0001 02"),  # LONG_POLL not 0/1
        bytes.fromhex("0d 0002 0101"),
        bytes.fromhex("08 0001 61 08 0001 62"),  # a known key twice
        bytes.fromhex("ee 0000 ee 0000"),  # an unknown key twice
        # a key before and after the first item about the connection (the
        # two parts are decoded apart: StreamMetadata.decode)
        bytes.fromhex("08 0001 61 01 0007 04 01020304 0050 08 0001 62"),
        bytes.fromhex("ee 0000 01 0007 04 01020304 0050 ee 0000"),
        bytes.fromhex("08 0001 61 01 0007 04 01020304 0050 0a 0001 02"),
    ],
)
def test_malformed_metadata_is_refused(raw: bytes) -> None:
    with pytest.raises(MetadataError):
        StreamMetadata.decode(raw)


@pytest.mark.parametrize(
    "meta",
    [
        StreamMetadata(client_address=("example.com", 1)),
        StreamMetadata(client_address=("10.0.0.1", 65536)),
        StreamMetadata(client_address=("10.0.0.1", -1)),
        StreamMetadata(host="h" * 65536),
        StreamMetadata(extra={1000: b""}),
    ],
)
def test_unencodable_metadata_is_refused(meta: StreamMetadata) -> None:
    with pytest.raises((MetadataError, ValueError)):
        meta.encode()


def test_errors_carry_their_wire_codes() -> None:
    assert FrameSizeError("x").code == ErrorCode.FRAME_SIZE_ERROR
    assert ProtocolError("x", ErrorCode.INTERNAL_ERROR).code == ErrorCode.INTERNAL_ERROR
    assert MetadataError("x").code == ErrorCode.METADATA_ERROR
    assert ErrorCode.name_of(0x99) == "UNKNOWN_0x99"
    assert ErrorCode.name_of(0xE) == "NO_BACKEND"


def test_request_fields_appended_to_a_connections_encoding_decode_as_one() -> None:
    from tunnel.mux.metadata import encode_request_fields

    base = StreamMetadata(
        client_address=("2001:db8::7", 443), server_name="shop.test", edge_id="tokyo-1"
    )
    wire = base.encode() + encode_request_fields("shop.test:443", "r-1")
    decoded = StreamMetadata.decode(wire)
    assert decoded.client_address == ("2001:db8::7", 443)
    assert (decoded.host, decoded.request_id, decoded.edge_id) == (
        "shop.test:443",
        "r-1",
        "tokyo-1",
    )
    assert encode_request_fields(None, None) == b""
    # LONG_POLL is the request's, not the connection's: sent only when set.
    marked = encode_request_fields("shop.test", "r-2", "GET", "/events", long_poll=True)
    assert marked.endswith(bytes.fromhex("0d 0001 01"))
    assert StreamMetadata.decode(marked + base.encode()).long_poll is True
    assert StreamMetadata.decode(wire).long_poll is None


def test_a_connections_items_are_decoded_once_for_all_its_requests() -> None:
    from tunnel.mux.metadata import _decode_items_memo, encode_request_fields

    connection = StreamMetadata(
        client_address=("198.51.100.7", 50123), tls_version="TLSv1.3", edge_id="osaka-2"
    ).encode()
    before = _decode_items_memo.cache_info()
    for n in range(3):
        decoded = StreamMetadata.decode(
            encode_request_fields("shop.test", f"r-{n}", "GET", f"/p{n}") + connection
        )
        assert (decoded.request_id, decoded.target) == (f"r-{n}", f"/p{n}")
        assert decoded.client_address == ("198.51.100.7", 50123)
        assert (decoded.tls_version, decoded.edge_id) == ("TLSv1.3", "osaka-2")
    after = _decode_items_memo.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 2)


def test_a_malformed_connection_part_is_refused_every_time() -> None:
    from tunnel.mux.metadata import encode_request_fields

    bad = encode_request_fields("shop.test", "r-1") + bytes.fromhex("0a 0001 07")
    for _ in range(2):
        with pytest.raises(MetadataError):
            StreamMetadata.decode(bad)
