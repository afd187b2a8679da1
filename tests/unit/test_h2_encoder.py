"""The edge's HPACK encoder (edge.h2_encoder): what it writes decodes, with
hpack's decoder and with a whole h2 client, to exactly the fields given, and
it never grows the client's dynamic table."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
from hypothesis import given
from hypothesis import strategies as st

from edge.h2_encoder import StaticTableEncoder, encode_integer

TOKEN = st.binary(min_size=1, max_size=40).map(
    lambda b: bytes(c for c in b.lower() if 0x21 <= c <= 0x7E and c != ord(":")) or b"x"
)
VALUE = st.binary(max_size=300).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F))
STATIC_NAMES = st.sampled_from(
    [b"content-type", b"date", b"content-length", b"set-cookie", b"etag", b"cache-control"]
)


def test_integers_follow_rfc_7541_appendix_c1() -> None:
    assert encode_integer(10, 5, 0x00) == bytes([0x0A])  # C.1.1
    assert encode_integer(1337, 5, 0x00) == bytes([0x1F, 0x9A, 0x0A])  # C.1.2
    assert encode_integer(42, 8, 0x00) == bytes([0x2A])  # C.1.3
    assert encode_integer(30, 5, 0xE0) == bytes([0xFE])  # the flags are kept
    assert encode_integer(31, 5, 0x20) == bytes([0x3F, 0x00])  # the prefix's own limit


@given(st.lists(st.tuples(st.one_of(TOKEN, STATIC_NAMES), VALUE), max_size=12))
def test_every_block_decodes_to_the_fields_given(fields: list[tuple[bytes, bytes]]) -> None:
    encoder = StaticTableEncoder()
    decoder = hpack.Decoder()
    for _ in range(2):  # the first block carries the size update, the second not
        block = encoder.encode([(b":status", b"200"), *fields])
        assert decoder.decode(block, raw=True) == [(b":status", b"200"), *fields]
    assert len(decoder.header_table.dynamic_entries) == 0  # nothing was ever indexed


def test_the_table_size_update_comes_first_and_again_after_a_settings_change() -> None:
    encoder = StaticTableEncoder()
    first = encoder.encode([(b":status", b"200")])
    assert first == b"\x20\x88"  # size update to 0, then static index 8
    assert encoder.encode([(b":status", b"200")]) == b"\x88"
    encoder.header_table_size = 256  # what h2 does on the client's SETTINGS
    assert encoder.encode([(b":status", b"404")]) == b"\x20\x8d"
    assert encoder.encode([(b":status", b"404")]) == b"\x8d"


def test_credentials_are_never_indexed_literals() -> None:
    block = StaticTableEncoder().encode([(b"set-cookie", b"sid=1"), (b"x-other", b"v")])
    # 0x20 size update; set-cookie is static index 55: 0001 1111 + (55 - 15)
    assert block[1:3] == bytes([0x1F, 55 - 15])
    assert block[3:9] == b"\x05sid=1"
    assert block[9:] == b"\x00\x07x-other\x01v"  # a literal name, without indexing


def test_an_h2_client_reads_responses_after_shrinking_its_table() -> None:
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
    )
    server.encoder = StaticTableEncoder()
    client = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    client.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.HEADER_TABLE_SIZE: 0}
    )
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    response = [(b":status", b"200"), (b"content-type", b"text/plain"), (b"x-request-id", b"a1")]
    for stream_id in (1, 3, 5):
        client.send_headers(
            stream_id,
            [(b":method", b"GET"), (b":path", b"/"), (b":scheme", b"https"), (b":authority", b"e")],
            end_stream=True,
        )
        server.receive_data(client.data_to_send())
        server.send_headers(stream_id, response, end_stream=True)
        events = client.receive_data(server.data_to_send())
        received = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        assert [e.headers for e in received] == [response]
