"""ResponseReader framing, WebSocket switches, EOF semantics; canned responses."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence

import httptools
import pytest

from edge.http1 import (
    BackendClosed,
    HttpLimits,
    ResponseBodyReceived,
    ResponseCompleted,
    ResponseHeadReceived,
    ResponseInvalid,
    ResponseReader,
    TunnelBytes,
    WebSocketAccepted,
    WebSocketRefused,
    closing_head,
    error_response,
    https_location,
    redirect_response,
    reusable_head,
    websocket_accept,
    with_field,
)

WS_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="
WS_ACCEPT = b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # RFC 6455 §1.3


def make_reader(
    *requests: tuple[bytes, bytes | None], limits: HttpLimits | None = None
) -> ResponseReader:
    reader = ResponseReader(limits or HttpLimits())
    for method, key in requests or ((b"GET", None),):
        reader.expect(method, key)
    return reader


def response(status_line: bytes, *fields: bytes, body: bytes = b"") -> bytes:
    return b"\r\n".join([status_line, *fields]) + b"\r\n\r\n" + body


def forwarded(events: Sequence[object]) -> bytes:
    """What the edge writes to the client: heads and bodies, in order."""
    out = b""
    for event in events:
        if isinstance(event, ResponseHeadReceived):
            out += event.head
        elif isinstance(event, ResponseBodyReceived | TunnelBytes):
            out += event.data
    return out


def head_of(events: Sequence[object]) -> ResponseHeadReceived:
    heads = [e for e in events if isinstance(e, ResponseHeadReceived)]
    assert len(heads) == 1, events
    return heads[0]


def invalid(events: Sequence[object]) -> ResponseInvalid:
    assert events and isinstance(events[-1], ResponseInvalid), events
    return events[-1]


# Content-Length -------------------------------------------------------------------------


def test_content_length_response_is_forwarded_raw() -> None:
    data = response(
        b"HTTP/1.1 200 OK", b"Content-Type: text/plain", b"Content-Length: 5", body=b"hello"
    )
    events = make_reader().feed(data)
    head = head_of(events)
    assert (head.status, head.reason, head.http_version) == (200, b"OK", b"1.1")
    assert head.content_length == 5 and not head.chunked and head.keep_alive
    assert head.headers == ((b"content-type", b"text/plain"), (b"content-length", b"5"))
    assert head.head == data[:-5]
    assert events[1:] == [ResponseBodyReceived(b"hello"), ResponseCompleted(close_after=False)]
    assert forwarded(events) == data


def test_content_length_body_across_feeds_and_next_response() -> None:
    reader = make_reader((b"GET", None), (b"GET", None))
    first = response(b"HTTP/1.1 200 OK", b"Content-Length: 6", body=b"abcdef")
    second = response(b"HTTP/1.1 404 Not Found", b"Content-Length: 0")
    events = reader.feed(first[:-4])
    assert events[-1] == ResponseBodyReceived(b"ab")
    assert reader.outstanding == 2
    events = reader.feed(first[-4:] + second)
    assert events[0] == ResponseBodyReceived(b"cdef")
    assert events[1] == ResponseCompleted(close_after=False)
    assert head_of(events[2:]).status == 404
    assert events[-1] == ResponseCompleted(close_after=False)
    assert reader.outstanding == 0


def test_zero_content_length_completes_at_once() -> None:
    events = make_reader().feed(response(b"HTTP/1.1 200 OK", b"Content-Length: 0"))
    assert events[-1] == ResponseCompleted(close_after=False)


def test_connection_close_response_closes_after_and_drops_extra_bytes() -> None:
    reader = make_reader((b"GET", None), (b"GET", None))
    data = response(b"HTTP/1.1 200 OK", b"Connection: close", b"Content-Length: 1", body=b"x")
    events = reader.feed(data + b"HTTP/1.1 200 OK\r\n")
    assert not head_of(events).keep_alive
    assert events[-1] == ResponseCompleted(close_after=True)
    assert reader.feed(b"more") == []
    assert reader.feed_eof() == [BackendClosed(before_response=True, mid_response=False)]


# Chunked --------------------------------------------------------------------------------


def test_chunked_response_is_forwarded_raw_with_extensions_and_trailers() -> None:
    body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n"
    data = response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", body=body)
    events = make_reader().feed(data + b"junk-after-is-next-response?")[:3]
    head = head_of(events)
    assert head.chunked and head.content_length is None and head.keep_alive
    assert events[1:] == [ResponseBodyReceived(body), ResponseCompleted(close_after=False)]


def test_decoded_chunked_response_hands_its_trailers_over_however_split() -> None:
    body = b"5\r\nhello\r\n0\r\nX-Sum: 77\r\nServer-Timing:  db;dur=5 \r\n\r\n"
    data = response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", body=body)
    for split in (len(data), 1):
        reader = ResponseReader(HttpLimits(), decode_chunked=True)
        reader.expect(b"GET", None)
        events: list[object] = []
        for index in range(0, len(data), split):
            events += reader.feed(data[index : index + split])
        payload = b"".join(e.data for e in events if isinstance(e, ResponseBodyReceived))
        assert payload == b"hello"
        assert events[-1] == ResponseCompleted(
            close_after=False, trailers=((b"x-sum", b"77"), (b"server-timing", b"db;dur=5"))
        )


def test_decoded_chunked_body_of_several_chunks_in_one_read_is_the_payload() -> None:
    body = b"3\r\nabc\r\n2;x=1\r\nde\r\n1\r\nf\r\n0\r\n\r\n"
    data = response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", body=body)
    reader = ResponseReader(HttpLimits(), decode_chunked=True)
    reader.expect(b"GET", None)
    events = reader.feed(data)
    assert events[1:] == [ResponseBodyReceived(b"abcdef"), ResponseCompleted(close_after=False)]


def test_decoded_trailer_values_keep_their_colons_and_letters() -> None:
    body = b"1\r\na\r\n0\r\nLink: <https://x.test:8443/a>; rel=preload\r\nX-Tag:\tXmaxX\r\n\r\n"
    data = response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", body=body)
    reader = ResponseReader(HttpLimits(), decode_chunked=True)
    reader.expect(b"GET", None)
    assert reader.feed(data)[-1] == ResponseCompleted(
        close_after=False,
        trailers=((b"link", b"<https://x.test:8443/a>; rel=preload"), (b"x-tag", b"XmaxX")),
    )


def test_chunked_response_in_two_reads_forwards_same_bytes_at_every_split() -> None:
    trailers = b"X-Checksum: " + b"c" * 60 + b"\r\nX-Other: 1\r\n\r\n"
    body = b"5\r\nhello\r\n0\r\n" + trailers
    data = response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", body=body)
    for split in range(1, len(data)):
        reader = make_reader()
        events = reader.feed(data[:split]) + reader.feed(data[split:])
        assert forwarded(events) == data, split
        assert events[-1] == ResponseCompleted(close_after=False), split


def test_chunked_response_byte_at_a_time_forwards_same_bytes() -> None:
    body = b"5\r\nhello\r\n0\r\n\r\n"
    data = response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", body=body)
    reader = make_reader()
    events: list[object] = []
    for index in range(len(data)):
        events += reader.feed(data[index : index + 1])
    assert forwarded(events) == data
    assert events[-1] == ResponseCompleted(close_after=False)
    assert sum(isinstance(e, ResponseCompleted) for e in events) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhelloX\r\n0\r\n\r\n",
        b"5 \r\nhello\r\n0\r\n\r\n",
        b"1" * 17,
    ],
    ids=["hex-prefix", "no-crlf", "space", "too-many-digits"],
)
def test_bad_chunked_framing_from_backend_is_invalid(body: bytes) -> None:
    data = response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", body=body)
    invalid(make_reader().feed(data))


def test_transfer_coding_not_ending_in_chunked_runs_to_eof() -> None:
    reader = make_reader()
    events = reader.feed(response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: gzip", body=b"zz"))
    head = head_of(events)
    assert not head.chunked and not head.keep_alive
    assert events[-1] == ResponseBodyReceived(b"zz")
    assert reader.feed_eof() == [
        ResponseCompleted(close_after=True),
        BackendClosed(before_response=False, mid_response=False),
    ]


# EOF-delimited and persistence ----------------------------------------------------------


def test_response_without_length_is_delimited_by_eof() -> None:
    reader = make_reader()
    events = reader.feed(response(b"HTTP/1.1 200 OK", b"Content-Type: text/html", body=b"<p>"))
    head = head_of(events)
    assert not head.keep_alive and head.content_length is None
    assert reader.feed(b"more") == [ResponseBodyReceived(b"more")]
    assert reader.feed_eof() == [
        ResponseCompleted(close_after=True),
        BackendClosed(before_response=False, mid_response=False),
    ]


def test_http10_response_persistence() -> None:
    events = make_reader().feed(response(b"HTTP/1.0 200 OK", b"Content-Length: 1", body=b"x"))
    assert not head_of(events).keep_alive
    assert events[-1] == ResponseCompleted(close_after=True)
    events = make_reader().feed(
        response(b"HTTP/1.0 200 OK", b"Connection: keep-alive", b"Content-Length: 1", body=b"x")
    )
    assert head_of(events).keep_alive
    assert events[-1] == ResponseCompleted(close_after=False)


# Bodiless responses ---------------------------------------------------------------------


def test_head_response_has_no_body_despite_content_length() -> None:
    reader = make_reader((b"HEAD", None), (b"GET", None))
    first = response(b"HTTP/1.1 200 OK", b"Content-Length: 1000")
    second = response(b"HTTP/1.1 200 OK", b"Content-Length: 2", body=b"ok")
    events = reader.feed(first + second)
    heads = [e for e in events if isinstance(e, ResponseHeadReceived)]
    assert [h.content_length for h in heads] == [1000, 2]
    assert events[1] == ResponseCompleted(close_after=False)
    assert forwarded(events) == first + second


@pytest.mark.parametrize("status", [204, 304])
def test_204_and_304_have_no_body(status: int) -> None:
    reader = make_reader((b"GET", None), (b"GET", None))
    first = response(b"HTTP/1.1 %d X" % status, b"Content-Length: 50")
    second = response(b"HTTP/1.1 200 OK", b"Content-Length: 0")
    events = reader.feed(first + second)
    assert [type(e) for e in events] == [
        ResponseHeadReceived,
        ResponseCompleted,
        ResponseHeadReceived,
        ResponseCompleted,
    ]


# Interim responses ----------------------------------------------------------------------


def test_100_continue_and_103_are_forwarded_without_completing() -> None:
    reader = make_reader((b"POST", None))
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" + response(
        b"HTTP/1.1 103 Early Hints", b"Link: </s.css>"
    )
    events = reader.feed(interim)
    assert [e.status for e in events if isinstance(e, ResponseHeadReceived)] == [100, 103]
    assert all(e.informational for e in events if isinstance(e, ResponseHeadReceived))
    assert not any(isinstance(e, ResponseCompleted) for e in events)
    assert reader.outstanding == 1
    assert reader.feed_eof() == [BackendClosed(before_response=False, mid_response=True)]


def test_final_response_after_interim_completes_the_request() -> None:
    reader = make_reader((b"POST", None))
    data = b"HTTP/1.1 100 Continue\r\n\r\n" + response(
        b"HTTP/1.1 201 Created", b"Content-Length: 0"
    )
    events = reader.feed(data)
    assert events[-1] == ResponseCompleted(close_after=False)
    assert forwarded(events) == data
    assert reader.feed_eof() == [BackendClosed(before_response=False, mid_response=False)]


# WebSocket switch -----------------------------------------------------------------------


def switching(accept: bytes | None = WS_ACCEPT, *extra: bytes, version: bytes = b"1.1") -> bytes:
    fields = [b"Upgrade: websocket", b"Connection: Upgrade", *extra]
    if accept is not None:
        fields.append(b"Sec-WebSocket-Accept: " + accept)
    return response(b"HTTP/" + version + b" 101 Switching Protocols", *fields)


def test_websocket_accept_matches_rfc_example() -> None:
    assert websocket_accept(WS_KEY) == WS_ACCEPT
    other = b"x3JJHMbDL1EzLkh9GBhXDw=="
    expected = base64.b64encode(
        hashlib.sha1(other + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
    )
    assert websocket_accept(other) == expected


def test_valid_101_switches_to_tunnel_bytes() -> None:
    reader = make_reader((b"GET", WS_KEY))
    events = reader.feed(switching() + b"\x81\x02hi")
    head = head_of(events)
    assert head.status == 101 and head.head == switching()
    assert events[1] == WebSocketAccepted()
    assert events[2] == TunnelBytes(b"\x81\x02hi")
    assert reader.feed(b"HTTP/1.1 200 OK\r\n\r\n") == [TunnelBytes(b"HTTP/1.1 200 OK\r\n\r\n")]
    assert reader.feed_eof() == [BackendClosed(before_response=False, mid_response=False)]


@pytest.mark.parametrize(
    "data",
    [
        switching(websocket_accept(b"x3JJHMbDL1EzLkh9GBhXDw==")),
        switching(None),
        switching(WS_ACCEPT, b"Sec-WebSocket-Accept: " + WS_ACCEPT),
        switching(WS_ACCEPT).replace(b"Upgrade: websocket", b"Upgrade: h2c"),
        switching(WS_ACCEPT).replace(b"Connection: Upgrade", b"Connection: keep-alive"),
        switching(WS_ACCEPT, version=b"1.0"),
    ],
    ids=["wrong-accept", "no-accept", "two-accepts", "wrong-upgrade", "no-connection", "http10"],
)
def test_bad_101_is_refused_without_forwarding_anything(data: bytes) -> None:
    reader = make_reader((b"GET", WS_KEY))
    events = reader.feed(data + b"\x81\x02hi")
    assert events == [WebSocketRefused(101)]
    assert reader.feed(b"more") == []
    assert reader.feed_eof() == []


def test_101_to_a_request_without_upgrade_is_invalid_and_says_so() -> None:
    events = make_reader().feed(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
    assert invalid(events).reason == "101 to a request that asked for no upgrade"


def test_101_to_a_request_without_upgrade_is_invalid() -> None:
    invalid(make_reader((b"GET", None)).feed(switching()))


def test_refused_upgrade_by_ordinary_response_continues() -> None:
    reader = make_reader((b"GET", WS_KEY), (b"GET", None))
    events = reader.feed(response(b"HTTP/1.1 403 Forbidden", b"Content-Length: 0"))
    assert head_of(events).status == 403
    assert events[-1] == ResponseCompleted(close_after=False)
    events = reader.feed(response(b"HTTP/1.1 200 OK", b"Content-Length: 0"))
    assert head_of(events).status == 200


# Invalid responses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"garbage\r\n\r\n",
        b"\x00\x01\x02\r\n",
        b"HTTP/2.0 200 OK\r\n\r\n",
        b"HTTP/1.1 099 Low\r\n\r\n",
        b"HTTP/1.1 999 High\r\n\r\n",
        b"HTTP/1.1 600 Nope\r\n\r\n",
        b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        response(b"HTTP/1.1 200 OK", b"Content-Length: 1", b"Transfer-Encoding: chunked"),
        response(b"HTTP/1.1 200 OK", b"Content-Length: 1", b"Content-Length: 1"),
        response(b"HTTP/1.1 200 OK", b"Content-Length: +1"),
        response(b"HTTP/1.1 200 OK", b"Content-Length: 1000000000000000000"),
        response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked, gzip"),
        response(b"HTTP/1.0 200 OK", b"Transfer-Encoding: chunked"),
        response(b"HTTP/1.1 200 OK", b"X: a\x00b"),
        response(b"HTTP/1.1 200 OK", b"X: a", b" folded"),
        b"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
    ],
    ids=[
        "garbage",
        "binary",
        "http2",
        "status-low",
        "status-999",
        "status-600",
        "leading-crlf",
        "cl-and-te",
        "cl-cl",
        "cl-plus",
        "cl-19-digits",
        "chunked-not-final",
        "te-in-http10",
        "nul",
        "obs-fold",
        "bare-lf",
    ],
)
def test_invalid_responses(data: bytes) -> None:
    reader = make_reader()
    events = reader.feed(data)
    invalid(events)
    assert not any(isinstance(e, ResponseCompleted) for e in events)
    assert reader.feed(b"HTTP/1.1 200 OK\r\n\r\n") == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"HTTP/1.1 600 Nope\r\n\r\n", "invalid status code 600"),
        (
            response(b"HTTP/1.1 200 OK", b"Content-Length: 1000000000000000000"),
            "invalid Content-Length",
        ),
        (
            response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked, gzip"),
            "chunked is not the final transfer coding",
        ),
        (
            response(b"HTTP/1.0 200 OK", b"Transfer-Encoding: chunked"),
            "Transfer-Encoding in an HTTP/1.0 response",
        ),
    ],
)
def test_an_invalid_response_names_its_fault(data: bytes, reason: str) -> None:
    """The reason is what the edge logs when it answers 502: the operator's clue."""
    assert invalid(make_reader().feed(data)).reason == reason


def test_the_whole_status_range_is_accepted() -> None:
    for status in (100, 599):
        reader = make_reader()
        events = reader.feed(b"HTTP/1.1 %d Edge\r\nContent-Length: 0\r\n\r\n" % status)
        assert not any(isinstance(e, ResponseInvalid) for e in events), events
        assert head_of(events).status == status


def test_field_values_lose_only_their_surrounding_whitespace() -> None:
    events = make_reader().feed(
        response(b"HTTP/1.1 200 OK", b"X-Id: \tXabcX ", b"ETag: X", b"Content-Length: 0")
    )
    assert head_of(events).headers[:2] == ((b"x-id", b"XabcX"), (b"etag", b"X"))


def test_the_end_of_a_body_is_or_is_not_the_connection_close() -> None:
    """``close_delimited``: only the backend's close ends this body, so the edge
    must close the client connection after it (it cannot say where it ends)."""
    until_eof = make_reader().feed(response(b"HTTP/1.1 200 OK", body=b"x"))
    framed = make_reader().feed(response(b"HTTP/1.1 200 OK", b"Content-Length: 1", body=b"x"))
    assert head_of(until_eof).close_delimited
    assert not head_of(framed).close_delimited


def test_unsolicited_response_is_invalid() -> None:
    reader = ResponseReader(HttpLimits())
    assert invalid(reader.feed(b"HTTP/1.1 200 OK\r\n\r\n")).reason.startswith("response bytes")


def test_response_head_limit() -> None:
    reader = make_reader(limits=HttpLimits(max_header_bytes=100))
    events = reader.feed(b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * 200)
    invalid(events)
    assert reader.buffered_bytes == 0


def test_response_header_count_limit() -> None:
    fields = [b"Set-Cookie: c%d=1" % i for i in range(6)]
    events = make_reader(limits=HttpLimits(max_headers=5)).feed(
        response(b"HTTP/1.1 200 OK", *fields)
    )
    invalid(events)


# Backend EOF ----------------------------------------------------------------------------


def test_eof_with_request_outstanding_and_no_byte_is_before_response() -> None:
    assert make_reader().feed_eof() == [BackendClosed(before_response=True, mid_response=False)]


def test_eof_when_idle_is_clean() -> None:
    assert ResponseReader(HttpLimits()).feed_eof() == [
        BackendClosed(before_response=False, mid_response=False)
    ]


def test_eof_after_complete_response_with_next_outstanding() -> None:
    reader = make_reader((b"GET", None), (b"GET", None))
    reader.feed(response(b"HTTP/1.1 200 OK", b"Content-Length: 0"))
    assert reader.feed_eof() == [BackendClosed(before_response=True, mid_response=False)]


def test_eof_inside_head_is_mid_response() -> None:
    reader = make_reader()
    assert reader.feed(b"HTTP/1.1 200 OK\r\nContent-") == []
    assert reader.feed_eof() == [BackendClosed(before_response=False, mid_response=True)]


def test_eof_inside_body_is_mid_response() -> None:
    reader = make_reader()
    reader.feed(response(b"HTTP/1.1 200 OK", b"Content-Length: 10", body=b"abc"))
    assert reader.feed_eof() == [BackendClosed(before_response=False, mid_response=True)]
    assert reader.feed_eof() == []
    assert reader.feed(b"x") == []


def test_eof_inside_chunked_body_is_mid_response() -> None:
    reader = make_reader()
    reader.feed(response(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", body=b"5\r\nab"))
    assert reader.feed_eof() == [BackendClosed(before_response=False, mid_response=True)]


# Canned responses -----------------------------------------------------------------------


def parse_response(data: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    fields: dict[bytes, bytes] = {}
    body = bytearray()
    complete = []

    class Collector:
        def on_header(self, name: bytes, value: bytes) -> None:
            fields[name.lower()] = value

        def on_body(self, chunk: bytes) -> None:
            body.extend(chunk)

        def on_message_complete(self) -> None:
            complete.append(True)

    parser = httptools.HttpResponseParser(Collector())
    parser.feed_data(data)
    assert complete == [True]
    return parser.get_status_code(), fields, bytes(body)


@pytest.mark.parametrize("status", [400, 413, 414, 431, 501, 502, 503, 504, 505])
def test_error_response_is_complete_and_closes(status: int) -> None:
    data = error_response(status, request_id="abc-123")
    code, fields, body = parse_response(data)
    assert code == status
    assert fields[b"connection"] == b"close"
    assert fields[b"x-request-id"] == b"abc-123"
    assert fields[b"content-type"].startswith(b"text/plain")
    assert int(fields[b"content-length"]) == len(body)
    assert body.startswith(b"%d " % status)


def test_error_response_with_custom_body_and_keep_alive() -> None:
    data = error_response(503, close=False, body="busy, retry\n")
    code, fields, body = parse_response(data)
    assert (code, body) == (503, b"busy, retry\n")
    assert b"connection" not in fields and b"x-request-id" not in fields


@pytest.mark.parametrize("status", [200, 301, 399, 600, 99])
def test_error_response_rejects_non_error_status(status: int) -> None:
    with pytest.raises(ValueError, match="4xx or 5xx"):
        error_response(status)


def test_error_response_rejects_injected_request_id() -> None:
    with pytest.raises(ValueError, match="request_id"):
        error_response(400, request_id="a\r\nSet-Cookie: x=1")


def test_redirect_response() -> None:
    data = redirect_response("https://example.com/path?q=1")
    code, fields, _ = parse_response(data)
    assert code == 301
    assert fields[b"location"] == b"https://example.com/path?q=1"
    assert fields[b"connection"] == b"close"


@pytest.mark.parametrize("location", ["", "https://a/\r\nX: y", "https://a/ b", "https://é/"])
def test_redirect_response_rejects_unsafe_locations(location: str) -> None:
    with pytest.raises(ValueError, match="location"):
        redirect_response(location)


def test_eof_after_closing_response_reports_queued_requests_as_unanswered() -> None:
    reader = make_reader((b"GET", None), (b"GET", None))
    events = reader.feed(response(b"HTTP/1.1 200 OK", b"Connection: close", b"Content-Length: 0"))
    assert events[-1] == ResponseCompleted(close_after=True)
    assert reader.feed_eof() == [BackendClosed(before_response=True, mid_response=False)]


# -- keep-alive reuse: where the backend connection stands (PROTOCOL.md §6.5.1) --------


def test_at_boundary_only_between_complete_kept_alive_responses() -> None:
    reader = make_reader()
    assert not reader.at_boundary  # a request is outstanding
    whole = response(b"HTTP/1.1 200 OK", b"Content-Length: 5", body=b"hello")
    reader.feed(whole[:-2])
    assert not reader.at_boundary  # mid-body
    reader.feed(whole[-2:])
    assert reader.at_boundary
    reader.expect(b"GET", None)
    reader.feed(b"HTTP/1.1 200 OK\r\n")  # part of the next head
    reader.feed(b"Content-Length: 0\r\n\r\n")
    assert reader.at_boundary


@pytest.mark.parametrize(
    "answer",
    [
        response(b"HTTP/1.1 200 OK", b"Connection: close", b"Content-Length: 0"),
        response(b"HTTP/1.1 200 OK", body=b"until the close"),  # no framing
        response(b"HTTP/1.0 200 OK", b"Content-Length: 0"),  # 1.0 without keep-alive
    ],
)
def test_a_response_that_ends_the_connection_is_never_a_boundary(answer: bytes) -> None:
    reader = make_reader()
    reader.feed(answer)
    assert not reader.at_boundary


def test_a_closed_backend_is_never_a_boundary() -> None:
    reader = make_reader()
    reader.feed(response(b"HTTP/1.1 204 No Content"))
    assert reader.at_boundary
    reader.feed_eof()
    assert not reader.at_boundary


def test_closing_head_replaces_the_backends_persistence_fields() -> None:
    head = response(
        b"HTTP/1.1 200 OK",
        b"Content-Type: text/plain",
        b"connection: keep-alive",
        b"Keep-Alive: timeout=5",
        b"Content-Length: 2",
    )
    assert closing_head(head) == response(
        b"HTTP/1.1 200 OK", b"Content-Type: text/plain", b"Content-Length: 2", b"Connection: close"
    )
    # What llhttp parses of the result: the same status and framing, closing.
    events = make_reader().feed(closing_head(head) + b"ok")
    assert head_of(events).status == 200 and not head_of(events).keep_alive
    assert ResponseCompleted(close_after=True) in events


def test_reusable_head_drops_every_field_about_the_backend_connection() -> None:
    head = response(
        b"HTTP/1.1 200 OK",
        b"Connection: keep-alive",
        b"Connection-Id: 7",  # another field whose name merely starts the same
        b"KEEP-ALIVE : timeout=5,",
        b" max=100",  # obs-fold: the rest of the Keep-Alive field
        b"Keep-Alive-Hint: 1",
        b"Proxy-Connection: keep-alive",
        b"Content-Length: 2",
    )
    assert reusable_head(head) == response(
        b"HTTP/1.1 200 OK", b"Connection-Id: 7", b"Keep-Alive-Hint: 1", b"Content-Length: 2"
    )


def test_fields_connection_names_are_dropped_but_the_framing() -> None:
    fields = (b"Connection: Keep-Alive, X-Slot, content-length", b"X-Slot: 3")
    tail = (b"X-Kept: 1", b"Content-Length: 2")
    head = response(b"HTTP/1.1 200 OK", *fields, *tail)
    event = head_of(make_reader().feed(head + b"ok"))
    assert event.nominated == {b"x-slot"}
    kept = response(b"HTTP/1.1 200 OK", *tail)
    assert reusable_head(head, event.nominated) == kept
    assert closing_head(head, event.nominated) == kept[:-2] + b"Connection: close\r\n\r\n"
    # llhttp refuses obs-fold; were one to pass, it goes with its field.
    folded = response(b"HTTP/1.1 200 OK", *fields, b"\t4", *tail)
    assert reusable_head(folded, event.nominated) == kept


def test_connection_naming_only_its_own_fields_nominates_them() -> None:
    for options in (b"X-Slot", b"X-Slot, X-Lane"):
        head = response(
            b"HTTP/1.1 200 OK", b"Connection: " + options, b"X-Slot: 3", b"X-Lane: 1", b"X: 1"
        )
        event = head_of(make_reader().feed(head))
        assert b"x-slot" in event.nominated
        assert reusable_head(head, event.nominated).count(b"X-Slot") == 0


def test_reusable_head_keeps_the_status_line_and_last_value_whole() -> None:
    """Taking out nominated fields leaves every other byte: an empty reason
    phrase keeps the space before it, a value ending in X keeps its X."""
    head = response(b"HTTP/1.1 200 ", b"X-Slot: 3", b"X-Tail: ZX")
    assert reusable_head(head, frozenset({b"x-slot"})) == response(b"HTTP/1.1 200 ", b"X-Tail: ZX")
    head = response(b"HTTP/1.1 200 OX", b"X-Slot: 3", b"X-Tail: 1")
    assert reusable_head(head, frozenset({b"x-slot"})) == response(b"HTTP/1.1 200 OX", b"X-Tail: 1")
    # a value with a colon in it: the field's name ends at the first one
    head = response(b"HTTP/1.1 200 OK", b"X-Slot: backend-7:8080", b"X-Tail: 1")
    assert reusable_head(head, frozenset({b"x-slot"})) == response(b"HTTP/1.1 200 OK", b"X-Tail: 1")


def test_with_field_puts_the_field_first_and_leaves_the_rest() -> None:
    """HSTS and the edge's own Connection go right after the status line (the
    first of a repeated field wins), nothing else moves."""
    whole = response(b"HTTP/1.1 200 OK", b"Content-Length: 2", body=b"ok")
    assert with_field(whole, b"Strict-Transport-Security: max-age=60") == response(
        b"HTTP/1.1 200 OK",
        b"Strict-Transport-Security: max-age=60",
        b"Content-Length: 2",
        body=b"ok",
    )


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (b"no status line", b"X: 1"),
        (b"HTTP/1.1 200 OK\r\n\r\n", b"X: 1\r\nSet-Cookie: a=1"),
        (b"HTTP/1.1 200 OK\r\n\r\n", b"X: 1\rY"),
        (b"HTTP/1.1 200 OK\r\n\r\n", b"X: 1\nY"),
    ],
    ids=["no-status-line", "crlf", "cr", "lf"],
)
def test_with_field_refuses_a_field_that_would_split_the_head(data: bytes, field: bytes) -> None:
    with pytest.raises(ValueError, match=r"^with_field needs a response with a status line"):
        with_field(data, field)


def test_a_response_without_connection_options_nominates_nothing() -> None:
    event = head_of(make_reader().feed(response(b"HTTP/1.1 200 OK", b"Content-Length: 0")))
    assert event.nominated == frozenset()


@pytest.mark.parametrize(
    ("host", "port", "location"),
    [
        ("shop.example", 443, "https://shop.example/a?b=1"),
        ("shop.example:8080", 443, "https://shop.example/a?b=1"),
        ("shop.example:8080", 8443, "https://shop.example:8443/a?b=1"),
        ("192.0.2.7:80", 443, "https://192.0.2.7/a?b=1"),
        ("[2001:db8::1]", 443, "https://[2001:db8::1]/a?b=1"),
        ("[2001:db8::1]:8080", 443, "https://[2001:db8::1]/a?b=1"),
        ("[::1]:80", 8443, "https://[::1]:8443/a?b=1"),
    ],
)
def test_https_location_keeps_the_name_and_swaps_the_port(
    host: str, port: int, location: str
) -> None:
    assert https_location(host, "/a?b=1", port) == location


@pytest.mark.parametrize(
    ("host", "target"),
    [(None, "/"), ("", "/"), ("a.example", "*"), ("a.example", "http://x/"), ("[::1", "/")],
)
def test_https_location_needs_a_host_and_an_origin_form_target(
    host: str | None, target: str
) -> None:
    assert https_location(host, target, 443) is None
