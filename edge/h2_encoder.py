"""HPACK for the edge's response heads: the static table and literals, nothing else.

Why not ``hpack.Encoder`` as it is: it indexes every field in a dynamic table
it mirrors for the client, logs each integer it writes, and Huffman-codes in
pure Python. Most of what a Node.js response head carries changes with every
response (``date``, ``x-request-id``, ``content-length``, ``etag``), so the
table saves little: measured on a typical head (``:status``, ``content-type``,
``date``, ``content-length``, ``x-request-id``) ``hpack.Encoder`` without
Huffman took 6.9 us per head (timeit, this machine) and this encoder 1.3 us;
the cost is ~25 octets per head for the fields a dynamic table would have
indexed (``content-type``, ``x-powered-by``, ``cache-control``).

What goes on the wire (RFC 7541):

- a field in the static table, name and value both: its index (§6.1);
- a field whose name is in the static table: a literal without indexing, the
  name by index (§6.2.2); otherwise a literal without indexing with a literal
  name; ``authorization``, ``proxy-authorization`` and ``set-cookie`` as
  never-indexed literals (§6.2.3), so no intermediary stores them;
- no Huffman coding (§5.2, ``H`` = 0);
- a dynamic table size update to 0 (§6.3) at the start of the first block
  and of the first block after the client changes SETTINGS_HEADER_TABLE_SIZE.
  Nothing is ever inserted, so the client's table stays empty and 0 is within
  any limit it can set (RFC 9113 §4.3.1).

Invariant: :meth:`StaticTableEncoder.encode` keeps no state about the fields
it wrote; the only state is whether a size update is owed.
"""

from __future__ import annotations

from collections.abc import Iterable

import hpack
from hpack.table import HeaderTable

__all__ = ["StaticTableEncoder", "encode_integer"]

_NEVER_INDEXED = frozenset({b"authorization", b"proxy-authorization", b"set-cookie"})


def encode_integer(value: int, prefix_bits: int, flags: int) -> bytes:
    """RFC 7541 §5.1: ``value`` in an N-bit prefix whose octet's high bits are ``flags``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((flags | value,))
    out = bytearray((flags | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _static_tables() -> tuple[dict[tuple[bytes, bytes], bytes], dict[bytes, bytes]]:
    """(field -> its indexed representation, name -> the start of a literal
    without indexing (or never indexed) that names it by index)."""
    fields: dict[tuple[bytes, bytes], bytes] = {}
    names: dict[bytes, bytes] = {}
    for index, (name, value) in enumerate(HeaderTable.STATIC_TABLE, start=1):
        fields.setdefault((name, value), encode_integer(index, 7, 0x80))
        flags = 0x10 if name in _NEVER_INDEXED else 0x00
        names.setdefault(name, encode_integer(index, 4, flags))
    return fields, names


_INDEXED, _NAMED = _static_tables()
_TABLE_SIZE_ZERO = encode_integer(0, 5, 0x20)
#: String lengths below 127 octets take one octet (no Huffman bit); the rest are rare.
_SHORT_LENGTH = [bytes((n,)) for n in range(0x7F)]


def _string(octets: bytes) -> bytes:
    n = len(octets)
    if n < 0x7F:
        return _SHORT_LENGTH[n] + octets
    return encode_integer(n, 7, 0x00) + octets


class StaticTableEncoder(hpack.Encoder):
    """An ``hpack.Encoder`` for ``h2.connection.H2Connection.encoder``: ``h2``
    calls :meth:`encode` for each header block and sets
    ``header_table_size`` when the client's SETTINGS_HEADER_TABLE_SIZE
    changes (which queues an entry in ``table_size_changes``)."""

    def __init__(self) -> None:
        super().__init__()
        self._size_update_owed = True

    def encode(  # type: ignore[override]
        self, headers: Iterable[tuple[bytes, bytes]], huffman: bool = False
    ) -> bytes:
        """One header block for ``headers``: (name, value) pairs, names lowercase."""
        out: list[bytes] = []
        if self._size_update_owed or self.table_size_changes:
            out.append(_TABLE_SIZE_ZERO)
            self._size_update_owed = False
            self.table_size_changes = []
        indexed = _INDEXED
        named = _NAMED
        for field in headers:
            name, value = field[0], field[1]
            whole = indexed.get((name, value))
            if whole is not None:
                out.append(whole)
                continue
            prefix = named.get(name)
            if prefix is not None:
                out.append(prefix)
            else:
                out.append(b"\x10" if name in _NEVER_INDEXED else b"\x00")
                out.append(_string(name))
            out.append(_string(value))
        return b"".join(out)
