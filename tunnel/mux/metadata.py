"""Stream metadata carried on OPEN (PROTOCOL.md §6.2): who the client is and how
it reached the edge.

Encoded as a sequence of TLV items ``Key(8) Length(16) Value``. Unknown keys are
kept (in :attr:`StreamMetadata.extra`) and passed on, so a newer edge can add
items an older origin ignores: that is the "room for more".
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import struct

from tunnel.mux.errors import MetadataError

_ITEM = struct.Struct(">BH")
_PORT = struct.Struct(">H")

Address = tuple[str, int]


class MetaKey(enum.IntEnum):
    """PROTOCOL.md §6.2 key registry."""

    CLIENT_ADDRESS = 0x01
    SERVER_ADDRESS = 0x02
    SERVER_NAME = 0x03
    ALPN = 0x04
    TLS_VERSION = 0x05
    TLS_CIPHER = 0x06
    EDGE_ID = 0x07
    HOST = 0x08
    REQUEST_ID = 0x09
    TLS_RESUMED = 0x0A
    METHOD = 0x0B
    TARGET = 0x0C
    LONG_POLL = 0x0D


_TEXT_FIELDS: tuple[tuple[MetaKey, str], ...] = (
    (MetaKey.SERVER_NAME, "server_name"),
    (MetaKey.ALPN, "alpn"),
    (MetaKey.TLS_VERSION, "tls_version"),
    (MetaKey.TLS_CIPHER, "tls_cipher"),
    (MetaKey.EDGE_ID, "edge_id"),
    (MetaKey.HOST, "host"),
    (MetaKey.REQUEST_ID, "request_id"),
    (MetaKey.METHOD, "method"),
    (MetaKey.TARGET, "target"),
)
_TEXT_BY_KEY = {int(k): name for k, name in _TEXT_FIELDS}
_KIND_ADDRESS, _KIND_TEXT, _KIND_FLAG = 0, 1, 2
#: Every field as (key, name, kind), in key order: what ``encode`` writes.
_FIELDS_IN_KEY_ORDER: tuple[tuple[int, str, int], ...] = tuple(
    sorted(
        [
            (int(MetaKey.CLIENT_ADDRESS), "client_address", _KIND_ADDRESS),
            (int(MetaKey.SERVER_ADDRESS), "server_address", _KIND_ADDRESS),
            (int(MetaKey.TLS_RESUMED), "tls_resumed", _KIND_FLAG),
            (int(MetaKey.LONG_POLL), "long_poll", _KIND_FLAG),
            *((int(key), name, _KIND_TEXT) for key, name in _TEXT_FIELDS),
        ]
    )
)
_FIELD_NAMES = (
    "client_address", "server_address", "server_name", "alpn", "tls_version", "tls_cipher",
    "edge_id", "host", "request_id", "tls_resumed", "method", "target", "long_poll", "extra",
)  # fmt: skip
"""StreamMetadata's fields, in the order its constructor takes them."""
_KNOWN_KEYS = frozenset(int(k) for k in MetaKey)
_CLIENT_ADDRESS = int(MetaKey.CLIENT_ADDRESS)
_SERVER_ADDRESS = int(MetaKey.SERVER_ADDRESS)
_TLS_RESUMED = int(MetaKey.TLS_RESUMED)
_LONG_POLL = int(MetaKey.LONG_POLL)
_HOST = int(MetaKey.HOST)
_REQUEST_ID = int(MetaKey.REQUEST_ID)
_METHOD = int(MetaKey.METHOD)
_TARGET = int(MetaKey.TARGET)
_LONG_POLL_ITEM = bytes((_LONG_POLL, 0, 1, 1))
_FLAG = {b"\x00": False, b"\x01": True}
#: The fields that are not text, by key.
_OTHER_FIELDS = {
    _CLIENT_ADDRESS: "client_address",
    _SERVER_ADDRESS: "server_address",
    _TLS_RESUMED: "tls_resumed",
    _LONG_POLL: "long_poll",
}


class StreamMetadata:
    """What the origin needs to know about the client behind a stream.

    Read-only by convention. Not a dataclass: the origin decodes one per
    request (:meth:`decode`), and the compiled build makes it a typed class
    (``metadata.pxd``), whose fields are set in C; a dataclass's generated
    ``__init__`` is interpreted code in either build (~11,000 instructions
    per request at the origin, ``make bench-hop-instructions``). Built like
    one: keyword or positional fields in this order, all optional, equality
    by fields, unhashable."""

    __slots__ = (
        "alpn",
        "client_address",
        "edge_id",
        "extra",
        "host",
        "long_poll",
        "method",
        "request_id",
        "server_address",
        "server_name",
        "target",
        "tls_cipher",
        "tls_resumed",
        "tls_version",
    )

    def __init__(
        self,
        client_address: Address | None = None,
        server_address: Address | None = None,
        server_name: str | None = None,
        alpn: str | None = None,
        tls_version: str | None = None,
        tls_cipher: str | None = None,
        edge_id: str | None = None,
        host: str | None = None,
        request_id: str | None = None,
        tls_resumed: bool | None = None,
        method: str | None = None,
        target: str | None = None,
        long_poll: bool | None = None,
        extra: dict[int, bytes] | None = None,
    ) -> None:
        self.client_address = client_address
        self.server_address = server_address
        self.server_name = server_name
        self.alpn = alpn
        self.tls_version = tls_version
        self.tls_cipher = tls_cipher
        self.edge_id = edge_id
        self.host = host
        self.request_id = request_id
        self.tls_resumed = tls_resumed
        self.method = method
        self.target = target
        # long_poll: the edge lists the request's target as a long poll, and
        # no response deadline applies to its stream (PROTOCOL.md §6.2).
        self.long_poll = long_poll
        self.extra: dict[int, bytes] = {} if extra is None else extra

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in _FIELD_NAMES)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # as a dataclass with eq: unhashable

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELD_NAMES)
        return f"StreamMetadata({shown})"

    def encode(self) -> bytes:
        """The TLV encoding of every field that is set, in key order."""
        out = bytearray()
        pack = _ITEM.pack
        for key, name, kind in _FIELDS_IN_KEY_ORDER:
            value = getattr(self, name)
            if value is None:
                continue
            if kind == _KIND_TEXT:
                raw = value.encode("utf-8", "surrogateescape")
                if len(raw) > 0xFFFF:
                    raise MetadataError(f"metadata item {key:#x} longer than 65535 octets")
            elif kind == _KIND_ADDRESS:
                raw = _encode_address(value)
            else:
                raw = b"\x01" if value else b"\x00"
            out += pack(key, len(raw))
            out += raw
        for extra_key, raw in self.extra.items():
            if not 0 <= extra_key <= 0xFF or extra_key in _KNOWN_KEYS:
                raise MetadataError(
                    f"extra metadata key {extra_key:#x} is not an unregistered octet"
                )
            _put(out, extra_key, raw)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes | memoryview) -> StreamMetadata:
        """Parse TLV items; raise :class:`MetadataError` on any malformed item.

        The origin decodes one per request. A client connection's requests
        repeat its items about the connection (addresses, TLS facts, edge id)
        and the edge sends them after the request's own
        (:func:`encode_request_fields`), so the items from the first one of
        :data:`_CONNECTION_KEYS` to the end are decoded once per distinct
        octets (:func:`_decode_items_memo`): 7.2 -> 5.0 us for a typical
        request. Any order decodes the same; a repeated key anywhere is an error.
        """
        data = bytes(data)
        values: dict[str, object] = {}
        extra: dict[int, bytes] = {}
        end = len(data)
        pos = _decode_items(data, 0, end, values, extra, stop_at=_CONNECTION_KEYS)
        if pos < end:
            rest_values, rest_extra = _decode_items_memo(data[pos:])
            if not values.keys().isdisjoint(rest_values) or not extra.keys().isdisjoint(rest_extra):
                raise MetadataError("metadata item repeated")
            values.update(rest_values)
            extra.update(rest_extra)
        return cls(**values, extra=extra)  # type: ignore[arg-type]


#: Keys about the client connection rather than the request: equal for all of
#: a connection's streams.
_CONNECTION_KEYS = frozenset(int(k) for k in MetaKey) - {
    int(MetaKey.HOST),
    int(MetaKey.REQUEST_ID),
    int(MetaKey.METHOD),
    int(MetaKey.TARGET),
    int(MetaKey.LONG_POLL),
}


def _decode_items(
    data: bytes,
    pos: int,
    end: int,
    values: dict[str, object],
    extra: dict[int, bytes],
    stop_at: frozenset[int] = frozenset(),
) -> int:
    """Decode the items of ``data[pos:end]`` into ``values`` (by field name)
    and ``extra`` (unknown keys) until one whose key is in ``stop_at``;
    return where that item starts (``end`` when none). Plain int keys, the
    header read by indexing and one pass: an IntEnum-compared loop took four
    times as long, ``struct`` twice as long as indexing. A key is repeated
    when its field (or extra key) is already set: ``values`` only ever holds
    fields decoded here, and ``None`` is never decoded."""
    text_by_key = _TEXT_BY_KEY
    while pos < end:
        if end - pos < 3:
            raise MetadataError("truncated metadata item header")
        key = data[pos]
        if key in stop_at:
            return pos
        stop = pos + 3 + (data[pos + 1] << 8 | data[pos + 2])
        pos += 3
        if stop > end:
            raise MetadataError(f"metadata item {key:#x} overruns the frame")
        name = text_by_key.get(key)
        if name is not None:
            if name in values:
                raise MetadataError(f"metadata item {key:#x} repeated")
            try:
                values[name] = data[pos:stop].decode()
            except UnicodeDecodeError:
                raise MetadataError(f"metadata item {key:#x} is not UTF-8") from None
        elif (name := _OTHER_FIELDS.get(key)) is None:
            if key in extra:
                raise MetadataError(f"metadata item {key:#x} repeated")
            extra[key] = data[pos:stop]
        elif name in values:
            raise MetadataError(f"metadata item {key:#x} repeated")
        elif key in (_CLIENT_ADDRESS, _SERVER_ADDRESS):
            values[name] = _decode_address(data[pos:stop])
        else:
            flag = _FLAG.get(data[pos:stop])
            if flag is None:
                raise MetadataError(f"{MetaKey(key).name} must be one octet, 0 or 1")
            values[name] = flag
        pos = stop
    return end


@functools.lru_cache(maxsize=4096)
def _decode_items_memo(data: bytes) -> tuple[dict[str, object], dict[int, bytes]]:
    """:func:`_decode_items` of all of ``data``, kept for the connection's next
    request. Callers copy from the dicts and never change them; a malformed
    block raises every time (``lru_cache`` keeps no exceptions)."""
    values: dict[str, object] = {}
    extra: dict[int, bytes] = {}
    _decode_items(data, 0, len(data), values, extra)
    return values, extra


def encode_request_fields(
    host: str | None,
    request_id: str | None,
    method: str | None = None,
    target: str | None = None,
    *,
    long_poll: bool = False,
) -> bytes:
    """TLV items of the per-request fields (Host, request id, method, target,
    LONG_POLL when ``long_poll``), to
    append to a connection's metadata encoded once (:meth:`StreamMetadata.encode`):
    a client connection opens a stream per request (PROTOCOL.md §6.7), and
    re-encoding its addresses and TLS facts for each was measurable at the edge.
    They go before the connection's items: the origin decodes those once per
    client connection (:meth:`StreamMetadata.decode`).

    Written out item by item, without :func:`_put`: the edge runs this for
    every request (3.4 -> 1.6 us)."""
    pack = _ITEM.pack
    out = b""
    if host is not None:
        raw = host.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise MetadataError("metadata item 0x8 longer than 65535 octets")
        out = pack(_HOST, len(raw)) + raw
    if request_id is not None:
        raw = request_id.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise MetadataError("metadata item 0x9 longer than 65535 octets")
        out += pack(_REQUEST_ID, len(raw)) + raw
    if method is not None:
        raw = method.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise MetadataError("metadata item 0xb longer than 65535 octets")
        out += pack(_METHOD, len(raw)) + raw
    if target is not None:
        raw = target.encode("utf-8", "surrogateescape")
        if len(raw) > 0xFFFF:
            raise MetadataError("metadata item 0xc longer than 65535 octets")
        out += pack(_TARGET, len(raw)) + raw
    if long_poll:
        out += _LONG_POLL_ITEM
    return out


def _put(out: bytearray, key: int, value: bytes) -> None:
    if len(value) > 0xFFFF:
        raise MetadataError(f"metadata item {key:#x} longer than 65535 octets")
    out += _ITEM.pack(key, len(value))
    out += value


@functools.lru_cache(maxsize=4096)
def _pack_ip(host: str) -> bytes:
    """``ipaddress`` parsing costs ~3 us; clients come back, so keep the last
    few thousand (per-connection metadata encoding at the edge)."""
    try:
        packed = ipaddress.ip_address(host).packed
    except ValueError:
        raise MetadataError(f"not an IP address: {host!r}") from None
    return bytes((4 if len(packed) == 4 else 6,)) + packed


def _encode_address(address: Address) -> bytes:
    host, port = address
    packed = _pack_ip(host)
    if not 0 <= port <= 0xFFFF:
        raise MetadataError(f"port out of range: {port}")
    return packed + _PORT.pack(port)


def _decode_address(raw: bytes) -> Address:
    size = len(raw)
    if not ((size == 7 and raw[0] == 4) or (size == 19 and raw[0] == 6)):
        raise MetadataError("malformed address item")
    return _unpack_ip(raw[: size - 2]), _PORT.unpack_from(raw, size - 2)[0]


@functools.lru_cache(maxsize=4096)
def _unpack_ip(packed: bytes) -> str:
    """The text form of a family octet + address; ``str(ipaddress...)`` costs
    ~2 us and the origin decodes two addresses per stream, mostly the same few
    edges' clients again (the mirror of :func:`_pack_ip`)."""
    if packed[0] == 4:
        return str(ipaddress.IPv4Address(packed[1:]))
    return str(ipaddress.IPv6Address(packed[1:]))
