"""Differential properties: the compiled build of each sans-I/O module that
is compiled (tunnel/build_mode.py) and its pure-Python source, run side by
side in one process (tests/compiled.py ``builds``), give the same results and
the same errors for the same inputs, as msgpack fuzzes its extension against
its fallback.

Each pure twin is that module's ``.py`` alone (its imports are the running
build's), so each property holds one module's two builds to each other. In
the pure run (``GEOEDGE_NO_EXTENSIONS=1``) both sides are the ``.py``; the
compiled run is the one these tests are for. The adapters (front ends,
exchange, tunnel streams, origin forwarding) are held to the pure build by
the whole suite, which runs on both (``make test``, ``.ci/run``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.http1 import ClientContext, HttpLimits
from tests.compiled import builds
from tests.property.test_http1_props import chunked_bodies, request_streams, split_at
from tunnel.build_mode import COMPILED_MODULES

DIFFERENTIAL = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

MODULES = {
    name: builds(name)
    for name in (
        "edge.http1.syntax",
        "edge.http1.head",
        "edge.http1.request",
        "edge.http1.response",
        "edge.h2_decoder",
        "edge.h2_encoder",
        "edge.h2_fields",
        "edge.h2_translate",
        "tunnel.mux.reader",
        "tunnel.mux.frames",
        "tunnel.mux.metadata",
        "tunnel.mux.window",
        "tunnel.mux.scheduler",
    )
}


def test_every_differential_module_is_compiled() -> None:
    assert set(MODULES) <= set(COMPILED_MODULES)


_ADDRESS = re.compile(r"0x[0-9a-f]+")


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """What a call gave: its result, or its error by class name and text
    (each twin raises its own classes when they are defined in it)."""
    try:
        return "ok", call()
    except Exception as exc:
        text = _ADDRESS.sub("0x?", str(exc))  # a repr's object address differs by run
        return "error", (type(exc).__name__, text, getattr(exc, "status", None))


def both(module: str) -> tuple[ModuleType, ModuleType]:
    return MODULES[module]


# HTTP/1.1 ----------------------------------------------------------------------------------


def _request_events(module: ModuleType, pieces: list[bytes], trusted: bool) -> list[object]:
    counter = itertools.count(1)
    context = ClientContext("198.51.100.7", 1234, trusted)
    reader = module.RequestReader(HttpLimits(), context, lambda: f"id-{next(counter)}")
    events: list[object] = []
    for piece in pieces:
        events += reader.feed(piece)
    events += reader.feed_eof()
    return [*events, reader.in_head, reader.in_body, reader.buffered_bytes]


_arbitrary_requests = st.one_of(
    request_streams.map(lambda stream: b"".join(wire for wire, _ in stream)),
    st.binary(max_size=300),
    st.binary(max_size=200).map(lambda b: b"GET / HTTP/1.1\r\nHost: a\r\n" + b),
)


@DIFFERENTIAL
@given(_arbitrary_requests, st.lists(st.integers(0, 10_000), max_size=8), st.booleans())
def test_request_reader_builds_agree(data: bytes, cuts: list[int], trusted: bool) -> None:
    compiled, pure = both("edge.http1.request")
    pieces = split_at(data, cuts)
    assert _request_events(compiled, pieces, trusted) == _request_events(pure, pieces, trusted)


@DIFFERENTIAL
@given(
    st.one_of(
        st.binary(max_size=24), st.text("0123456789abcdefABCDEF+_ \t", max_size=24).map(str.encode)
    ),
    st.integers(0, 20),
    st.lists(st.text("a,B ;\t=x", max_size=16).map(str.encode), max_size=4),
)
def test_syntax_builds_agree(text: bytes, digits: int, values: list[bytes]) -> None:
    compiled, pure = both("edge.http1.syntax")
    for module in (compiled, pure):
        assert module.split_tokens(values) == pure.split_tokens(values)
        assert module.parse_decimal(text, digits) == pure.parse_decimal(text, digits)
        assert module.parse_hex(text, digits) == pure.parse_hex(text, digits)
        assert module.strip_ows(text) == pure.strip_ows(text)


def _head_outcome(module: ModuleType, pieces: list[bytes], response: bool) -> list[object]:
    parser = module.HeadParser(HttpLimits(max_header_bytes=600), response=response)
    seen: list[object] = []
    for piece in pieces:
        result = outcome(lambda piece=piece: parser.feed(piece, 0))
        seen.append(result)
        if result[0] == "error" or result[1] >= 0:
            break
    fields = ("method", "target", "http_version", "status", "reason", "headers")
    return [*seen, *(getattr(parser, name) for name in fields), parser.buffered_bytes]


@DIFFERENTIAL
@given(
    _arbitrary_requests,
    st.lists(st.integers(0, 10_000), max_size=8),
    st.booleans(),
)
def test_head_parser_builds_agree(data: bytes, cuts: list[int], response: bool) -> None:
    if response:
        data = b"HTTP/1.1 200 OK\r\n" + data.partition(b"\r\n")[2]
    compiled, pure = both("edge.http1.head")
    pieces = split_at(data, cuts) or [b""]
    assert _head_outcome(compiled, pieces, response) == _head_outcome(pure, pieces, response)


_responses = st.one_of(
    st.tuples(
        st.sampled_from([b"200 OK", b"204 No Content", b"101 Switching Protocols", b"304 X"]),
        st.lists(
            st.sampled_from(
                [b"Content-Length: 5", b"Transfer-Encoding: chunked", b"Connection: close",
                 b"Connection: keep-alive, X-A", b"X-A: 1", b"Keep-Alive: timeout=5"]
            ),
            max_size=4,
        ),
        st.one_of(st.binary(max_size=20), chunked_bodies().map(lambda body: body[0])),
    ).map(lambda r: b"HTTP/1.1 %s\r\n%s\r\n%s" % (r[0], b"".join(f + b"\r\n" for f in r[1]), r[2])),
    st.binary(max_size=200),
)  # fmt: skip


def _response_events(
    module: ModuleType, pieces: list[bytes], method: bytes, decode: bool
) -> list[object]:
    reader = module.ResponseReader(HttpLimits(), decode_chunked=decode)
    reader.expect(method, None)
    reader.expect(b"GET", None)
    events: list[object] = []
    for piece in pieces:
        events += reader.feed(piece)
    events += reader.feed_eof()
    return [*events, reader.outstanding, reader.at_boundary, reader.buffered_bytes]


@DIFFERENTIAL
@given(
    st.lists(_responses, min_size=1, max_size=3),
    st.lists(st.integers(0, 10_000), max_size=8),
    st.sampled_from([b"GET", b"HEAD"]),
    st.booleans(),
)
def test_response_reader_builds_agree(
    responses: list[bytes], cuts: list[int], method: bytes, decode: bool
) -> None:
    compiled, pure = both("edge.http1.response")
    pieces = split_at(b"".join(responses), cuts)
    assert _response_events(compiled, pieces, method, decode) == _response_events(
        pure, pieces, method, decode
    )


# HTTP/2 codecs -------------------------------------------------------------------------------

_h2_fields = st.lists(
    st.tuples(
        st.one_of(
            st.sampled_from([b":method", b":path", b":scheme", b":authority", b":protocol",
                             b"host", b"te", b"content-length", b"connection", b"cookie"]),
            st.binary(min_size=0, max_size=8),
        ),
        st.one_of(
            st.sampled_from([b"GET", b"CONNECT", b"/", b"https", b"a.example", b"trailers",
                             b"websocket", b"5", b"05", b"x y"]),
            st.binary(max_size=10),
        ),
    ),
    max_size=8,
)  # fmt: skip


@DIFFERENTIAL
@given(_h2_fields)
def test_h2_field_checks_builds_agree(fields: list[tuple[bytes, bytes]]) -> None:
    compiled, pure = both("edge.h2_fields")
    assert outcome(lambda: compiled.check_request(fields)) == outcome(
        lambda: pure.check_request(fields)
    )
    assert outcome(lambda: compiled.check_trailers(fields)) == outcome(
        lambda: pure.check_trailers(fields)
    )


@DIFFERENTIAL
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=3))
def test_hpack_decoder_builds_agree(blocks: list[bytes]) -> None:
    compiled, pure = both("edge.h2_decoder")
    ours, theirs = compiled.RequestHeadDecoder(), pure.RequestHeadDecoder()
    for block in blocks:
        got = outcome(lambda block=block: ours.decode(block))
        assert got == outcome(lambda block=block: theirs.decode(block))
        if got[0] == "error":
            break
    assert list(ours.header_table.dynamic_entries) == list(theirs.header_table.dynamic_entries)


@DIFFERENTIAL
@given(
    st.lists(
        st.tuples(
            st.sampled_from([b":status", b"content-type", b"set-cookie", b"authorization",
                             b"x-a", b"etag", b"date"]),
            st.binary(max_size=30),
        ),
        max_size=8,
    ),
    st.one_of(st.none(), st.integers(0, 4096)),
)  # fmt: skip
def test_hpack_encoder_builds_agree(fields: list[tuple[bytes, bytes]], size: int | None) -> None:
    compiled, pure = both("edge.h2_encoder")
    ours, theirs = compiled.StaticTableEncoder(), pure.StaticTableEncoder()
    if size is not None:
        ours.header_table_size = theirs.header_table_size = size
    assert outcome(lambda: ours.encode(fields)) == outcome(lambda: theirs.encode(fields))
    assert hpack.Decoder().decode(ours.encode(fields), raw=True) is not None


@DIFFERENTIAL
@given(_h2_fields, st.booleans())
def test_h2_translation_builds_agree(fields: list[tuple[bytes, bytes]], ends_stream: bool) -> None:
    compiled, pure = both("edge.h2_translate")

    def translate(module: ModuleType) -> tuple[str, Any]:
        result = outcome(
            lambda: module.translate_request(fields, ends_stream=ends_stream, key=b"k" * 24)
        )
        if result[0] == "ok":  # each twin has its own H2Request class: compare the fields
            request = result[1]
            return "ok", (request.head, request.chunked, request.websocket)
        return result

    assert translate(compiled) == translate(pure)


# The tunnel's codecs -------------------------------------------------------------------------


@DIFFERENTIAL
@given(
    st.binary(max_size=400).map(lambda b: b"GEOEDGE\x00"[: len(b) % 9] + b),
    st.lists(st.integers(0, 10_000), max_size=6),
    st.sampled_from([16, 4096]),
)
def test_frame_reader_builds_agree(data: bytes, cuts: list[int], limit: int) -> None:
    compiled, pure = both("tunnel.mux.reader")

    def frames(module: ModuleType) -> list[object]:
        reader = module.FrameReader(limit)
        seen: list[object] = []
        for piece in split_at(data, cuts):
            seen.append(outcome(lambda piece=piece: reader.feed(piece)))
            if seen[-1][0] == "error":
                break
        return [*seen, reader.buffered]

    assert frames(compiled) == frames(pure)


@DIFFERENTIAL
@given(
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**31 - 1),
    st.binary(max_size=40),
    st.booleans(),
    st.dictionaries(st.integers(0, 20), st.integers(0, 2**32 - 1), max_size=4),
    st.text(max_size=20),
)
def test_frame_encoders_builds_agree(
    stream_id: int, value: int, blob: bytes, flag: bool, table: dict[int, int], text: str
) -> None:
    compiled, pure = both("tunnel.mux.frames")
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("encode_open", (stream_id, value, blob, flag)),
        ("encode_window_update", (stream_id, value)),
        ("encode_reset", (stream_id, value)),
        ("encode_settings", (table,)),
        ("encode_hello", (1, 2, table)),
        ("encode_goaway", (stream_id, value, text)),
        ("encode_ping", (blob[:8].ljust(8, b"\0"),)),
        ("decode_versions", (blob,)),
        ("decode_settings", (blob,)),
    ]
    for name, args in calls:
        got = outcome(lambda name=name, args=args: getattr(compiled, name)(*args))
        assert got == outcome(lambda name=name, args=args: getattr(pure, name)(*args)), name


@DIFFERENTIAL
@given(st.binary(max_size=120))
def test_metadata_decoding_builds_agree(data: bytes) -> None:
    compiled, pure = both("tunnel.mux.metadata")

    def decoded(module: ModuleType) -> tuple[str, Any]:
        result = outcome(lambda: module.StreamMetadata.decode(data))
        if result[0] == "ok":  # each twin has its own class: compare the fields
            return "ok", result[1].encode()
        return result

    assert decoded(compiled) == decoded(pure)


_WINDOW_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("receive"), st.integers(0, 1 << 20)),
        st.tuples(st.just("consume"), st.integers(0, 1 << 20)),
        st.tuples(st.just("raise_size"), st.integers(0, 1 << 24)),
        st.tuples(st.just("rtt"), st.floats(0, 2, allow_nan=False)),
        st.tuples(st.just("tick"), st.floats(0, 1, allow_nan=False)),
    ),
    max_size=40,
)


@DIFFERENTIAL
@given(
    size=st.integers(1, 1 << 22),
    max_size=st.integers(1, 1 << 24),
    min_size=st.integers(0, 1 << 20),
    steps=_WINDOW_STEPS,
)
def test_window_builds_agree(
    size: int, max_size: int, min_size: int, steps: list[tuple[str, Any]]
) -> None:
    """The receive window's credit and auto-tuning (RTT samples, epochs) give
    the same increments, sizes and flow-control errors in both builds."""
    compiled, pure = both("tunnel.mux.window")

    def run(module: ModuleType) -> list[object]:
        window = module.ReceiveWindow(size, max_size, 0.0, min_size)
        rtt = module.RttEstimator()
        now, seen = 0.0, []
        for step, value in steps:
            if step == "receive":
                seen.append(outcome(lambda value=value: window.receive(value)))
            elif step == "consume":
                seen.append(outcome(lambda value=value, now=now: window.consume(value, now, rtt)))
            elif step == "raise_size":
                seen.append(window.raise_size(value))
            elif step == "rtt":
                rtt.add_sample(value)
            else:
                now += value
            seen.append((window.size, window.limit, window.received, window.consumed))
        seen.append((rtt.smoothed, rtt.min, rtt.latest))
        return seen

    assert run(compiled) == run(pure)


@DIFFERENTIAL
@given(st.lists(st.tuples(st.sampled_from(["push", "pop", "discard"]), st.integers(1, 9))))
def test_scheduler_builds_agree(steps: list[tuple[str, int]]) -> None:
    compiled, pure = both("tunnel.mux.scheduler")

    def run(module: ModuleType) -> list[object]:
        line = module.RoundRobin()
        seen: list[object] = []
        for step, stream_id in steps:
            if step == "push":
                line.push(stream_id)
            elif step == "pop":
                seen.append(line.pop())
            else:
                line.discard(stream_id)
            seen.append((len(line), stream_id in line))
        return seen

    assert run(compiled) == run(pure)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_twin_is_the_source_and_the_running_one_is_the_build(module: str) -> None:
    running, pure = both(module)
    assert pure.__file__ is not None and pure.__file__.endswith(".py")
    assert running.__name__ == module and pure.__name__ == module + "_pure"
