"""Receiving PROXY headers: the incremental parser (see :mod:`geoedge.proxy`)."""

from __future__ import annotations

import ipaddress

import google_crc32c

from geoedge.proxy.address import ipv4_text, ipv6_text
from geoedge.proxy.header import (
    _CRC32C,
    _INET6_ADDRESSES,
    _INET_ADDRESSES,
    _UNIX_ADDRESSES,
    _V2_FIXED,
    V1_MAX_LINE_BYTES,
    V1_SIGNATURE,
    V2_HEADER_BYTES,
    V2_MAX_BYTES_LIMIT,
    V2_SIGNATURE,
    ProxyCommand,
    ProxyErrorReason,
    ProxyFamily,
    ProxyHeader,
    ProxyProtocolError,
    ProxyTransport,
    TlvType,
    check_tlv_value,
    iter_tlvs,
)

# --- receiving ---------------------------------------------------------------------------------


def looks_like_proxy_header(prefix: bytes) -> bool | None:
    """True if ``prefix`` starts with a v1 or v2 signature, False if it cannot, None if it is
    too short to tell. For logging only: the spec forbids guessing whether a header is there."""
    for signature in (V1_SIGNATURE, V2_SIGNATURE):
        size = min(len(prefix), len(signature))
        if prefix[:size] == signature[:size]:
            return True if size == len(signature) else None
    return False


def parse_proxy_header(
    data: bytes | bytearray,
    *,
    accept_v1: bool = True,
    accept_v2: bool = True,
    max_v2_bytes: int = 4096,
) -> tuple[ProxyHeader, int] | None:
    """Parse a header from the start of ``data``: (header, its length), or None if incomplete.

    Raises :class:`ProxyProtocolError` as soon as ``data`` cannot start a valid header."""
    _check_limits(accept_v1, accept_v2, max_v2_bytes)
    return _parse(data, accept_v1, accept_v2, max_v2_bytes)


class ProxyHeaderParser:
    """Incremental: :meth:`feed` bytes until the header is complete.

    Once :meth:`feed` has returned a header, :attr:`remainder` holds the bytes that followed it
    (the start of TLS/HTTP). After an error the parser is dead and re-raises it. Feeding after
    success is a bug of the caller (:class:`RuntimeError`): the remainder is theirs by then."""

    __slots__ = (
        "_accept_v1",
        "_accept_v2",
        "_buffer",
        "_error",
        "_header",
        "_limit",
        "_max_v2",
        "_rest",
    )

    def __init__(
        self, *, accept_v1: bool = True, accept_v2: bool = True, max_v2_bytes: int = 4096
    ) -> None:
        _check_limits(accept_v1, accept_v2, max_v2_bytes)
        self._accept_v1 = accept_v1
        self._accept_v2 = accept_v2
        self._max_v2 = max_v2_bytes
        self._limit = max(V1_MAX_LINE_BYTES, max_v2_bytes)
        self._buffer = bytearray()
        self._header: ProxyHeader | None = None
        self._error: ProxyProtocolError | None = None
        self._rest = b""

    def feed(self, data: bytes | bytearray) -> ProxyHeader | None:
        """Add bytes; the header once complete, None while more are needed."""
        if self._header is not None:
            raise RuntimeError("PROXY header already parsed; use .remainder")
        if self._error is not None:
            raise self._error
        if not isinstance(data, bytes | bytearray):
            data = bytes(data)
        tail: bytes | bytearray = b""
        if self._buffer:
            # Copy no more than can still belong to the header: past the limit it is decided.
            room = self._limit - len(self._buffer)
            self._buffer += data[:room]
            buf: bytes | bytearray = self._buffer
            tail = data[room:]
        else:
            buf = data  # common case: the whole header in the first read, parsed without a copy
        try:
            result = _parse(buf, self._accept_v1, self._accept_v2, self._max_v2)
        except ProxyProtocolError as exc:
            self._error = exc
            self._buffer = bytearray()
            raise
        if result is None:
            if buf is data:
                self._buffer = bytearray(data)
            return None
        self._header, size = result
        self._rest = bytes(buf[size:]) + tail
        self._buffer = bytearray()
        return self._header

    @property
    def header(self) -> ProxyHeader | None:
        return self._header

    @property
    def remainder(self) -> bytes:
        """Bytes after the header (empty until the header is complete)."""
        return self._rest

    @property
    def buffered_bytes(self) -> int:
        """Octets held while waiting for the rest of the header."""
        return len(self._buffer)


def _check_limits(accept_v1: bool, accept_v2: bool, max_v2_bytes: int) -> None:
    if not (accept_v1 or accept_v2):
        raise ValueError("accept_v1 and accept_v2 are both false: every connection would fail")
    if not V2_HEADER_BYTES <= max_v2_bytes <= V2_MAX_BYTES_LIMIT:
        raise ValueError(
            f"max_v2_bytes must be in {V2_HEADER_BYTES}..{V2_MAX_BYTES_LIMIT}, got {max_v2_bytes}"
        )


def _fail(reason: ProxyErrorReason, message: str) -> ProxyProtocolError:
    return ProxyProtocolError(reason, message)


def _parse(
    buf: bytes | bytearray, accept_v1: bool, accept_v2: bool, max_v2_bytes: int
) -> tuple[ProxyHeader, int] | None:
    if not buf:
        return None
    first = buf[0]
    if first == 0x50:  # "P"
        signature, enabled, version = V1_SIGNATURE, accept_v1, 1
    elif first == 0x0D:  # "\r"
        signature, enabled, version = V2_SIGNATURE, accept_v2, 2
    else:
        raise _fail(ProxyErrorReason.NOT_PROXY, f"first octet 0x{first:02x} starts no PROXY header")
    size = min(len(buf), len(signature))
    if buf[:size] != signature[:size]:
        raise _fail(ProxyErrorReason.NOT_PROXY, f"octets {bytes(buf[:size])!r} match no signature")
    if not enabled:
        if size < len(signature):
            raise _fail(ProxyErrorReason.NOT_PROXY, f"PROXY v{version} is not accepted here")
        raise _fail(ProxyErrorReason.VERSION_DISABLED, f"PROXY v{version} is not accepted here")
    if size < len(signature):
        return None
    return _parse_v1(buf) if version == 1 else _parse_v2(buf, max_v2_bytes)


# v1 (spec §2.1) -------------------------------------------------------------------------------

_DIGITS = b"0123456789"
_TCP4_CHARS = _DIGITS + b". "
_IPV6_CHARS = _DIGITS + b"abcdefABCDEF:."  # "." for IPv4-mapped, as inet_ntop writes them
_TCP6_CHARS = _IPV6_CHARS + b" "
_V1_PROTOCOLS = (b"TCP4 ", b"TCP6 ", b"UNKNOWN ")
_MAX_IPV6_TEXT = 45  # "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"


def _parse_v1(buf: bytes | bytearray) -> tuple[ProxyHeader, int] | None:
    end = buf.find(b"\r\n", 0, V1_MAX_LINE_BYTES)
    if end < 0:
        head = buf[len(V1_SIGNATURE) : V1_MAX_LINE_BYTES]
        if b"\n" in head or b"\r" in head[:-1]:
            raise _fail(ProxyErrorReason.V1_BAD_LINE_ENDING, "v1 line has a lone CR or LF")
        _check_v1_prefix(head[:-1] if head.endswith(b"\r") else head)
        if len(buf) >= V1_MAX_LINE_BYTES:
            raise _fail(ProxyErrorReason.V1_TOO_LONG, "no CRLF in the first 107 octets")
        return None
    line = bytes(buf[len(V1_SIGNATURE) : end])
    if b"\r" in line or b"\n" in line:
        raise _fail(ProxyErrorReason.V1_BAD_LINE_ENDING, "v1 line has a lone CR or LF")
    _check_v1_prefix(line)
    return _decode_v1_line(line), end + 2


def _check_v1_prefix(rest: bytes | bytearray) -> None:
    """Refuse ``rest`` (the line after "PROXY ", no CR/LF) if no valid line starts with it."""
    for protocol in _V1_PROTOCOLS:
        size = min(len(rest), len(protocol))
        if rest[:size] == protocol[:size]:
            break
    else:
        raise _fail(ProxyErrorReason.V1_BAD_PROTOCOL, f"v1 protocol {bytes(rest[:8])!r} unknown")
    if len(rest) <= 5 or rest[0] != 0x54:  # "T": UNKNOWN ignores the rest of its line
        return
    fields = rest[5:]
    if fields.translate(None, _TCP4_CHARS if rest[3] == 0x34 else _TCP6_CHARS):
        raise _fail(ProxyErrorReason.V1_BAD_CHARACTER, f"v1 fields {bytes(fields)!r}")
    if fields[:1] == b" " or b"  " in fields or fields.count(b" ") > 3:
        raise _fail(ProxyErrorReason.V1_BAD_FIELDS, "v1 fields need exactly one space between")


def _decode_v1_line(line: bytes) -> ProxyHeader:
    if line == b"UNKNOWN" or line.startswith(b"UNKNOWN "):
        return ProxyHeader(
            1, ProxyCommand.LOCAL, ProxyFamily.UNSPEC, ProxyTransport.UNSPEC, None, None
        )
    protocol, _, rest = line.partition(b" ")
    if protocol == b"TCP4":
        family, parse_host = ProxyFamily.INET, _parseipv4_text
    elif protocol == b"TCP6":
        family, parse_host = ProxyFamily.INET6, _parseipv6_text
    else:
        raise _fail(ProxyErrorReason.V1_BAD_PROTOCOL, f"v1 protocol {protocol!r} unknown")
    fields = rest.split(b" ")
    if len(fields) != 4:
        raise _fail(ProxyErrorReason.V1_BAD_FIELDS, f"v1 {protocol.decode()} needs 4 fields")
    source = (parse_host(fields[0]), _parse_port(fields[2]))
    destination = (parse_host(fields[1]), _parse_port(fields[3]))
    return ProxyHeader(1, ProxyCommand.PROXY, family, ProxyTransport.STREAM, source, destination)


def _ascii_number(text: bytes, max_digits: int) -> int | None:
    """Decimal ASCII digits without a leading zero (spec §2.1), by hand: int() is too lenient."""
    if not 0 < len(text) <= max_digits or text.translate(None, _DIGITS):
        return None
    if len(text) > 1 and text[0] == 0x30:
        return None
    value = 0
    for digit in text:
        value = value * 10 + digit - 0x30
    return value


def _parseipv4_text(text: bytes) -> str:
    octets = text.split(b".")
    if len(octets) == 4:
        values = [_ascii_number(octet, 3) for octet in octets]
        if all(value is not None and value <= 255 for value in values):
            return text.decode("ascii")
    raise _fail(ProxyErrorReason.V1_BAD_ADDRESS, f"bad v1 IPv4 address {text!r}")


def _parseipv6_text(text: bytes) -> str:
    if len(text) <= _MAX_IPV6_TEXT and not text.translate(None, _IPV6_CHARS):
        try:
            return ipv6_text(ipaddress.IPv6Address(text.decode("ascii")).packed)
        except ValueError:
            pass
    raise _fail(ProxyErrorReason.V1_BAD_ADDRESS, f"bad v1 IPv6 address {text!r}")


def _parse_port(text: bytes) -> int:
    port = _ascii_number(text, 5)
    if port is None or port > 0xFFFF:
        raise _fail(ProxyErrorReason.V1_BAD_PORT, f"bad v1 port {text!r}")
    return port


# v2 (spec §2.2) -------------------------------------------------------------------------------

_COMMANDS = tuple(ProxyCommand)
_FAMILIES = tuple(ProxyFamily)
_TRANSPORTS = tuple(ProxyTransport)
_ADDRESS_BYTES = (0, _INET_ADDRESSES.size, _INET6_ADDRESSES.size, _UNIX_ADDRESSES.size)
#: Spec §2.2 "in practice, the following protocol bytes are expected": all a PROXY may carry.
_PROXY_FAMILY_BYTES = frozenset((0x00, 0x11, 0x12, 0x21, 0x22, 0x31, 0x32))


def _parse_v2(buf: bytes | bytearray, max_bytes: int) -> tuple[ProxyHeader, int] | None:
    if len(buf) > 12:
        ver_cmd = buf[12]
        if ver_cmd >> 4 != 2:
            raise _fail(ProxyErrorReason.V2_BAD_VERSION, f"v2 version nibble {ver_cmd >> 4}")
        if ver_cmd & 0xF > ProxyCommand.PROXY:
            raise _fail(ProxyErrorReason.V2_BAD_COMMAND, f"v2 command {ver_cmd & 0xF}")
        if len(buf) > 13:
            _check_v2_family(ver_cmd & 0xF, buf[13])
    if len(buf) < V2_HEADER_BYTES:
        return None
    ver_cmd, family_byte, length = _V2_FIXED.unpack_from(buf, 12)
    total = V2_HEADER_BYTES + length
    if total > max_bytes:
        raise _fail(ProxyErrorReason.V2_TOO_LONG, f"v2 header of {total} octets > {max_bytes}")
    if len(buf) < total:
        return None
    command = _COMMANDS[ver_cmd & 0xF]
    family = _FAMILIES[family_byte >> 4]
    addresses_end = V2_HEADER_BYTES + _ADDRESS_BYTES[family]
    if addresses_end > total:
        raise _fail(
            ProxyErrorReason.V2_BAD_ADDRESS_LENGTH,
            f"v2 length {length} < {addresses_end - V2_HEADER_BYTES} for {family.name}",
        )
    source = destination = None
    if command is ProxyCommand.PROXY and family is not ProxyFamily.UNSPEC:
        source, destination = _decode_v2_addresses(buf, family)
    tlvs = _decode_tlvs(buf, addresses_end, total) if addresses_end < total else ()
    header = ProxyHeader(
        2, command, family, _TRANSPORTS[family_byte & 0xF], source, destination, tlvs
    )
    return header, total


def _check_v2_family(command: int, family_byte: int) -> None:
    if (
        family_byte >> 4 > ProxyFamily.UNIX
        or family_byte & 0xF > ProxyTransport.DGRAM
        or (command == ProxyCommand.PROXY and family_byte not in _PROXY_FAMILY_BYTES)
    ):
        raise _fail(ProxyErrorReason.V2_BAD_FAMILY, f"v2 family/protocol 0x{family_byte:02x}")


def _decode_v2_addresses(
    buf: bytes | bytearray, family: ProxyFamily
) -> tuple[tuple[str, int], tuple[str, int]]:
    if family is ProxyFamily.INET:
        src, dst, src_port, dst_port = _INET_ADDRESSES.unpack_from(buf, V2_HEADER_BYTES)
        return (ipv4_text(src), src_port), (ipv4_text(dst), dst_port)
    if family is ProxyFamily.INET6:
        src, dst, src_port, dst_port = _INET6_ADDRESSES.unpack_from(buf, V2_HEADER_BYTES)
        return (ipv6_text(src), src_port), (ipv6_text(dst), dst_port)
    src, dst = _UNIX_ADDRESSES.unpack_from(buf, V2_HEADER_BYTES)
    return (_unix_path(src), 0), (_unix_path(dst), 0)


def _unix_path(raw: bytes) -> str:
    """A NUL-padded sun_path; abstract names (leading NUL) keep it, as Linux shows them."""
    path = b"\x00" + raw[1:].rstrip(b"\x00") if raw[:1] == b"\x00" else raw.split(b"\x00", 1)[0]
    return path.decode("utf-8", "surrogateescape")


def _decode_tlvs(buf: bytes | bytearray, start: int, end: int) -> tuple[tuple[int, bytes], ...]:
    tlvs = []
    crc_offset = -1
    for kind, pos, size in iter_tlvs(buf, start, end):
        value = bytes(buf[pos : pos + size])
        if kind == TlvType.CRC32C:
            if size != 4 or crc_offset >= 0:
                raise _fail(ProxyErrorReason.V2_BAD_TLV, "CRC32C TLV must be one, of 4 octets")
            crc_offset = pos
        else:
            check_tlv_value(kind, value)
        tlvs.append((kind, value))
    if crc_offset >= 0:
        _verify_crc32c(buf, end, crc_offset)
    return tuple(tlvs)


def _verify_crc32c(buf: bytes | bytearray, end: int, offset: int) -> None:
    """Spec §2.2.3: the CRC32C of the whole header with the checksum field zeroed."""
    (expected,) = _CRC32C.unpack_from(buf, offset)
    zeroed = bytes(buf[:offset]) + b"\x00\x00\x00\x00" + bytes(buf[offset + 4 : end])
    actual = google_crc32c.value(zeroed)
    if actual != expected:
        raise _fail(
            ProxyErrorReason.V2_BAD_CRC32C, f"CRC32C 0x{expected:08x}, computed 0x{actual:08x}"
        )
