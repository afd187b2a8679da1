"""Only ProxyProtocolError may escape the PROXY parser, whatever the bytes and however split.

For every input, fed in random pieces, the parser gives a header, asks for more, or raises
ProxyProtocolError: any other exception fails the test. While it asks for more it holds fewer
than max(107, max_v2_bytes) octets. And the split never changes the outcome: the header and
remainder (or the fact of an error) are those of parsing the whole input at once.
"""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from geoedge.proxy import (
    V2_SIGNATURE,
    ProxyCommand,
    ProxyErrorReason,
    ProxyHeaderParser,
    ProxyProtocolError,
    ProxyTransport,
    TlvType,
    encode_ssl_tlv,
    encode_v1,
    encode_v2,
    parse_proxy_header,
)
from tests.example_budget import examples

FUZZ = settings(max_examples=examples(400), deadline=None)
LIMITS = [16, 28, 52, 107, 300, 4096]

Outcome = tuple


def one_shot(data: bytes, max_v2_bytes: int) -> Outcome:
    try:
        result = parse_proxy_header(data, max_v2_bytes=max_v2_bytes)
    except ProxyProtocolError as exc:
        assert isinstance(exc.reason, ProxyErrorReason) and str(exc)
        return ("error",)
    if result is None:
        return ("incomplete",)
    header, size = result
    assert 0 < size <= len(data)
    return ("header", header, data[size:])


def in_pieces(data: bytes, cuts: list[int], max_v2_bytes: int) -> Outcome:
    parser = ProxyHeaderParser(max_v2_bytes=max_v2_bytes)
    bound = max(107, max_v2_bytes)
    bounds = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    for start, end in itertools.pairwise(bounds):
        try:
            header = parser.feed(data[start:end])
        except ProxyProtocolError as exc:
            assert isinstance(exc.reason, ProxyErrorReason) and str(exc)
            assert parser.buffered_bytes == 0
            return ("error",)
        if header is not None:
            return ("header", header, parser.remainder + data[end:])
        assert parser.buffered_bytes == end < bound
    return ("incomplete",)


def check(data: bytes, cuts: list[int], max_v2_bytes: int) -> None:
    assert in_pieces(data, cuts, max_v2_bytes) == one_shot(data, max_v2_bytes)


# --- inputs ------------------------------------------------------------------------------------

V1_TOKENS = [b"PROXY", b" ", b"TCP4", b"TCP6", b"UNKNOWN", b"0", b"1", b"01", b"255", b"256",
             b"65535", b"65536", b".", b":", b"::", b"ffff", b"%", b"+", b"\r", b"\n", b"\r\n",
             b"1.2.3.4", b"::1", "٣".encode()]  # fmt: skip
v1_like = st.lists(st.sampled_from(V1_TOKENS), max_size=30).map(b"".join)
prefixed = st.tuples(
    st.sampled_from([b"", b"P", b"PROXY ", b"PROXY TCP4 ", b"PROXY TCP6 ", V2_SIGNATURE]),
    st.binary(max_size=200),
).map(b"".join)
v2_like = st.tuples(
    st.integers(0, 255), st.integers(0, 255), st.integers(0, 400), st.binary(max_size=400)
).map(lambda t: V2_SIGNATURE + bytes(t[:2]) + t[2].to_bytes(2, "big") + t[3])

ips = st.sampled_from(["192.0.2.1", "0.0.0.0", "255.255.255.255", "2001:db8::1", "::", "::1"])
endpoint = st.tuples(ips, st.integers(0, 65535))
tlv = st.one_of(
    st.tuples(st.sampled_from([1, 2, 4, 5, 0x30, 0xEA, 0xF0]), st.binary(max_size=40)).filter(
        lambda t: t[0] != TlvType.UNIQUE_ID or len(t[1]) <= 128
    ),
    st.builds(encode_ssl_tlv, version=st.none() | st.just("TLSv1.3"), cipher=st.text(max_size=9)),
)


@st.composite
def valid_headers(draw: st.DrawFn) -> bytes:
    src, dst = draw(endpoint), draw(endpoint)
    if draw(st.booleans()):
        return encode_v1(src, dst) if draw(st.booleans()) else encode_v1(None, None)
    return encode_v2(
        *(draw(st.sampled_from([(src, dst), (None, None)]))),
        tlvs=draw(st.lists(tlv, max_size=4)),
        command=draw(st.sampled_from(ProxyCommand)),
        transport=draw(st.sampled_from([ProxyTransport.STREAM, ProxyTransport.DGRAM])),
        crc32c=draw(st.booleans()),
    )


def mutate(data: bytes, rng: random.Random, count: int) -> bytes:
    buf = bytearray(data)
    for _ in range(count):
        choice = rng.randrange(6)
        at = rng.randrange(len(buf) + 1)
        if choice == 0 and buf:
            buf[at % len(buf)] = rng.randrange(256)
        elif choice == 1 and buf:
            buf[at % len(buf)] ^= 1 << rng.randrange(8)
        elif choice == 2:
            buf[at:at] = bytes([rng.randrange(256)])
        elif choice == 3:
            del buf[at : at + rng.randrange(1, 4)]
        elif choice == 4:
            del buf[at:]
        else:
            buf[at:at] = buf[rng.randrange(len(buf) + 1) :][: rng.randrange(1, 20)]
    return bytes(buf)


cuts = st.lists(st.integers(0, 2**16), max_size=10)
limits = st.sampled_from(LIMITS)


@FUZZ
@given(data=st.binary(max_size=300) | prefixed | v1_like | v2_like, cuts=cuts, limit=limits)
def test_random_bytes(data: bytes, cuts: list[int], limit: int) -> None:
    check(data, cuts, limit)


@FUZZ
@given(
    wire=valid_headers(),
    trailer=st.binary(max_size=300),
    seed=st.integers(0, 2**32),
    count=st.integers(0, 4),
    cuts=cuts,
    limit=limits,
)
def test_mutated_valid_headers(
    wire: bytes, trailer: bytes, seed: int, count: int, cuts: list[int], limit: int
) -> None:
    check(mutate(wire + trailer, random.Random(seed), count), cuts, limit)


MUTATIONS = examples(20_000)


def test_seeded_mutation_loop_bounded_in_count() -> None:
    """Many more cheap cases than hypothesis runs, from a fixed seed, a fixed count
    (never bounded by time: the same inputs on every machine)."""
    rng = random.Random(20240611)
    seeds = [
        encode_v1(("192.0.2.1", 1234), ("198.51.100.2", 443)),
        encode_v1(("2001:db8::1", 65535), ("::ffff:1.2.3.4", 0)),
        encode_v1(None, None),
        encode_v2(("192.0.2.1", 1), ("192.0.2.2", 2), tlvs=[(0xEA, b"\x01vpce-0abc")]),
        encode_v2(("::1", 1), ("::2", 2), tlvs=[encode_ssl_tlv(version="TLSv1.3")], crc32c=True),
        encode_v2(None, None, command=ProxyCommand.LOCAL, tlvs=[(5, b"id")]),
        V2_SIGNATURE + b"\x21\x31\x00\xd8" + b"/sock".ljust(108, b"\0") * 2,
    ]
    runs = 0
    while runs < MUTATIONS:
        trailer = b"GET / HTTP/1.1\r\n" * rng.randrange(12)
        data = mutate(rng.choice(seeds) + trailer, rng, rng.randrange(1, 5))
        pieces = [rng.randrange(len(data) + 1) for _ in range(rng.randrange(4))]
        check(data, pieces, rng.choice(LIMITS))
        runs += 1
    assert runs == MUTATIONS
