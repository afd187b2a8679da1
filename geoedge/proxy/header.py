"""PROXY protocol types, constants and errors (see :mod:`geoedge.proxy`)."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass

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


# --- the TLV vector (spec §2.2), read by the parser, the encoder and ProxyHeader.ssl

_BAD_TLV = ProxyErrorReason.V2_BAD_TLV


def iter_tlvs(buf: bytes | bytearray, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(type, value offset, value length) of each TLV in buf[start:end], which they must fill."""
    pos = start
    while pos < end:
        if end - pos < _TLV_HEAD.size:
            raise ProxyProtocolError(
                ProxyErrorReason.V2_BAD_TLV, f"{end - pos} stray octets after the TLVs"
            )
        kind, size = _TLV_HEAD.unpack_from(buf, pos)
        pos += _TLV_HEAD.size
        if pos + size > end:
            raise ProxyProtocolError(
                ProxyErrorReason.V2_BAD_TLV, f"TLV 0x{kind:02x} of {size} octets overruns its block"
            )
        yield kind, pos, size
        pos += size


def check_tlv_value(kind: int, value: bytes) -> None:
    if kind == TlvType.UNIQUE_ID and len(value) > MAX_UNIQUE_ID_BYTES:
        raise ProxyProtocolError(
            ProxyErrorReason.V2_BAD_TLV, f"UNIQUE_ID of {len(value)} octets > 128"
        )
    if kind == TlvType.SSL:
        if len(value) < _SSL_HEAD.size:
            raise ProxyProtocolError(
                ProxyErrorReason.V2_BAD_TLV, f"SSL TLV of {len(value)} octets < 5"
            )
        for _ in iter_tlvs(value, _SSL_HEAD.size, len(value)):
            pass


def decode_ssl_tlv(value: bytes) -> SslInfo:
    """Decode a PP2_TYPE_SSL value (raises :class:`ProxyProtocolError` if malformed)."""
    check_tlv_value(TlvType.SSL, value)
    client, verify = _SSL_HEAD.unpack_from(value, 0)
    text: dict[int, str] = {}
    for kind, pos, size in iter_tlvs(value, _SSL_HEAD.size, len(value)):
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
