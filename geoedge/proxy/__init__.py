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

from geoedge.proxy.encode import (
    Endpoint,
    encode_ssl_tlv,
    encode_v1,
    encode_v2,
    encode_v2_local,
)
from geoedge.proxy.header import (
    AWS_SUBTYPE_VPCE_ID,
    MAX_UNIQUE_ID_BYTES,
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
    SslClient,
    SslInfo,
    SslSubtype,
    TlvType,
    decode_ssl_tlv,
)
from geoedge.proxy.parse import (
    ProxyHeaderParser,
    looks_like_proxy_header,
    parse_proxy_header,
)

__all__ = [
    "AWS_SUBTYPE_VPCE_ID",
    "MAX_UNIQUE_ID_BYTES",
    "V1_MAX_LINE_BYTES",
    "V1_SIGNATURE",
    "V2_HEADER_BYTES",
    "V2_MAX_BYTES_LIMIT",
    "V2_SIGNATURE",
    "Endpoint",
    "ProxyCommand",
    "ProxyErrorReason",
    "ProxyFamily",
    "ProxyHeader",
    "ProxyHeaderParser",
    "ProxyProtocolError",
    "ProxyTransport",
    "SslClient",
    "SslInfo",
    "SslSubtype",
    "TlvType",
    "decode_ssl_tlv",
    "encode_ssl_tlv",
    "encode_v1",
    "encode_v2",
    "encode_v2_local",
    "looks_like_proxy_header",
    "parse_proxy_header",
]
