"""Sending PROXY headers: v1 and v2 encoders (see :mod:`geoedge.proxy`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import google_crc32c

from geoedge.proxy.address import V4_MAPPED_PREFIX, ipv6_text
from geoedge.proxy.header import (
    _CRC32C,
    _INET6_ADDRESSES,
    _INET_ADDRESSES,
    _SSL_HEAD,
    _TLV_HEAD,
    _V2_FIXED,
    V2_SIGNATURE,
    ProxyCommand,
    ProxyFamily,
    ProxyProtocolError,
    ProxyTransport,
    SslClient,
    SslSubtype,
    TlvType,
    check_tlv_value,
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
        protocol, src_text, dst_text = "TCP6", ipv6_text(src.packed), ipv6_text(dst.packed)
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
            check_tlv_value(kind, value)
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
    return ip if ip.version == 6 else ipaddress.IPv6Address(V4_MAPPED_PREFIX + ip.packed)
