"""The edge's HPACK decoder (edge/h2_decoder.py) agrees with ``hpack.Decoder``,
checked by hypothesis: on blocks a real encoder writes (Huffman or not, with
table size changes and never-indexed fields) it returns the same fields and leaves the same dynamic
table after every block; on any octets it refuses exactly what ``hpack``
refuses and otherwise returns what ``hpack`` returns."""

from __future__ import annotations

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.h2_decoder import RequestHeadDecoder
from tests.example_budget import examples

_NAMES = [b":method", b":path", b":authority", b":scheme", b"cookie", b"user-agent",
          b"accept", b"x-custom", b"authorization", b"a" * 200]  # fmt: skip
_field = st.tuples(
    st.one_of(st.sampled_from(_NAMES), st.binary(min_size=1, max_size=20)),
    st.one_of(st.sampled_from([b"GET", b"/", b"https", b"", b"x" * 300]), st.binary(max_size=200)),
)
_sensitive_field = _field.map(lambda f: hpack.NeverIndexedHeaderTuple(*f))  # never indexed
_block = st.tuples(
    st.lists(st.one_of(_field, _field, _sensitive_field), max_size=12),
    st.booleans(),  # Huffman
    st.one_of(st.none(), st.integers(0, 4096)),  # a table size change before the block
)


def _pair(max_list: int = 65536) -> tuple[hpack.Decoder, RequestHeadDecoder]:
    theirs, ours = hpack.Decoder(), RequestHeadDecoder()
    theirs.max_header_list_size = ours.max_header_list_size = max_list
    return theirs, ours


def _outcome(decoder: hpack.Decoder, data: bytes) -> object:
    try:
        return [tuple(field) for field in decoder.decode(data, raw=True)]
    except (hpack.HPACKError, IndexError) as exc:
        return type(exc).__name__ if isinstance(exc, hpack.OversizedHeaderListError) else "refused"


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(_block, min_size=1, max_size=6), st.sampled_from([65536, 400]))
def test_what_an_encoder_writes_decodes_the_same(blocks: list, max_list: int) -> None:
    encoder = hpack.Encoder()
    theirs, ours = _pair(max_list)
    for fields, huffman, table_size in blocks:
        if table_size is not None:
            encoder.header_table_size = table_size
        data = encoder.encode(fields, huffman=huffman)
        expected = _outcome(theirs, data)
        assert _outcome(ours, data) == expected
        if not isinstance(expected, list):
            return  # the connection ends on a refused block
        assert list(ours.header_table.dynamic_entries) == list(theirs.header_table.dynamic_entries)
        assert ours.header_table_size == theirs.header_table_size


@settings(max_examples=examples(3000), deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=3), st.sampled_from([65536, 100]))
def test_any_octets_are_refused_or_decoded_as_hpack_does(
    blocks: list[bytes], max_list: int
) -> None:
    theirs, ours = _pair(max_list)
    theirs.max_allowed_table_size = ours.max_allowed_table_size = 256
    for data in blocks:
        expected = _outcome(theirs, data)
        assert _outcome(ours, data) == expected, data
        if not isinstance(expected, list):
            return
        assert list(ours.header_table.dynamic_entries) == list(theirs.header_table.dynamic_entries)
