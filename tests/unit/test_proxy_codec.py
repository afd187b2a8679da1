"""PROXY protocol codec: known vectors from the spec and from AWS NLB, every error reason,
early rejection, the incremental parser's contract and the encoders' argument checks."""

from __future__ import annotations

import ipaddress

import pytest

from geoedge.proxy import (
    V1_MAX_LINE_BYTES,
    V2_SIGNATURE,
    ProxyCommand,
    ProxyErrorReason,
    ProxyFamily,
    ProxyHeader,
    ProxyHeaderParser,
    ProxyProtocolError,
    ProxyTransport,
    SslClient,
    TlvType,
    decode_ssl_tlv,
    encode_ssl_tlv,
    encode_v1,
    encode_v2,
    encode_v2_local,
    looks_like_proxy_header,
    parse_proxy_header,
)

SIG = bytes.fromhex("0d0a0d0a000d0a515549540a")  # spec §2.2, typed from the spec's table


def crc32c_reference(data: bytes) -> int:
    """Bitwise CRC32C (RFC 4960 App. B, reflected polynomial 0x82F63B78): independent of the
    library the codec uses."""
    crc = 0xFFFFFFFF
    for octet in data:
        crc ^= octet
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def v2(ver_cmd: int, fam: int, body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return SIG + bytes([ver_cmd, fam]) + size.to_bytes(2, "big") + body


def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + len(value).to_bytes(2, "big") + value


INET_BLOCK = bytes([192, 0, 2, 1, 198, 51, 100, 2]) + (1234).to_bytes(2, "big") + b"\x01\xbb"


def reject(data: bytes, **options: object) -> ProxyErrorReason:
    with pytest.raises(ProxyProtocolError) as caught:
        parse_proxy_header(data, **options)  # type: ignore[arg-type]
    assert str(caught.value)  # a readable message for the log line
    return caught.value.reason


# --- known-good vectors ------------------------------------------------------------------------


def test_v2_signature_is_the_spec_one() -> None:
    assert V2_SIGNATURE == b"\r\n\r\n\0\r\nQUIT\n" == SIG


def test_spec_v1_example_before_an_http_request() -> None:
    data = b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"
    header, size = parse_proxy_header(data)  # type: ignore[misc]
    assert size == 47
    assert data[size:] == b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    assert header == ProxyHeader(
        1,
        ProxyCommand.PROXY,
        ProxyFamily.INET,
        ProxyTransport.STREAM,
        ("192.168.0.1", 56324),
        ("192.168.0.11", 443),
    )


def test_v1_longest_lines_of_the_spec() -> None:
    six = "ffff:" * 7 + "ffff"
    tcp6 = f"PROXY TCP6 {six} {six} 65535 65535\r\n".encode()
    assert len(tcp6) == 104
    header, _ = parse_proxy_header(tcp6)  # type: ignore[misc]
    assert header.source == (six, 65535)
    worst = f"PROXY UNKNOWN {six} {six} 65535 65535\r\n".encode()
    assert len(worst) == V1_MAX_LINE_BYTES
    header, size = parse_proxy_header(worst)  # type: ignore[misc]
    assert (size, header.command, header.family, header.source) == (
        107,
        ProxyCommand.LOCAL,
        ProxyFamily.UNSPEC,
        None,
    )
    assert reject(worst[:-2] + b"f\r\n") is ProxyErrorReason.V1_TOO_LONG


def test_v1_unknown_short_form_and_port_bounds() -> None:
    header, size = parse_proxy_header(b"PROXY UNKNOWN\r\nrest")  # type: ignore[misc]
    assert size == 15 and header.source is None and header.version == 1
    header, _ = parse_proxy_header(b"PROXY TCP4 0.0.0.0 255.255.255.255 0 65535\r\n")  # type: ignore[misc]
    assert header.source == ("0.0.0.0", 0) and header.destination == ("255.255.255.255", 65535)


def test_v1_tcp6_text_is_normalised() -> None:
    line = b"PROXY TCP6 2001:DB8:0:0:0:0:0:1 ::FFFF:192.0.2.1 1 2\r\n"
    header, _ = parse_proxy_header(line)  # type: ignore[misc]
    assert header.source == ("2001:db8::1", 1)
    assert header.destination == ("::ffff:192.0.2.1", 2)  # RFC 5952 §5 mixed notation


def test_v2_tcp4_vector_matches_the_encoder_octet_for_octet() -> None:
    wire = v2(0x21, 0x11, INET_BLOCK)
    header, size = parse_proxy_header(wire + b"\x16\x03\x01")  # type: ignore[misc]
    assert size == 28
    assert header == ProxyHeader(
        2,
        ProxyCommand.PROXY,
        ProxyFamily.INET,
        ProxyTransport.STREAM,
        ("192.0.2.1", 1234),
        ("198.51.100.2", 443),
    )
    assert encode_v2(("192.0.2.1", 1234), ("198.51.100.2", 443)) == wire


def test_v2_tcp6_and_udp6() -> None:
    src = ipaddress.IPv6Address("2001:db8::1").packed
    dst = ipaddress.IPv6Address("fe80::1:2").packed
    for fam, transport in ((0x21, ProxyTransport.STREAM), (0x22, ProxyTransport.DGRAM)):
        wire = v2(0x21, fam, src + dst + b"\x00\x50\xff\xff")
        header, _ = parse_proxy_header(wire)  # type: ignore[misc]
        assert header.family is ProxyFamily.INET6 and header.protocol is transport
        assert header.source == ("2001:db8::1", 80) and header.destination == ("fe80::1:2", 65535)


def test_aws_nlb_header_with_vpce_tlv() -> None:
    vpce = b"vpce-08d2bf15fac5001c9"
    block = bytes.fromhex("c6336416 0a00010f 9ea2 01bb")  # 198.51.100.22:40610 -> 10.0.1.15:443
    wire = v2(0x21, 0x11, block + tlv(0xEA, b"\x01" + vpce))
    assert wire[14:16] == b"\x00\x26"
    parser = ProxyHeaderParser(accept_v1=False)
    header = parser.feed(wire + b"\x16\x03\x01\x02\x00")
    assert header is not None
    assert header.source == ("198.51.100.22", 40610)
    assert header.destination == ("10.0.1.15", 443)
    assert header.aws_vpce_id == "vpce-08d2bf15fac5001c9"
    assert header.tlvs == ((0xEA, b"\x01" + vpce),)
    assert parser.remainder == b"\x16\x03\x01\x02\x00"


def test_noop_padding_and_unknown_tlvs_are_kept() -> None:
    wire = v2(0x21, 0x11, INET_BLOCK + tlv(TlvType.NOOP, b"\0\0\0") + tlv(0xF0, b"x" * 300))
    header, _ = parse_proxy_header(wire)  # type: ignore[misc]
    assert header.tlvs == ((4, b"\0\0\0"), (0xF0, b"x" * 300))
    assert header.aws_vpce_id is None and header.alpn is None


def test_v2_local_vector() -> None:
    wire = encode_v2_local()
    assert wire == SIG + b"\x20\x00\x00\x00"
    header, size = parse_proxy_header(wire)  # type: ignore[misc]
    assert size == 16
    assert (header.command, header.family, header.source, header.destination) == (
        ProxyCommand.LOCAL,
        ProxyFamily.UNSPEC,
        None,
        None,
    )


def test_local_skips_its_address_block_but_reads_the_tlvs_after_it() -> None:
    wire = v2(0x20, 0x11, INET_BLOCK + tlv(TlvType.UNIQUE_ID, b"abc"))
    header, _ = parse_proxy_header(wire)  # type: ignore[misc]
    assert header.source is None and header.family is ProxyFamily.INET
    assert header.unique_id == b"abc"
    # LOCAL may carry any valid family byte, even one a PROXY may not (0x10)
    header, _ = parse_proxy_header(v2(0x20, 0x10, INET_BLOCK))  # type: ignore[misc]
    assert header.protocol is ProxyTransport.UNSPEC


def test_proxy_with_unspec_family_has_no_addresses() -> None:
    header, _ = parse_proxy_header(v2(0x21, 0x00, tlv(TlvType.ALPN, b"h2")))  # type: ignore[misc]
    assert header.command is ProxyCommand.PROXY and header.source is None
    assert header.alpn == b"h2"


def test_unix_addresses() -> None:
    path = b"/run/geoedge.sock".ljust(108, b"\0")
    abstract = b"\0geoedge".ljust(108, b"\0")
    header, _ = parse_proxy_header(v2(0x21, 0x31, path + abstract))  # type: ignore[misc]
    assert header.family is ProxyFamily.UNIX
    assert header.source == ("/run/geoedge.sock", 0)
    assert header.destination == ("\0geoedge", 0)


def test_crc32c_vector_from_an_independent_implementation() -> None:
    assert crc32c_reference(b"123456789") == 0xE3069283  # RFC 3720 B.4 check value
    body = INET_BLOCK + tlv(TlvType.CRC32C, b"\0\0\0\0")
    zeroed = v2(0x21, 0x11, body)
    wire = zeroed[:-4] + crc32c_reference(zeroed).to_bytes(4, "big")
    assert encode_v2(("192.0.2.1", 1234), ("198.51.100.2", 443), crc32c=True) == wire
    header, _ = parse_proxy_header(wire)  # type: ignore[misc]
    assert header.tlv(TlvType.CRC32C) == wire[-4:]


def test_ssl_tlv_round_trip() -> None:
    kind, value = encode_ssl_tlv(
        client=SslClient.SSL | SslClient.CERT_CONN,
        version="TLSv1.3",
        cipher="TLS_AES_256_GCM_SHA384",
        common_name="client.example",
        sig_alg="ECDSA-SHA256",
        key_alg="EC256",
    )
    wire = encode_v2(
        ("192.0.2.1", 1),
        ("192.0.2.2", 2),
        tlvs=[
            (TlvType.ALPN, b"http/1.1"),
            (TlvType.AUTHORITY, "bücher.example".encode()),
            (kind, value),
            (TlvType.UNIQUE_ID, b"req-7"),
            (TlvType.NETNS, b"blue"),
        ],
    )
    header, _ = parse_proxy_header(wire)  # type: ignore[misc]
    assert header.alpn == b"http/1.1"
    assert header.authority == "bücher.example"
    assert header.unique_id == b"req-7"
    assert header.netns == "blue"
    ssl = header.ssl
    assert ssl is not None
    assert ssl.client == SslClient.SSL | SslClient.CERT_CONN and ssl.verify == 0
    assert (ssl.version, ssl.cipher, ssl.common_name) == (
        "TLSv1.3",
        "TLS_AES_256_GCM_SHA384",
        "client.example",
    )
    assert (ssl.sig_alg, ssl.key_alg) == ("ECDSA-SHA256", "EC256")
    assert value[:5] == b"\x03\x00\x00\x00\x00"  # client flags, then verify = 0
    assert decode_ssl_tlv(b"\x01\x00\x00\x00\x01").version is None


def test_tlv_text_that_is_not_utf8_is_replaced_not_raised() -> None:
    def unspec(*tlvs: tuple[int, bytes]) -> ProxyHeader:
        return ProxyHeader(
            2, ProxyCommand.PROXY, ProxyFamily.UNSPEC, ProxyTransport.UNSPEC, None, None, tlvs
        )

    header = unspec((TlvType.AUTHORITY, b"\xff"), (0xEA, b"\x01\xfe"))
    assert header.authority == "\ufffd" and header.aws_vpce_id == "\ufffd"
    assert unspec((0xEA, b"\x02x")).aws_vpce_id is None
    assert unspec((0xEA, b""), (0xEA, b"\x01vpce-1")).aws_vpce_id == "vpce-1"


# --- every error reason ------------------------------------------------------------------------

SSL_SHORT = tlv(TlvType.SSL, b"\x01\0\0\0")
SSL_OVERRUN = tlv(TlvType.SSL, b"\x01\0\0\0\0" + b"\x21\x00\x09TLS")

CASES: list[tuple[ProxyErrorReason, bytes, dict[str, object]]] = [
    (ProxyErrorReason.NOT_PROXY, b"GET / HTTP/1.1\r\n", {}),
    (ProxyErrorReason.NOT_PROXY, b"\x16\x03\x01\x02\x00\x01", {}),
    (ProxyErrorReason.NOT_PROXY, b"PROXX TCP4", {}),
    (ProxyErrorReason.NOT_PROXY, b"proxy TCP4", {}),
    (ProxyErrorReason.NOT_PROXY, b"\r\n\r\n\0\r\nQUIX", {}),
    (ProxyErrorReason.NOT_PROXY, b"\r\n\r\nGET", {}),
    (ProxyErrorReason.NOT_PROXY, b"PRO", {"accept_v1": False}),
    (ProxyErrorReason.NOT_PROXY, b"\r\n", {"accept_v2": False}),
    (ProxyErrorReason.VERSION_DISABLED, b"PROXY UNKNOWN\r\n", {"accept_v1": False}),
    (ProxyErrorReason.VERSION_DISABLED, SIG + b"\x20\x00\x00\x00", {"accept_v2": False}),
    (ProxyErrorReason.V1_TOO_LONG, b"PROXY UNKNOWN " + b"a" * 93, {}),
    (ProxyErrorReason.V1_TOO_LONG, b"PROXY UNKNOWN " + b"a" * 92 + b"\r\n", {}),
    (ProxyErrorReason.V1_BAD_LINE_ENDING, b"PROXY UNKNOWN\n", {}),
    (ProxyErrorReason.V1_BAD_LINE_ENDING, b"PROXY UNKNOWN\r\r\n", {}),
    (ProxyErrorReason.V1_BAD_LINE_ENDING, b"PROXY TCP4 1.2.3.4\r 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_LINE_ENDING, b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", {}),
    (ProxyErrorReason.V1_BAD_PROTOCOL, b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_PROTOCOL, b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_PROTOCOL, b"PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_PROTOCOL, b"PROXY UNKNOWNX\r\n", {}),
    (ProxyErrorReason.V1_BAD_PROTOCOL, b"PROXY  TCP4 1.2.3.4 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_PROTOCOL, b"PROXY TCP\r\n", {}),
    (ProxyErrorReason.V1_BAD_PROTOCOL, b"PROXY \r\n", {}),
    (ProxyErrorReason.V1_BAD_CHARACTER, b"PROXY TCP4 1.2.3.4 5.6.7.8 +5 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_CHARACTER, b"PROXY TCP4 1.2.3.4 5.6.7.8 1_0 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_CHARACTER, "PROXY TCP4 1.2.3.4 5.6.7.8 ٣ 2\r\n".encode(), {}),
    (ProxyErrorReason.V1_BAD_CHARACTER, b"PROXY TCP4 1.2.3.4 5.6.7.8 1\t2\r\n", {}),
    (ProxyErrorReason.V1_BAD_CHARACTER, b"PROXY TCP4 ::1 ::1 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_CHARACTER, b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_CHARACTER, b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_FIELDS, b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_FIELDS, b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n", {}),
    (ProxyErrorReason.V1_BAD_FIELDS, b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", {}),
    (ProxyErrorReason.V1_BAD_FIELDS, b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", {}),
    (ProxyErrorReason.V1_BAD_FIELDS, b"PROXY TCP4\r\n", {}),
    (ProxyErrorReason.V1_BAD_FIELDS, b"PROXY TCP4 \r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP4 1.2.3.4 5.6.7.010 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP4 256.2.3.4 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP4 1.2.3.4.5 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP4 1..3.4 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP4 1.2.3.1234 5.6.7.8 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP6 1::2::3 ::1 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP6 ::1 12345::1 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP6 ::ffff:01.2.3.4 ::1 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_ADDRESS, b"PROXY TCP6 " + b"0:" * 23 + b"0 ::1 1 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_PORT, b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_PORT, b"PROXY TCP4 1.2.3.4 5.6.7.8 1 00\r\n", {}),
    (ProxyErrorReason.V1_BAD_PORT, b"PROXY TCP4 1.2.3.4 5.6.7.8 080 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_PORT, b"PROXY TCP4 1.2.3.4 5.6.7.8 100000 2\r\n", {}),
    (ProxyErrorReason.V1_BAD_PORT, b"PROXY TCP4 1.2.3.4 5.6.7.8 1.0 2\r\n", {}),
    (ProxyErrorReason.V2_BAD_VERSION, SIG + b"\x11", {}),
    (ProxyErrorReason.V2_BAD_VERSION, SIG + b"\x31\x11\x00\x0c" + INET_BLOCK, {}),
    (ProxyErrorReason.V2_BAD_COMMAND, SIG + b"\x22", {}),
    (ProxyErrorReason.V2_BAD_COMMAND, SIG + b"\x2f\x11\x00\x0c" + INET_BLOCK, {}),
    (ProxyErrorReason.V2_BAD_FAMILY, SIG + b"\x21\x41", {}),
    (ProxyErrorReason.V2_BAD_FAMILY, SIG + b"\x21\x13", {}),
    (ProxyErrorReason.V2_BAD_FAMILY, SIG + b"\x21\x10", {}),
    (ProxyErrorReason.V2_BAD_FAMILY, SIG + b"\x21\x01", {}),
    (ProxyErrorReason.V2_BAD_FAMILY, SIG + b"\x20\x41", {}),
    (ProxyErrorReason.V2_BAD_ADDRESS_LENGTH, v2(0x21, 0x11, INET_BLOCK[:11]), {}),
    (ProxyErrorReason.V2_BAD_ADDRESS_LENGTH, v2(0x21, 0x21, INET_BLOCK), {}),
    (ProxyErrorReason.V2_BAD_ADDRESS_LENGTH, v2(0x20, 0x31, b"\0" * 215), {}),
    (ProxyErrorReason.V2_TOO_LONG, SIG + b"\x21\x11\x0f\xf1", {}),
    (ProxyErrorReason.V2_TOO_LONG, SIG + b"\x21\x11\x00\x0d", {"max_v2_bytes": 28}),
    (ProxyErrorReason.V2_BAD_TLV, v2(0x21, 0x11, INET_BLOCK + b"\x01\x00"), {}),
    (ProxyErrorReason.V2_BAD_TLV, v2(0x21, 0x11, INET_BLOCK + b"\x01\x00\x03h2"), {}),
    (ProxyErrorReason.V2_BAD_TLV, v2(0x21, 0x11, INET_BLOCK + tlv(3, b"\0\0\0")), {}),
    (ProxyErrorReason.V2_BAD_TLV, v2(0x21, 0x11, INET_BLOCK + tlv(3, b"\0" * 4) * 2), {}),
    (ProxyErrorReason.V2_BAD_TLV, v2(0x21, 0x11, INET_BLOCK + tlv(5, b"u" * 129)), {}),
    (ProxyErrorReason.V2_BAD_TLV, v2(0x21, 0x11, INET_BLOCK + SSL_SHORT), {}),
    (ProxyErrorReason.V2_BAD_TLV, v2(0x21, 0x11, INET_BLOCK + SSL_OVERRUN), {}),
    (ProxyErrorReason.V2_BAD_TLV, v2(0x20, 0x00, b"\x04"), {}),
    (ProxyErrorReason.V2_BAD_CRC32C, v2(0x21, 0x11, INET_BLOCK + tlv(3, b"\0\0\0\1")), {}),
]


@pytest.mark.parametrize(("reason", "data", "options"), CASES)
def test_each_error_reason(reason: ProxyErrorReason, data: bytes, options: dict) -> None:
    assert reject(data, **options) is reason


def test_every_reason_has_a_case() -> None:
    assert {reason for reason, _, _ in CASES} == set(ProxyErrorReason)


def test_corrupted_crc_protected_header_is_refused() -> None:
    wire = bytearray(encode_v2(("192.0.2.1", 1), ("192.0.2.2", 2), tlvs=[(1, b"h2")], crc32c=True))
    wire[25] ^= 0x01  # one bit of the source port
    assert reject(bytes(wire)) is ProxyErrorReason.V2_BAD_CRC32C


# --- early rejection ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "fails_at"),
    [
        (b"GET / HTTP/1.1\r\n", 1),
        (b"\x16\x03\x01", 1),
        (b"POST / HTTP/1.1\r\n", 2),
        (b"PROXZ TCP4", 5),
        (b"\r\n\r\n\0\r\nQUIT\r", 12),
        (SIG + b"\x10\x11\x00\x0c", 13),
        (SIG + b"\x21\x51\x00\x0c", 14),
        (SIG + b"\x21\x11\x20\x00", 16),
        (b"PROXY UDP4 1.2.3.4", 8),
        (b"PROXY TCP4 1.2.3.4 x", 20),
        (b"PROXY TCP4 1.2.3.4  ", 20),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 ", 31),
        (b"PROXY UNKNOWN\n", 14),
        (b"PROXY TCP4 1.2\r3", 16),
    ],
)
def test_rejected_at_the_first_octet_that_cannot_fit(data: bytes, fails_at: int) -> None:
    parser = ProxyHeaderParser()
    for count in range(1, len(data) + 1):
        if count == fails_at:
            with pytest.raises(ProxyProtocolError):
                parser.feed(data[count - 1 : count])
            return
        assert parser.feed(data[count - 1 : count]) is None
    pytest.fail("never rejected")


def test_looks_like_proxy_header() -> None:
    assert looks_like_proxy_header(b"") is None
    assert looks_like_proxy_header(b"PRO") is None
    assert looks_like_proxy_header(b"\r\n\r\n") is None
    assert looks_like_proxy_header(b"PROXY ") is True
    assert looks_like_proxy_header(SIG + b"\x21") is True
    assert looks_like_proxy_header(b"GET") is False
    assert looks_like_proxy_header(b"PROXY-") is False
    assert looks_like_proxy_header(b"\x16") is False


# --- the incremental parser's contract ---------------------------------------------------------


def test_parser_keeps_what_follows_the_header() -> None:
    parser = ProxyHeaderParser()
    wire = encode_v1(("192.0.2.1", 5), ("192.0.2.2", 6))
    assert parser.feed(b"") is None
    assert parser.feed(wire[:10]) is None
    assert parser.buffered_bytes == 10 and parser.header is None and parser.remainder == b""
    header = parser.feed(bytearray(wire[10:] + b"GET /"))
    assert header is not None and parser.header is header
    assert parser.remainder == b"GET /" and parser.buffered_bytes == 0
    with pytest.raises(RuntimeError):
        parser.feed(b"more")


def test_parser_copies_no_more_than_a_header_can_hold() -> None:
    wire = encode_v2(("192.0.2.1", 1), ("192.0.2.2", 2))
    trailer = bytes(range(256)) * 40
    parser = ProxyHeaderParser(max_v2_bytes=28)
    assert parser.feed(wire[:5]) is None
    assert parser.feed(wire[5:] + trailer) is not None
    assert parser.remainder == trailer
    slow = ProxyHeaderParser()
    assert slow.feed(b"PROXY UNKNOWN ") is None
    with pytest.raises(ProxyProtocolError) as caught:
        slow.feed(b"x" * 100_000)
    assert caught.value.reason is ProxyErrorReason.V1_TOO_LONG
    assert slow.buffered_bytes == 0


def test_parser_accepts_memoryview() -> None:
    parser = ProxyHeaderParser()
    assert parser.feed(memoryview(encode_v2_local() + b"x")) is not None
    assert parser.remainder == b"x"


def test_parser_stays_failed() -> None:
    parser = ProxyHeaderParser()
    with pytest.raises(ProxyProtocolError) as first:
        parser.feed(b"GET")
    with pytest.raises(ProxyProtocolError) as again:
        parser.feed(b"PROXY UNKNOWN\r\n")
    assert again.value is first.value


def test_incomplete_input_is_none() -> None:
    assert parse_proxy_header(b"") is None
    assert parse_proxy_header(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r") is None
    assert parse_proxy_header(SIG + b"\x21\x11\x00\x0c" + INET_BLOCK[:-1]) is None


@pytest.mark.parametrize(
    "options",
    [
        {"accept_v1": False, "accept_v2": False},
        {"max_v2_bytes": 15},
        {"max_v2_bytes": 16 + 65536},
    ],
)
def test_parser_options_are_checked(options: dict) -> None:
    with pytest.raises(ValueError):
        ProxyHeaderParser(**options)
    with pytest.raises(ValueError):
        parse_proxy_header(b"", **options)


# --- encoders ----------------------------------------------------------------------------------


def test_encode_v1_vectors() -> None:
    assert encode_v1(None, None) == b"PROXY UNKNOWN\r\n"
    assert encode_v1(("192.0.2.1", 56324), ("192.0.2.11", 443)) == (
        b"PROXY TCP4 192.0.2.1 192.0.2.11 56324 443\r\n"
    )
    assert encode_v1(("2001:db8::1", 1, 0, 0), ("2001:db8::2", 2)) == (
        b"PROXY TCP6 2001:db8::1 2001:db8::2 1 2\r\n"
    )


def test_mixed_families_are_sent_as_ipv6_and_mapped_pairs_as_ipv4() -> None:
    header, _ = parse_proxy_header(encode_v2(("192.0.2.1", 1), ("2001:db8::2", 2)))  # type: ignore[misc]
    assert header.family is ProxyFamily.INET6
    assert header.source == ("::ffff:192.0.2.1", 1)
    line = encode_v1(("::ffff:192.0.2.1", 1), (ipaddress.ip_address("::ffff:192.0.2.2"), 2))
    assert line == b"PROXY TCP4 192.0.2.1 192.0.2.2 1 2\r\n"


def test_encode_drops_the_ipv6_scope() -> None:
    line = encode_v1(("fe80::1%eth0", 1, 0, 2), ("fe80::2", 2))
    assert line == b"PROXY TCP6 fe80::1 fe80::2 1 2\r\n"


def test_encode_v2_dgram_and_local_with_tlvs() -> None:
    header, _ = parse_proxy_header(  # type: ignore[misc]
        encode_v2(("192.0.2.1", 53), ("192.0.2.2", 53), transport=ProxyTransport.DGRAM)
    )
    assert header.protocol is ProxyTransport.DGRAM
    wire = encode_v2_local(tlvs=[(TlvType.UNIQUE_ID, b"hc")], crc32c=True)
    header, _ = parse_proxy_header(wire)  # type: ignore[misc]
    assert header.command is ProxyCommand.LOCAL and header.unique_id == b"hc"


@pytest.mark.parametrize(
    ("source", "destination", "options"),
    [
        (("192.0.2.1", 1), None, {}),
        (None, ("192.0.2.1", 1), {}),
        (("example.com", 1), ("192.0.2.1", 1), {}),
        ((3221225985, 1), ("192.0.2.1", 1), {}),
        (("192.0.2.1", True), ("192.0.2.1", 1), {}),
        (("192.0.2.1", -1), ("192.0.2.1", 1), {}),
        (("192.0.2.1", 65536), ("192.0.2.1", 1), {}),
        (("192.0.2.1", "80"), ("192.0.2.1", 1), {}),
        (("192.0.2.1", 1, 0), ("192.0.2.1", 1), {}),
        (["192.0.2.1", 1], ("192.0.2.1", 1), {}),
        (("192.0.2.1", 1), ("192.0.2.1", 1), {"tlvs": [(3, b"\0\0\0\0")]}),
        (("192.0.2.1", 1), ("192.0.2.1", 1), {"tlvs": [(256, b"")]}),
        (("192.0.2.1", 1), ("192.0.2.1", 1), {"tlvs": [(0xF0, b"x" * 65536)]}),
        (("192.0.2.1", 1), ("192.0.2.1", 1), {"tlvs": [(0xF0, b"x" * 40000)] * 2}),
        (("192.0.2.1", 1), ("192.0.2.1", 1), {"tlvs": [(5, b"x" * 129)]}),
        (("192.0.2.1", 1), ("192.0.2.1", 1), {"tlvs": [(0x20, b"\x01")]}),
        (("192.0.2.1", 1), ("192.0.2.1", 1), {"transport": ProxyTransport.UNSPEC}),
        (("192.0.2.1", 1), ("192.0.2.1", 1), {"command": 2}),
    ],
)
def test_encode_v2_refuses_bad_arguments(
    source: object, destination: object, options: dict
) -> None:
    with pytest.raises(ValueError):
        encode_v2(source, destination, **options)  # type: ignore[arg-type]


def test_encode_v1_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="both"):
        encode_v1(("192.0.2.1", 1), None)
    with pytest.raises(ValueError, match="port"):
        encode_v1(("192.0.2.1", 1.5), ("192.0.2.1", 1))  # type: ignore[arg-type]
