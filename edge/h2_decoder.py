"""HPACK for the clients' request heads: ``hpack.Decoder`` with a faster ``decode``.

Why not ``hpack.Decoder.decode`` as it is: for each field it slices a
memoryview, calls three to five Python functions, builds a ``HeaderTuple``
and formats a debug log record's arguments. A browser's second request on a
connection is a HEADERS block of ~20 octets, nearly all of it indexed
fields, and ``hpack`` spent 79 us (cProfile) of the 140 us that ``h2`` took
to receive it. This ``decode`` reads the block in one loop with the common
cases inline (an index or a length that fits its prefix, a static or dynamic
table entry) and leaves the rest to ``hpack``'s own parts: the table and its
eviction, multi-octet integers (``decode_integer``), Huffman
(``decode_huffman``), table size updates and their bounds. Timed on a
browser-like request of ten fields as ``hpack.Encoder`` writes it (timeit,
this machine): its second block (10 octets, all indexed) ``hpack`` 17.4 us,
this decoder 2.3 us; the first block (102 octets, Huffman-coded literals)
46 us and 26 us, most of which is Huffman decoding, left to ``hpack``.

What it keeps of ``hpack.Decoder.decode`` (RFC 7541), and a hypothesis
property checks against it: the same fields in the same order, the same
dynamic table after every block, and the same refusals: a table size update
after a field or above ``max_allowed_table_size`` (§4.2, §6.3); index 0 or
past the table (§2.3.3); a string or integer cut short (§5.1, §5.2); a
header list above ``max_header_list_size`` (``OversizedHeaderListError``,
which ``h2`` answers as an HPACK bomb). Fields come back as plain
``(name, value)`` tuples of bytes (``raw`` is always true here): the edge
turns requests into HTTP/1.1 and never re-encodes what a client sent, so
whether a field was "never indexed" does not matter to it.

Invariant: the decoder's state is ``hpack``'s (``header_table``), changed
only through ``HeaderTable.add`` and the ``header_table_size`` setter.
"""

from __future__ import annotations

import hpack
from hpack.exceptions import HPACKDecodingError, InvalidTableIndex, OversizedHeaderListError
from hpack.hpack import decode_integer
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

__all__ = ["RequestHeadDecoder"]

_STATIC = HeaderTable.STATIC_TABLE
_STATIC_LENGTH = HeaderTable.STATIC_TABLE_LENGTH


class RequestHeadDecoder(hpack.Decoder):
    """``hpack.Decoder`` whose :meth:`decode` is fast on what clients send."""

    def decode(self, data: bytes, raw: bool = True) -> list[tuple[bytes, bytes]]:  # type: ignore[override]
        if type(data) is not bytes:  # h2 passes bytes; slices must be bytes too
            data = bytes(data)
        table = self.header_table
        dynamic = table.dynamic_entries
        limit = self.max_header_list_size
        headers: list[tuple[bytes, bytes]] = []
        size = 0
        end = len(data)
        at = 0
        while at < end:
            first = data[at]
            if first & 0x80:  # indexed field (§6.1)
                index = first & 0x7F  # inline: nearly every field of a repeat request
                if index == 0x7F:
                    index, at = _integer(data, at, 0x7F)
                else:
                    at += 1
                if 0 < index <= _STATIC_LENGTH:
                    field = _STATIC[index - 1]
                elif _STATIC_LENGTH < index <= _STATIC_LENGTH + len(dynamic):
                    field = dynamic[index - _STATIC_LENGTH - 1]
                else:
                    raise InvalidTableIndex(f"Invalid table index {index}")
            elif first & 0xE0 == 0x20:  # dynamic table size update (§6.3)
                if headers:
                    raise HPACKDecodingError("Table size update not at the start of the block")
                at += self._update_encoding_context(memoryview(data)[at:])
                continue
            else:  # a literal (§6.2): with incremental indexing, without, never indexed
                indexing = first & 0x40
                index, at = _integer(data, at, 0x3F if indexing else 0x0F)
                if index:
                    name = table.get_by_index(index)[0]
                else:
                    name, at = _string(data, at)
                value, at = _string(data, at)
                field = (name, value)
                if indexing:
                    table.add(name, value)
            headers.append(field)
            size += 32 + len(field[0]) + len(field[1])
            if size > limit:
                raise OversizedHeaderListError(
                    f"A header list larger than {limit} has been received"
                )
        self._assert_valid_table_size()
        return headers


def _string(data: bytes, at: int) -> tuple[bytes, int]:
    """The string literal (§5.2) at ``at`` and the offset after it."""
    huffman = data[at] & 0x80
    length, at = _integer(data, at, 0x7F)
    value = data[at : at + length]
    if len(value) != length:
        raise HPACKDecodingError("Truncated header block")
    if huffman:
        value = decode_huffman(value)
    return value, at + length


def _integer(data: bytes, at: int, mask: int) -> tuple[int, int]:
    """The integer (§5.1) whose prefix is the ``mask`` bits of ``data[at]``, and
    the offset after it; one octet unless the prefix is all ones."""
    value = data[at] & mask
    if value != mask:
        return value, at + 1
    value, used = decode_integer(memoryview(data)[at:], mask.bit_length())
    return value, at + used
