"""The edge's HTTP/2 field checks (edge/h2_fields.py) refuse exactly what
``h2``'s own inbound validation refuses (and, for a request, its reading of
``content-length``), checked by hypothesis on field blocks built mostly from
the names and values the rules are about."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import h2.config
import h2.exceptions
import h2.stream
import h2.utilities
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.h2_fields import MalformedFields, check_request, check_trailers
from tests.example_budget import examples

Fields = list[tuple[bytes, bytes]]

_NAMES = [
    b":method", b":scheme", b":authority", b":path", b":protocol", b":status", b":x", b":",
    b"host", b"te", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
    b"upgrade", b"cookie", b"content-length", b"x-a", b"Accept", b"a:b", b"a b", b"a\nb",
    b"a\x7f", b"\xe9", b"", b"x-\x00", b"~!#$%&'*+-.^_`|", b"a(b)",
]  # fmt: skip
_VALUES = [
    b"GET", b"CONNECT", b"POST", b"https", b"websocket", b"/", b"/a?b", b"", b"example.com",
    b"other.example", b"trailers", b"Trailers", b"gzip", b" x", b"x ", b"\tx", b"x\t", b"a b",
    b"a\rb", b"a\nb", b"a\x00b", b"\x01", b"\xff\xfe", b"a\n", b"\n", b"3", b"03", b"-1",
]  # fmt: skip

_LENGTHS = [b"3", b"03", b"4", b"-1", b"", b"3 ", b"+3", b"0x3", b"\xd9\xa3"]
_name = st.one_of(st.sampled_from(_NAMES), st.binary(max_size=6))
_value = st.one_of(st.sampled_from(_VALUES), st.sampled_from(_VALUES), st.binary(max_size=6))
_field = st.tuples(_name, _value)
_GOOD_FIELDS = st.lists(
    st.sampled_from(
        [(b"accept", b"*/*"), (b"cookie", b"a=1"), (b"cookie", b""), (b"te", b"trailers"),
         (b"te", b"Trailers"), (b"user-agent", b"Mozilla/5.0 (X11)"), (b"x-empty", b""),
         (b"content-length", b"3"), (b"content-length", b"4"), (b"content-length", b"003"),
         (b"host", b"example.com")]
    ),
    max_size=5,
)  # fmt: skip


@st.composite
def _request_like(draw: st.DrawFn) -> Fields:
    """A well-formed request (a GET, a CONNECT or an extended CONNECT, its
    pseudo-headers in any order), then none, one or two faults: a field put
    anywhere, a name or a value replaced, a value emptied, a field dropped or
    repeated, a content-length added."""
    kind = draw(st.sampled_from(["get", "connect", "extended"]))
    method = b"GET" if kind == "get" else b"CONNECT"
    pseudo = [(b":method", method), (b":authority", b"example.com")]
    if kind != "connect":
        pseudo += [(b":scheme", b"https"), (b":path", b"/a?b")]
    if kind == "extended":
        pseudo.append((b":protocol", b"websocket"))
    fields = draw(st.permutations(pseudo)) + draw(_GOOD_FIELDS)
    for _ in range(draw(st.integers(0, 2))):
        fault = draw(
            st.sampled_from(["insert", "name", "value", "empty", "drop", "repeat", "length"])
        )
        at = draw(st.integers(0, len(fields) - 1))
        name, value = fields[at]
        if fault == "insert":
            fields.insert(draw(st.integers(0, len(fields))), draw(_field))
        elif fault == "name":
            fields[at] = (draw(_name), value)
        elif fault == "value":
            fields[at] = (name, draw(_value))
        elif fault == "empty":
            fields[at] = (name, b"")
        elif fault == "length":
            fields.append((b"content-length", draw(st.sampled_from(_LENGTHS))))
        elif fault == "drop":
            del fields[at]
        else:
            fields.insert(draw(st.integers(0, len(fields))), (name, value))
        if not fields:
            break
    return fields


def _h2_refuses(fields: Fields, *, trailer: bool) -> bool:
    flags = h2.utilities.HeaderValidationFlags(
        is_client=False, is_trailer=trailer, is_response_header=False, is_push_promise=False
    )
    try:
        list(h2.utilities.validate_headers(fields, flags))
        if not trailer:  # what h2 does with a request's content-length, which the edge turns off
            h2.stream.H2Stream(1, _CONFIG, 65535, 65535)._initialize_content_length(fields)
    except h2.exceptions.ProtocolError:
        return True
    return False


_CONFIG = h2.config.H2Configuration(client_side=False)


def _we_refuse(check: Callable[[Sequence[tuple[bytes, bytes]]], object], fields: Fields) -> bool:
    try:
        check(fields)
    except MalformedFields:
        return True
    return False


@settings(max_examples=examples(3000), deadline=None)
@given(st.one_of(_request_like(), st.lists(_field, max_size=8)))
def test_requests_are_refused_exactly_when_h2_refuses_them(fields: Fields) -> None:
    assert _we_refuse(check_request, fields) == _h2_refuses(fields, trailer=False), fields


@settings(max_examples=examples(1500), deadline=None)
@given(st.one_of(_request_like(), st.lists(_field, max_size=8)))
def test_trailers_are_refused_exactly_when_h2_refuses_them(fields: Fields) -> None:
    assert _we_refuse(check_trailers, fields) == _h2_refuses(fields, trailer=True), fields
