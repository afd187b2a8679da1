"""PROXY codec properties: whatever the encoders write, the parser reads back the same header,
however the bytes are split, and leaves what follows the header untouched as the remainder."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from geoedge.proxy import (
    V2_SIGNATURE,
    ProxyCommand,
    ProxyFamily,
    ProxyHeader,
    ProxyHeaderParser,
    ProxyTransport,
    SslClient,
    TlvType,
    encode_ssl_tlv,
    encode_v1,
    encode_v2,
    parse_proxy_header,
)
from tests.example_budget import examples

PROPS = settings(max_examples=examples(300), deadline=None)

ports = st.integers(0, 65535)
ipv4 = st.ip_addresses(v=4)
# IPv4-mapped IPv6 addresses are sent as IPv4 on purpose: tested in the unit tests.
ipv6 = st.ip_addresses(v=6).filter(lambda ip: ip.ipv4_mapped is None)


def endpoints(ips: st.SearchStrategy) -> st.SearchStrategy:
    return st.tuples(ips.map(str), ports)


pairs = st.one_of(
    st.tuples(endpoints(ipv4), endpoints(ipv4)), st.tuples(endpoints(ipv6), endpoints(ipv6))
)
texts = st.none() | st.text(max_size=40)
plain_tlvs = st.tuples(
    st.integers(0, 255).filter(lambda kind: kind not in (TlvType.CRC32C, TlvType.SSL)),
    st.binary(max_size=200),
).filter(lambda t: t[0] != TlvType.UNIQUE_ID or len(t[1]) <= 128)
ssl_tlvs = st.builds(
    encode_ssl_tlv,
    client=st.integers(0, 7).map(SslClient),
    verify=st.integers(0, 2**32 - 1),
    version=texts,
    cipher=texts,
    common_name=texts,
    sig_alg=texts,
    key_alg=texts,
)
tlv_lists = st.lists(plain_tlvs | ssl_tlvs, max_size=6)
trailers = st.binary(max_size=64)


def feed_in_pieces(wire: bytes, size: int, data: st.DataObject) -> tuple[ProxyHeader, bytes]:
    """Feed ``wire`` cut at random points; the header must appear exactly when its last octet
    (``size``) arrives. Returns the header and everything the caller gets after it."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8), label="cuts"))
    parser = ProxyHeaderParser(max_v2_bytes=65551)
    fed = 0
    after: list[bytes] = []
    header = None
    for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        piece = wire[start:end]
        if header is not None:
            after.append(piece)
            continue
        header = parser.feed(piece)
        fed += len(piece)
        assert (header is not None) == (fed >= size)
    assert header is not None
    return header, parser.remainder + b"".join(after)


def canonical(endpoint: tuple[str, int]) -> tuple[str, int]:
    return str(ipaddress.ip_address(endpoint[0])), endpoint[1]


@PROPS
@given(pair=st.none() | pairs, trailer=trailers, data=st.data())
def test_v1_round_trip(
    pair: tuple[tuple[str, int], tuple[str, int]] | None, trailer: bytes, data: st.DataObject
) -> None:
    wire = encode_v1(*(pair or (None, None)))
    assert len(wire) <= 107
    header, rest = feed_in_pieces(wire + trailer, len(wire), data)
    assert rest == trailer
    assert header.version == 1 and header.tlvs == ()
    if pair is None:
        assert header.command is ProxyCommand.LOCAL and header.source is None
        return
    assert header.command is ProxyCommand.PROXY and header.protocol is ProxyTransport.STREAM
    v4 = ipaddress.ip_address(pair[0][0]).version == 4
    assert header.family is (ProxyFamily.INET if v4 else ProxyFamily.INET6)
    assert header.source == canonical(pair[0])
    assert header.destination == canonical(pair[1])
    assert parse_proxy_header(wire + trailer) == (header, len(wire))


@PROPS
@given(
    pair=st.none() | pairs,
    command=st.sampled_from(ProxyCommand),
    transport=st.sampled_from([ProxyTransport.STREAM, ProxyTransport.DGRAM]),
    tlvs=tlv_lists,
    crc32c=st.booleans(),
    trailer=trailers,
    data=st.data(),
)
def test_v2_round_trip(
    pair: tuple[tuple[str, int], tuple[str, int]] | None,
    command: ProxyCommand,
    transport: ProxyTransport,
    tlvs: list[tuple[int, bytes]],
    crc32c: bool,
    trailer: bytes,
    data: st.DataObject,
) -> None:
    wire = encode_v2(
        *(pair or (None, None)), tlvs=tlvs, command=command, transport=transport, crc32c=crc32c
    )
    header, rest = feed_in_pieces(wire + trailer, len(wire), data)
    assert rest == trailer
    assert (header.version, header.command) == (2, command)
    assert list(header.tlvs[: len(tlvs)]) == [(kind, bytes(value)) for kind, value in tlvs]
    assert len(header.tlvs) == len(tlvs) + crc32c
    if pair is None:
        assert header.family is ProxyFamily.UNSPEC and header.protocol is ProxyTransport.UNSPEC
        assert header.source is None and header.destination is None
        return
    v4 = ipaddress.ip_address(pair[0][0]).version == 4
    assert header.family is (ProxyFamily.INET if v4 else ProxyFamily.INET6)
    assert header.protocol is transport
    if command is ProxyCommand.LOCAL:
        assert header.source is None and header.destination is None
    else:
        assert header.source == canonical(pair[0])
        assert header.destination == canonical(pair[1])


@PROPS
@given(ssl=ssl_tlvs)
def test_ssl_tlv_round_trip(ssl: tuple[int, bytes]) -> None:
    header, _ = parse_proxy_header(encode_v2(None, None, tlvs=[ssl]))  # type: ignore[misc]
    info = header.ssl
    assert info is not None
    client, verify = ssl[1][0], int.from_bytes(ssl[1][1:5], "big")
    assert (int(info.client), info.verify) == (client, verify)
    again = encode_ssl_tlv(
        client=info.client,
        verify=info.verify,
        version=info.version,
        cipher=info.cipher,
        common_name=info.common_name,
        sig_alg=info.sig_alg,
        key_alg=info.key_alg,
    )
    assert again == ssl


@PROPS
@given(src=st.binary(min_size=16, max_size=16), dst=st.binary(min_size=16, max_size=16))
def test_any_ipv6_address_reads_as_rfc5952_text(src: bytes, dst: bytes) -> None:
    wire = V2_SIGNATURE + b"\x21\x21\x00\x24" + src + dst + b"\x00\x01\x00\x02"
    header, _ = parse_proxy_header(wire)  # type: ignore[misc]
    for raw, (text, _port) in ((src, header.source), (dst, header.destination)):  # type: ignore[misc]
        address = ipaddress.IPv6Address(raw)
        assert ipaddress.IPv6Address(text) == address
        if address.ipv4_mapped is None:
            assert text == str(address)
        else:
            assert text == f"::ffff:{address.ipv4_mapped}"
    # and the v1 text of the same addresses reads back to the same strings
    line = encode_v1((header.source[0], 1), (header.destination[0], 2))  # type: ignore[index]
    again, _ = parse_proxy_header(line)  # type: ignore[misc]
    if again.family is ProxyFamily.INET6:
        assert (again.source[0], again.destination[0]) == (  # type: ignore[index]
            header.source[0],  # type: ignore[index]
            header.destination[0],  # type: ignore[index]
        )
