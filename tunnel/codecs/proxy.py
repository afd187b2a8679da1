"""PROXY protocol v1 and v2, sans-I/O (HAProxy's ``doc/proxy-protocol.txt``, "the spec").

The edge reads PROXY from a trusted load balancer (an AWS NLB sends v2 with TLV 0xEA, the VPC
endpoint id) to learn the real client address before TLS starts; the origin balancer writes it
to Node.js backends. Both use this one module: bytes in, :class:`ProxyHeader` out, and back.

Receiving: feed the first bytes of a connection to :class:`ProxyHeaderParser` until it returns a
header, then carry on with :attr:`ProxyHeaderParser.remainder` as TLS/HTTP. Only
:class:`ProxyProtocolError` ever leaves the parser, with a :class:`ProxyErrorReason` for logs and
metrics. The parser rejects as early as the bytes allow (spec §2.1: "abort the connection as soon
as possible"): a byte that fits neither signature fails at once, as does a v1 line that no valid
line can start with, or a v2 version/command/family byte that is wrong. It never holds more than
``max(107, max_v2_bytes)`` octets before deciding.

Strictness, per the spec: v1 is one line of at most 107 octets ending in CRLF (no lone CR/LF),
single spaces, ``TCP4``/``TCP6``/``UNKNOWN``, IPv4 as four decimal numbers without leading zeros,
ports as 1-5 ASCII digits without leading zeros, all parsed by hand: ``int()`` would take ``+5``,
``1_0`` or Arabic-Indic digits. v2: signature, version 2, command LOCAL/PROXY, a known
family/transport byte, an address block that fits the declared length, TLVs that fit it exactly,
and a PP2_TYPE_CRC32C, when present, that matches.

Choices the spec leaves open:

- v1 ``UNKNOWN`` parses as command LOCAL, family UNSPEC: either way the receiver uses the real
  connection endpoints.
- LOCAL (and PROXY with family UNSPEC) yield no addresses (spec §2.2: "discard the protocol
  block"), but the TLVs after the block are still walked and a CRC32C still checked.
- TLV text (AUTHORITY, SSL strings, the AWS VPCE id) is decoded on access with
  ``errors="replace"``; the exact bytes stay in :attr:`ProxyHeader.tlvs`.
- Encoding an IPv4 and an IPv6 endpoint sends TCP6 with the IPv4 one mapped (``::ffff:a.b.c.d``);
  two IPv4 or IPv4-mapped endpoints (a dual-stack listener) send TCP4, so the backend sees
  ``203.0.113.7``, not ``::ffff:203.0.113.7``.
- AF_UNIX addresses are reported as ``(path, 0)``; encoding them is not supported (no user).
- CRC32C comes from ``google-crc32c`` (Google's C library, Apache-2.0, kept by googleapis, with
  its own fallback) rather than a table in Python: well kept and ~100x faster.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import google_crc32c

V1_SIGNATURE = b"PROXY "
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
#: Spec §2.1: the worst case, "PROXY UNKNOWN <ipv6> <ipv6> 65535 65535\r\n".
V1_MAX_LINE_BYTES = 107
V2_HEADER_BYTES = 16
V2_MAX_BYTES_LIMIT = V2_HEADER_BYTES + 0xFFFF
#: Spec §2.2.5.
MAX_UNIQUE_ID_BYTES = 128
#: AWS NLB: TLV 0xEA whose first value byte is this subtype carries the VPC endpoint id.
AWS_SUBTYPE_VPCE_ID = 0x01

_V2_FIXED = struct.Struct("!BBH")  # ver_cmd, fam, len: at offset 12, after the signature
_INET_ADDRESSES = struct.Struct("!4s4sHH")
_INET6_ADDRESSES = struct.Struct("!16s16sHH")
_UNIX_ADDRESSES = struct.Struct("!108s108s")
_TLV_HEAD = struct.Struct("!BH")
_SSL_HEAD = struct.Struct("!BI")
_CRC32C = struct.Struct("!I")
_HEXTETS = struct.Struct("!8H")
_V4_MAPPED_PREFIX = b"\x00" * 10 + b"\xff\xff"


class ProxyCommand(enum.IntEnum):
    LOCAL = 0x0
    PROXY = 0x1


class ProxyFamily(enum.IntEnum):
    UNSPEC = 0x0
    INET = 0x1
    INET6 = 0x2
    UNIX = 0x3


class ProxyTransport(enum.IntEnum):
    UNSPEC = 0x0
    STREAM = 0x1
    DGRAM = 0x2


class TlvType(enum.IntEnum):
    """Spec §2.2, plus the AWS type in the custom range (0xE0-0xEF)."""

    ALPN = 0x01
    AUTHORITY = 0x02
    CRC32C = 0x03
    NOOP = 0x04
    UNIQUE_ID = 0x05
    SSL = 0x20
    NETNS = 0x30
    AWS = 0xEA


class SslSubtype(enum.IntEnum):
    """Sub-TLVs of PP2_TYPE_SSL (spec §2.2.6)."""

    VERSION = 0x21
    CN = 0x22
    CIPHER = 0x23
    SIG_ALG = 0x24
    KEY_ALG = 0x25


class SslClient(enum.IntFlag):
    SSL = 0x01
    CERT_CONN = 0x02
    CERT_SESS = 0x04


class ProxyErrorReason(enum.StrEnum):
    """Why a header was refused; the value is a stable label for logs and metrics."""

    NOT_PROXY = "not_proxy"
    VERSION_DISABLED = "version_disabled"
    V1_TOO_LONG = "v1_too_long"
    V1_BAD_LINE_ENDING = "v1_bad_line_ending"
    V1_BAD_PROTOCOL = "v1_bad_protocol"
    V1_BAD_CHARACTER = "v1_bad_character"
    V1_BAD_FIELDS = "v1_bad_fields"
    V1_BAD_ADDRESS = "v1_bad_address"
    V1_BAD_PORT = "v1_bad_port"
    V2_BAD_VERSION = "v2_bad_version"
    V2_BAD_COMMAND = "v2_bad_command"
    V2_BAD_FAMILY = "v2_bad_family"
    V2_BAD_ADDRESS_LENGTH = "v2_bad_address_length"
    V2_TOO_LONG = "v2_too_long"
    V2_BAD_TLV = "v2_bad_tlv"
    V2_BAD_CRC32C = "v2_bad_crc32c"


class ProxyProtocolError(Exception):
    """The peer sent something that is not a valid PROXY header: close the connection."""

    def __init__(self, reason: ProxyErrorReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SslInfo:
    """PP2_TYPE_SSL decoded (spec §2.2.6). ``verify == 0`` means a client certificate verified."""

    client: SslClient
    verify: int
    version: str | None = None
    cipher: str | None = None
    common_name: str | None = None
    sig_alg: str | None = None
    key_alg: str | None = None


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """One parsed header. ``source``/``destination`` are None when the receiver must use the
    real connection endpoints (LOCAL, v1 UNKNOWN, family UNSPEC)."""

    version: int
    command: ProxyCommand
    family: ProxyFamily
    protocol: ProxyTransport
    source: tuple[str, int] | None
    destination: tuple[str, int] | None
    tlvs: tuple[tuple[int, bytes], ...] = ()

    def tlv(self, kind: int) -> bytes | None:
        """The value of the first TLV of this type, if any."""
        for tlv_type, value in self.tlvs:
            if tlv_type == kind:
                return value
        return None

    @property
    def alpn(self) -> bytes | None:
        return self.tlv(TlvType.ALPN)

    @property
    def authority(self) -> str | None:
        """The client's SNI (or other authority), UTF-8 on the wire."""
        value = self.tlv(TlvType.AUTHORITY)
        return None if value is None else value.decode("utf-8", "replace")

    @property
    def unique_id(self) -> bytes | None:
        return self.tlv(TlvType.UNIQUE_ID)

    @property
    def netns(self) -> str | None:
        value = self.tlv(TlvType.NETNS)
        return None if value is None else value.decode("ascii", "replace")

    @property
    def ssl(self) -> SslInfo | None:
        value = self.tlv(TlvType.SSL)
        return None if value is None else decode_ssl_tlv(value)

    @property
    def aws_vpce_id(self) -> str | None:
        """The VPC endpoint id an AWS NLB puts in TLV 0xEA, subtype 0x01."""
        for tlv_type, value in self.tlvs:
            if tlv_type == TlvType.AWS and value[:1] == b"\x01":
                return value[1:].decode("ascii", "replace")
        return None


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
        tail = b""
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
        family, parse_host = ProxyFamily.INET, _parse_ipv4_text
    elif protocol == b"TCP6":
        family, parse_host = ProxyFamily.INET6, _parse_ipv6_text
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


def _parse_ipv4_text(text: bytes) -> str:
    octets = text.split(b".")
    if len(octets) == 4:
        values = [_ascii_number(octet, 3) for octet in octets]
        if all(value is not None and value <= 255 for value in values):
            return text.decode("ascii")
    raise _fail(ProxyErrorReason.V1_BAD_ADDRESS, f"bad v1 IPv4 address {text!r}")


def _parse_ipv6_text(text: bytes) -> str:
    if len(text) <= _MAX_IPV6_TEXT and not text.translate(None, _IPV6_CHARS):
        try:
            return _ipv6_text(ipaddress.IPv6Address(text.decode("ascii")).packed)
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
        return (_ipv4_text(src), src_port), (_ipv4_text(dst), dst_port)
    if family is ProxyFamily.INET6:
        src, dst, src_port, dst_port = _INET6_ADDRESSES.unpack_from(buf, V2_HEADER_BYTES)
        return (_ipv6_text(src), src_port), (_ipv6_text(dst), dst_port)
    src, dst = _UNIX_ADDRESSES.unpack_from(buf, V2_HEADER_BYTES)
    return (_unix_path(src), 0), (_unix_path(dst), 0)


def _ipv4_text(packed: bytes) -> str:
    return f"{packed[0]}.{packed[1]}.{packed[2]}.{packed[3]}"


def _ipv6_text(packed: bytes) -> str:
    """RFC 5952 text as :mod:`ipaddress` writes it, but 2.5x faster (``str(IPv6Address)``
    costs 4.5 us, twice per header); IPv4-mapped in mixed notation (RFC 5952 §5, as Python 3.13
    does), so one address has one text whatever the Python or the PROXY version."""
    if packed[:12] == _V4_MAPPED_PREFIX:
        return "::ffff:" + _ipv4_text(packed[12:])
    hextets = _HEXTETS.unpack(packed)
    best_start, best_len, run_start = -1, 1, -1
    for index, hextet in enumerate(hextets):
        if hextet:
            run_start = -1
            continue
        if run_start < 0:
            run_start = index
        if index - run_start + 1 > best_len:
            best_start, best_len = run_start, index - run_start + 1
    text = [f"{hextet:x}" for hextet in hextets]
    if best_start < 0:
        return ":".join(text)
    return ":".join(text[:best_start]) + "::" + ":".join(text[best_start + best_len :])


def _unix_path(raw: bytes) -> str:
    """A NUL-padded sun_path; abstract names (leading NUL) keep it, as Linux shows them."""
    path = b"\x00" + raw[1:].rstrip(b"\x00") if raw[:1] == b"\x00" else raw.split(b"\x00", 1)[0]
    return path.decode("utf-8", "surrogateescape")


def _iter_tlvs(buf: bytes | bytearray, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(type, value offset, value length) of each TLV in buf[start:end], which they must fill."""
    pos = start
    while pos < end:
        if end - pos < _TLV_HEAD.size:
            raise _fail(ProxyErrorReason.V2_BAD_TLV, f"{end - pos} stray octets after the TLVs")
        kind, size = _TLV_HEAD.unpack_from(buf, pos)
        pos += _TLV_HEAD.size
        if pos + size > end:
            raise _fail(
                ProxyErrorReason.V2_BAD_TLV, f"TLV 0x{kind:02x} of {size} octets overruns its block"
            )
        yield kind, pos, size
        pos += size


def _decode_tlvs(buf: bytes | bytearray, start: int, end: int) -> tuple[tuple[int, bytes], ...]:
    tlvs = []
    crc_offset = -1
    for kind, pos, size in _iter_tlvs(buf, start, end):
        value = bytes(buf[pos : pos + size])
        if kind == TlvType.CRC32C:
            if size != 4 or crc_offset >= 0:
                raise _fail(ProxyErrorReason.V2_BAD_TLV, "CRC32C TLV must be one, of 4 octets")
            crc_offset = pos
        else:
            _check_tlv_value(kind, value)
        tlvs.append((kind, value))
    if crc_offset >= 0:
        _verify_crc32c(buf, end, crc_offset)
    return tuple(tlvs)


def _check_tlv_value(kind: int, value: bytes) -> None:
    if kind == TlvType.UNIQUE_ID and len(value) > MAX_UNIQUE_ID_BYTES:
        raise _fail(ProxyErrorReason.V2_BAD_TLV, f"UNIQUE_ID of {len(value)} octets > 128")
    if kind == TlvType.SSL:
        if len(value) < _SSL_HEAD.size:
            raise _fail(ProxyErrorReason.V2_BAD_TLV, f"SSL TLV of {len(value)} octets < 5")
        for _ in _iter_tlvs(value, _SSL_HEAD.size, len(value)):
            pass


def _verify_crc32c(buf: bytes | bytearray, end: int, offset: int) -> None:
    """Spec §2.2.3: the CRC32C of the whole header with the checksum field zeroed."""
    (expected,) = _CRC32C.unpack_from(buf, offset)
    zeroed = bytes(buf[:offset]) + b"\x00\x00\x00\x00" + bytes(buf[offset + 4 : end])
    actual = google_crc32c.value(zeroed)
    if actual != expected:
        raise _fail(
            ProxyErrorReason.V2_BAD_CRC32C, f"CRC32C 0x{expected:08x}, computed 0x{actual:08x}"
        )


def decode_ssl_tlv(value: bytes) -> SslInfo:
    """Decode a PP2_TYPE_SSL value (raises :class:`ProxyProtocolError` if malformed)."""
    _check_tlv_value(TlvType.SSL, value)
    client, verify = _SSL_HEAD.unpack_from(value, 0)
    text: dict[int, str] = {}
    for kind, pos, size in _iter_tlvs(value, _SSL_HEAD.size, len(value)):
        text.setdefault(kind, value[pos : pos + size].decode("utf-8", "replace"))
    return SslInfo(
        client=SslClient(client),
        verify=verify,
        version=text.get(SslSubtype.VERSION),
        cipher=text.get(SslSubtype.CIPHER),
        common_name=text.get(SslSubtype.CN),
        sig_alg=text.get(SslSubtype.SIG_ALG),
        key_alg=text.get(SslSubtype.KEY_ALG),
    )


# --- sending -----------------------------------------------------------------------------------

#: (host, port), or a 4-tuple (host, port, flowinfo, scope_id) as IPv6 sockets report it.
Endpoint = tuple[str, int] | tuple[str, int, int, int]
_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def encode_v1(source: Endpoint | None, destination: Endpoint | None) -> bytes:
    """``PROXY TCP4 ...``/``TCP6 ...``, or ``PROXY UNKNOWN`` when both endpoints are None."""
    pair = _endpoints(source, destination)
    if pair is None:
        return b"PROXY UNKNOWN\r\n"
    family, src, dst, src_port, dst_port = pair
    if family is ProxyFamily.INET:
        protocol, src_text, dst_text = "TCP4", str(src), str(dst)
    else:
        protocol, src_text, dst_text = "TCP6", _ipv6_text(src.packed), _ipv6_text(dst.packed)
    return f"PROXY {protocol} {src_text} {dst_text} {src_port} {dst_port}\r\n".encode("ascii")


def encode_v2(
    source: Endpoint | None,
    destination: Endpoint | None,
    *,
    tlvs: Iterable[tuple[int, bytes]] = (),
    command: ProxyCommand = ProxyCommand.PROXY,
    transport: ProxyTransport = ProxyTransport.STREAM,
    crc32c: bool = False,
) -> bytes:
    """A v2 header; family UNSPEC when both endpoints are None. ``crc32c`` appends a checksum
    TLV (last, as the receiver zeroes it in place). Bad arguments raise :class:`ValueError`."""
    command = ProxyCommand(command)
    transport = ProxyTransport(transport)
    pair = _endpoints(source, destination)
    if pair is None:
        family_byte, addresses = 0x00, b""
    else:
        if transport is ProxyTransport.UNSPEC:
            raise ValueError("addresses need transport STREAM or DGRAM")
        family, src, dst, src_port, dst_port = pair
        layout = _INET_ADDRESSES if family is ProxyFamily.INET else _INET6_ADDRESSES
        family_byte = family << 4 | transport
        addresses = layout.pack(src.packed, dst.packed, src_port, dst_port)
    body = addresses + _encode_tlvs(tlvs)
    if crc32c:
        body += _TLV_HEAD.pack(TlvType.CRC32C, 4) + b"\x00\x00\x00\x00"
    if len(body) > 0xFFFF:
        raise ValueError(f"v2 header body of {len(body)} octets > 65535")
    header = V2_SIGNATURE + _V2_FIXED.pack(0x20 | command, family_byte, len(body)) + body
    if crc32c:
        header = header[:-4] + _CRC32C.pack(google_crc32c.value(header))
    return header


def encode_v2_local(*, tlvs: Iterable[tuple[int, bytes]] = (), crc32c: bool = False) -> bytes:
    """LOCAL, family UNSPEC: "this connection is mine" (health checks)."""
    return encode_v2(None, None, tlvs=tlvs, command=ProxyCommand.LOCAL, crc32c=crc32c)


def encode_ssl_tlv(
    *,
    client: SslClient = SslClient.SSL,
    verify: int = 0,
    version: str | None = None,
    cipher: str | None = None,
    common_name: str | None = None,
    sig_alg: str | None = None,
    key_alg: str | None = None,
) -> tuple[int, bytes]:
    """A PP2_TYPE_SSL TLV for :func:`encode_v2`'s ``tlvs`` (spec §2.2.6)."""
    subs = (
        (SslSubtype.VERSION, version),
        (SslSubtype.CIPHER, cipher),
        (SslSubtype.CN, common_name),
        (SslSubtype.SIG_ALG, sig_alg),
        (SslSubtype.KEY_ALG, key_alg),
    )
    value = _SSL_HEAD.pack(SslClient(client), verify) + _encode_tlvs(
        (kind, text.encode("utf-8")) for kind, text in subs if text is not None
    )
    return TlvType.SSL, value


def _encode_tlvs(tlvs: Iterable[tuple[int, bytes]]) -> bytes:
    parts = []
    for kind, raw in tlvs:
        value = bytes(raw)
        if not 0 <= kind <= 0xFF or len(value) > 0xFFFF:
            raise ValueError(f"TLV 0x{kind:x} of {len(value)} octets does not fit")
        if kind == TlvType.CRC32C:
            raise ValueError("pass crc32c=True instead of a CRC32C TLV")
        try:
            _check_tlv_value(kind, value)
        except ProxyProtocolError as exc:
            raise ValueError(str(exc)) from None
        parts.append(_TLV_HEAD.pack(kind, len(value)) + value)
    return b"".join(parts)


def _endpoints(
    source: Endpoint | None, destination: Endpoint | None
) -> tuple[ProxyFamily, _IPAddress, _IPAddress, int, int] | None:
    """Both endpoints in one family: IPv4 when both are (or map) IPv4, else IPv6."""
    if source is None and destination is None:
        return None
    if source is None or destination is None:
        raise ValueError("give both source and destination, or neither")
    src, src_port = _endpoint(source, "source")
    dst, dst_port = _endpoint(destination, "destination")
    if src.version == 4 and dst.version == 4:
        return ProxyFamily.INET, src, dst, src_port, dst_port
    return ProxyFamily.INET6, _as_ipv6(src), _as_ipv6(dst), src_port, dst_port


def _endpoint(endpoint: Endpoint, what: str) -> tuple[_IPAddress, int]:
    if not isinstance(endpoint, tuple) or len(endpoint) not in (2, 4):
        raise ValueError(f"{what} must be (host, port), got {endpoint!r}")
    host, port = endpoint[0], endpoint[1]
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 0xFFFF:
        raise ValueError(f"{what} port must be an int in 0..65535, got {port!r}")
    if isinstance(host, ipaddress.IPv4Address | ipaddress.IPv6Address):
        ip: _IPAddress = host
    elif isinstance(host, str):
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{what} host {host!r} is not an IP address") from None
    else:
        raise ValueError(f"{what} host must be an IP address string, got {host!r}")
    if ip.version == 6:
        mapped = ip.ipv4_mapped
        ip = mapped if mapped is not None else ipaddress.IPv6Address(ip.packed)  # drops %scope
    return ip, port


def _as_ipv6(ip: _IPAddress) -> ipaddress.IPv6Address:
    return ip if ip.version == 6 else ipaddress.IPv6Address(_V4_MAPPED_PREFIX + ip.packed)
