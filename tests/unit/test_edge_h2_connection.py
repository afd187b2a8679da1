"""The edge's HTTP/2 front end on fake transports: frames a real h2 client
reads, for responses delivered the way the tunnel delivers them; every test
on each HTTP/2 engine (tests/h2_engines.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import h2.stream
import hyperframe.frame
import pytest

from edge.front_h2 import Http2Connection
from edge.h2_floods import LIMITS
from tests.conftest import run_async
from tests.edge_fakes import FakeClientTransport, FakeServices, FakeStream

pytestmark = pytest.mark.usefixtures("h2_engine")

REQUEST = [(b":method", b"GET"), (b":path", b"/a"), (b":scheme", b"https"), (b":authority", b"e")]
SMALL = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"


def _frames(data: bytes) -> list[hyperframe.frame.Frame]:
    frames = []
    while data:
        frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9 : 9 + length]))
        frames.append(frame)
        data = data[9 + length :]
    return frames


async def _connect(
    stream_window: int = 65535,
) -> tuple[Http2Connection, FakeClientTransport, FakeServices, h2.connection.H2Connection]:
    services = FakeServices()
    transport = FakeClientTransport()
    server = Http2Connection(services, trusted=False)
    server.connection_made(transport)
    client = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    client.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: stream_window}
    )
    client.initiate_connection()
    server.data_received(client.data_to_send())
    await asyncio.sleep(0)
    client.receive_data(transport.take())
    server.data_received(client.data_to_send())  # the SETTINGS ack
    await asyncio.sleep(0)
    transport.take()
    return server, transport, services, client


async def _one_get(
    stream_window: int = 65535,
) -> tuple[Http2Connection, FakeClientTransport, FakeStream, h2.connection.H2Connection]:
    """A connection with one GET sent up its tunnel stream (not yet answered)."""
    server, transport, services, client = await _connect(stream_window)
    client.send_headers(1, REQUEST, end_stream=True)
    server.data_received(client.data_to_send())
    (stream,) = services.streams
    return server, transport, stream, client


async def _flushed(transport: FakeClientTransport) -> bytes:
    await asyncio.sleep(0)  # the session writes once per turn of the event loop
    await asyncio.sleep(0)
    return transport.take()


async def _response_headers(
    transport: FakeClientTransport, client: h2.connection.H2Connection
) -> list[tuple[bytes, bytes]]:
    """The fields of the response head the client reads on stream 1."""
    frames = [f for f in _frames(await _flushed(transport)) if f.stream_id == 1]
    events = client.receive_data(b"".join(f.serialize() for f in frames))
    (head,) = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
    return list(head.headers)


def test_a_response_read_in_one_piece_ends_on_its_data_frame() -> None:
    async def run() -> None:
        _server, transport, stream, client = await _one_get()
        assert stream.sent.startswith(b"GET /a HTTP/1.1\r\n")
        stream.respond(SMALL)
        frames = [f for f in _frames(await _flushed(transport)) if f.stream_id == 1]
        assert [type(f).__name__ for f in frames] == ["HeadersFrame", "DataFrame"]
        assert frames[1].data == b"hello" and "END_STREAM" in frames[1].flags
        events = client.receive_data(b"".join(f.serialize() for f in frames))
        (head,) = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        assert (b":status", b"200") in head.headers
        assert (b"x-request-id", b"req0001") in head.headers
        assert any(isinstance(e, h2.events.StreamEnded) for e in events)

    run_async(run())


def test_a_body_in_pieces_ends_once_its_last_piece_is_sent() -> None:
    async def run() -> None:
        _server, transport, stream, _client = await _one_get()
        stream.respond(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc")
        first = [f for f in _frames(await _flushed(transport)) if f.stream_id == 1]
        assert [f.data for f in first[1:]] == [b"abc"]
        assert "END_STREAM" not in first[1].flags
        stream.respond(b"def")
        last = [f for f in _frames(await _flushed(transport)) if f.stream_id == 1]
        assert [(f.data, "END_STREAM" in f.flags) for f in last] == [(b"def", True)]

    run_async(run())


def test_a_body_held_by_the_clients_window_ends_when_the_window_opens() -> None:
    async def run() -> None:
        server, transport, stream, client = await _one_get(3)
        stream.respond(SMALL)
        frames = [f for f in _frames(await _flushed(transport)) if f.stream_id == 1]
        assert [(f.data, "END_STREAM" in f.flags) for f in frames[1:]] == [(b"hel", False)]
        client.receive_data(b"".join(f.serialize() for f in frames))
        client.increment_flow_control_window(10, stream_id=1)
        server.data_received(client.data_to_send())
        rest = [f for f in _frames(await _flushed(transport)) if f.stream_id == 1]
        assert b"".join(f.data for f in rest) == b"lo"
        assert "END_STREAM" in rest[-1].flags

    run_async(run())


def _upload_with_trailers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """What goes up the tunnel for a POST whose body is followed by trailers."""

    async def run() -> bytes:
        server, _transport, services, client = await _connect()
        post = [(b":method", b"POST"), *REQUEST[1:], *headers]
        client.send_headers(1, post, end_stream=False)
        client.send_data(1, b"hello")
        client.send_headers(
            1, [(b"x-checksum", b"77"), (b"x-forwarded-for", b"6.6.6.6")], end_stream=True
        )
        server.data_received(client.data_to_send())
        (stream,) = services.streams
        return bytes(stream.sent)

    return run_async(run())


def test_trailers_go_up_in_the_last_chunk_through_the_trailer_rules() -> None:
    sent = _upload_with_trailers([])
    assert b"transfer-encoding: chunked\r\n" in sent.lower()
    assert sent.endswith(b"\r\n\r\n5\r\nhello\r\n0\r\nx-checksum: 77\r\n\r\n")


def test_trailers_after_a_body_with_a_length_are_dropped() -> None:
    sent = _upload_with_trailers([(b"content-length", b"5")])
    assert sent.endswith(b"\r\n\r\nhello") and b"x-checksum" not in sent


def test_a_chunked_responses_trailers_end_the_stream_as_trailing_headers() -> None:
    async def run() -> None:
        _server, transport, stream, client = await _one_get()
        stream.respond(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
            b"5\r\nhello\r\n0\r\nX-Sum: 77\r\nConnection: close\r\nContent-Length: 9\r\n\r\n"
        )
        frames = [f for f in _frames(await _flushed(transport)) if f.stream_id == 1]
        kinds = [(type(f).__name__, "END_STREAM" in f.flags) for f in frames]
        assert kinds == [("HeadersFrame", False), ("DataFrame", False), ("HeadersFrame", True)]
        events = client.receive_data(b"".join(f.serialize() for f in frames))
        (trailers,) = [e for e in events if isinstance(e, h2.events.TrailersReceived)]
        assert trailers.headers == [(b"x-sum", b"77")]  # no connection-specific field

    run_async(run())


def test_fields_the_backends_connection_names_are_not_forwarded() -> None:
    async def run() -> None:
        _server, transport, stream, client = await _one_get()
        stream.respond(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Slot\r\nKeep-Alive: timeout=5\r\n"
            b"X-Slot: 3\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\nok"
        )
        headers = await _response_headers(transport, client)
        names = [name for name, _ in headers]
        assert b"x-kept" in names and b"content-length" in names
        assert not {b"x-slot", b"connection", b"keep-alive"} & set(names)
        assert (b"x-request-id", b"req0001") in headers

    run_async(run())


def test_a_request_id_the_backends_connection_names_is_replaced_by_the_edges() -> None:
    async def run() -> None:
        _server, transport, stream, client = await _one_get()
        stream.respond(
            b"HTTP/1.1 200 OK\r\nConnection: x-request-id\r\nX-Request-Id: backend-7\r\n"
            b"Content-Length: 2\r\n\r\nok"
        )
        headers = await _response_headers(transport, client)
        assert [v for n, v in headers if n == b"x-request-id"] == [b"req0001"]

    run_async(run())


async def _resets(transport: FakeClientTransport) -> list[tuple[int, int]]:
    """The RST_STREAM frames the client reads next: (stream, error code), in order."""
    return [
        (f.stream_id, f.error_code)
        for f in _frames(await _flushed(transport))
        if isinstance(f, hyperframe.frame.RstStreamFrame)
    ]


async def _post_started(
    server: Http2Connection, client: h2.connection.H2Connection, services: FakeServices
) -> FakeStream:
    """Stream 1: a POST whose head and first DATA went up its tunnel stream, not ended."""
    client.send_headers(1, [(b":method", b"POST"), *REQUEST[1:]], end_stream=False)
    client.send_data(1, b"hello")
    server.data_received(client.data_to_send())
    (stream,) = services.streams
    return stream


def _unchecked(client: h2.connection.H2Connection) -> h2.connection.H2Connection:
    """The client sends whatever fields it is given (h2 would refuse them)."""
    client.config.validate_outbound_headers = False
    client.config.normalize_outbound_headers = False
    return client


def test_a_malformed_request_resets_its_stream_and_no_other() -> None:
    async def run() -> None:
        server, transport, services, client = await _connect()
        _unchecked(client).send_headers(1, [*REQUEST, (b"X-Upper", b"1")], end_stream=True)
        client.send_headers(3, [*REQUEST, (b"connection", b"close")], end_stream=True)
        client.send_headers(5, REQUEST, end_stream=True)
        server.data_received(client.data_to_send())
        assert await _resets(transport) == [(1, 1), (3, 1)]  # PROTOCOL_ERROR (RFC 9113 §8.1.1)
        (stream,) = services.streams  # only stream 5 went up the tunnel
        assert stream.metadata.target == "/a"
        assert services.errors == ["h2_malformed", "h2_malformed"]
        assert [(r.outcome, r.reason) for r, _sent in services.logged] == [
            ("rejected", "field name b'X-Upper'"),
            ("rejected", "connection-specific field b'connection'"),
        ]
        assert not transport.is_closing()

    run_async(run())


def test_malformed_trailers_reset_the_stream_and_its_tunnel_stream() -> None:
    async def run() -> None:
        server, transport, services, client = await _connect()
        stream = await _post_started(server, client, services)
        _unchecked(client).send_headers(1, [(b"x-sum", b"7\r\nx-injected: 1")], end_stream=True)
        server.data_received(client.data_to_send())
        assert await _resets(transport) == [(1, 1)]
        assert stream.ended_with is not None  # the request never completes upstream
        assert b"x-injected" not in stream.sent
        ((record, _sent),) = services.logged
        assert (record.outcome, record.reason) == ("rejected", "NUL, CR or LF in a field value")

    run_async(run())


def test_malformed_trailers_after_the_whole_response_close_nothing_else() -> None:
    async def run() -> None:
        server, transport, services, client = await _connect()
        stream = await _post_started(server, client, services)
        stream.respond(SMALL)  # answered before the request's end
        client.receive_data(await _flushed(transport))
        _unchecked(client).send_headers(1, [(b"X-Sum", b"7")], end_stream=True)
        client.send_headers(3, REQUEST, end_stream=True)
        server.data_received(client.data_to_send())
        assert len(services.streams) == 2  # the next request went up
        assert services.errors == ["h2_malformed"]
        assert not transport.is_closing()

    run_async(run())


def _post_with_length(length: bytes) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"POST"), *REQUEST[1:], (b"content-length", length)]


def test_a_body_longer_than_its_content_length_resets_its_stream_and_no_other() -> None:
    async def run() -> None:
        server, transport, services, client = await _connect()
        client.send_headers(1, _post_with_length(b"3"), end_stream=False)
        client.send_data(1, b"hello")  # two octets too many: they must never reach Node
        client.send_headers(3, REQUEST, end_stream=True)
        server.data_received(client.data_to_send())
        assert await _resets(transport) == [(1, 1)]  # PROTOCOL_ERROR (RFC 9113 §8.1.1)
        first, second = services.streams
        assert first.ended_with is not None and b"hel" not in first.sent
        assert second.metadata.target == "/a"
        assert services.errors == ["h2_malformed"]
        ((record, _sent),) = services.logged
        assert record.outcome == "rejected"
        assert record.reason == "body longer than its content-length"
        assert not transport.is_closing()

    run_async(run())


def test_a_body_shorter_than_its_content_length_resets_its_stream_and_no_other() -> None:
    async def run() -> None:
        server, transport, services, client = await _connect()
        client.send_headers(1, _post_with_length(b"9"), end_stream=False)
        client.send_data(1, b"hello", end_stream=True)
        client.send_headers(3, _post_with_length(b"2"), end_stream=True)  # no DATA at all
        client.send_headers(5, _post_with_length(b"0"), end_stream=True)
        server.data_received(client.data_to_send())
        assert await _resets(transport) == [(1, 1), (3, 1)]
        first, second, third = services.streams
        assert first.ended_with is not None and second.ended_with is not None
        assert third.ended_with is None
        assert [r.reason for r, _sent in services.logged] == [
            "body shorter than its content-length"
        ] * 2
        assert not transport.is_closing()

    run_async(run())


def test_a_content_length_that_is_not_one_number_is_a_malformed_request() -> None:
    async def run() -> None:
        server, transport, services, client = await _connect()
        client.send_headers(1, _post_with_length(b"-1"), end_stream=False)
        client.send_headers(3, [*_post_with_length(b"2"), (b"content-length", b"3")])
        client.send_headers(5, [*_post_with_length(b"2"), (b"content-length", b"02")])
        server.data_received(client.data_to_send())
        assert await _resets(transport) == [(1, 1), (3, 1)]
        assert [r.reason for r, _sent in services.logged] == [
            "content-length b'-1'",
            "content-length values differ",
        ]
        (stream,) = services.streams  # the same number twice is one length
        assert stream.sent.lower().count(b"content-length") == 1
        assert b"Content-Length: 2\r\n" in stream.sent
        assert not transport.is_closing()

    run_async(run())


def _send_paused_upload(
    server: Http2Connection,
    client: h2.connection.H2Connection,
    services: FakeServices,
    stream_id: int,
    size: int,
    declared: bytes | None = None,
) -> None:
    """A POST (with a ``declared`` content-length) whose tunnel stream stops
    taking the body, then ``size`` octets of it."""
    head = _post_with_length(declared) if declared else [(b":method", b"POST"), *REQUEST[1:]]
    client.send_headers(stream_id, head, end_stream=False)
    server.data_received(client.data_to_send())
    services.streams[-1].protocol.pause_writing()  # the tunnel stream's credit ran out
    for start in range(0, size, 16384):
        client.send_data(stream_id, b"x" * min(16384, size - start))
    server.data_received(client.data_to_send())


def test_a_reset_streams_unacknowledged_body_goes_back_to_the_connections_window() -> None:
    async def run() -> None:
        server, transport, services, client = await _connect()
        client.receive_data(await _flushed(transport))
        window = client.outbound_flow_control_window
        for stream_id in (1, 3, 5):  # 2.7 MB held by paused uploads, then given up
            _send_paused_upload(server, client, services, stream_id, 900_000)
            client.reset_stream(stream_id)
            server.data_received(client.data_to_send())
        client.receive_data(await _flushed(transport))
        assert client.outbound_flow_control_window == window
        assert all(s.ended_with is not None for s in services.streams)

    run_async(run())


def test_a_refused_bodys_octets_go_back_to_the_connections_window() -> None:
    async def run() -> None:
        server, transport, services, client = await _connect()
        client.receive_data(await _flushed(transport))
        window = client.outbound_flow_control_window
        for stream_id in (1, 3, 5):  # 2.7 MB held by paused uploads, then overrun
            _send_paused_upload(server, client, services, stream_id, 900_000, b"900000")
            client.send_data(stream_id, b"x", end_stream=True)
            server.data_received(client.data_to_send())
        out = await _flushed(transport)
        frames = _frames(out)
        assert [f.stream_id for f in frames if isinstance(f, hyperframe.frame.RstStreamFrame)] == [
            1, 3, 5
        ]  # fmt: skip
        client.receive_data(out)
        assert client.outbound_flow_control_window == window
        assert services.errors == ["h2_malformed"] * 3

    run_async(run())


def test_the_parts_of_h2_the_edge_overrides_are_still_h2s() -> None:
    """edge.h2_connection overrides these; renamed in a later h2, an override
    would silently do nothing and a bad length, or one stream too many, be a
    connection error again."""
    assert {"_initialize_content_length", "_track_content_length"} <= set(vars(h2.stream.H2Stream))
    connection = set(vars(h2.connection.H2Connection))
    assert {"_begin_new_stream", "_receive_headers_frame", "open_inbound_streams"} <= connection


def test_a_body_held_by_the_clients_window_goes_on_when_settings_open_it() -> None:
    """RFC 9113 §6.9.2: a new SETTINGS_INITIAL_WINDOW_SIZE changes every
    open stream's window; h2 reports it as a settings change, not a WINDOW_UPDATE."""

    async def run() -> None:
        server, transport, stream, client = await _one_get(3)
        stream.respond(SMALL)
        frames = [f for f in _frames(await _flushed(transport)) if f.stream_id == 1]
        assert b"".join(f.data for f in frames[1:]) == b"hel"
        client.receive_data(b"".join(f.serialize() for f in frames))
        client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535})
        server.data_received(client.data_to_send())
        rest = [f for f in _frames(await _flushed(transport)) if f.stream_id == 1]
        assert b"".join(f.data for f in rest) == b"lo"
        assert "END_STREAM" in rest[-1].flags

    run_async(run())


async def _response_held_by_window() -> tuple[
    Http2Connection, FakeClientTransport, FakeServices, h2.connection.H2Connection
]:
    """Stream 1's response is whole at its exchange, 3 of its 5 body octets
    sent, the rest held by the client's window (3 octets)."""
    server, transport, services, client = await _connect(3)
    client.send_headers(1, REQUEST, end_stream=True)
    server.data_received(client.data_to_send())
    (stream,) = services.streams
    stream.respond(SMALL)
    client.receive_data(await _flushed(transport))
    assert not services.logged  # not all out yet
    return server, transport, services, client


def test_a_response_the_client_resets_before_its_end_is_logged_as_cut() -> None:
    async def run() -> None:
        server, _transport, services, client = await _response_held_by_window()
        client.reset_stream(1)
        server.data_received(client.data_to_send())
        ((record, _sent),) = services.logged
        assert record.outcome == "client_closed"

    run_async(run())


def test_a_response_the_clients_window_holds_too_long_is_logged_as_stalled() -> None:
    async def run() -> None:
        server, transport, services, _client = await _response_held_by_window()
        server.sweep(time.monotonic() + services.http.send_timeout_s + 1)
        assert await _resets(transport) == [(1, 8)]  # CANCEL
        ((record, _sent),) = services.logged
        assert (record.outcome, record.reason) == ("client_stalled", "no window for the response")
        assert services.errors == ["h2_window_stall"]

    run_async(run())


def _raw_headers(
    client: h2.connection.H2Connection, stream_id: int, fields: list[tuple[bytes, bytes]]
) -> bytes:
    """A HEADERS frame the client's h2 would not send (past the server's limit)."""
    frame = hyperframe.frame.HeadersFrame(stream_id)
    frame.data = client.encoder.encode(fields)
    frame.flags.add("END_HEADERS")
    frame.flags.add("END_STREAM")
    return frame.serialize()


def test_a_stream_past_the_concurrency_limit_is_refused_alone() -> None:
    """RFC 9113 §5.1.2: a stream error, REFUSED_STREAM; the open ones go on, and
    the refused block still counts in HPACK's table (§4.3)."""

    async def run() -> None:
        server, transport, services, client = await _connect()
        limit = services.http.h2_max_concurrent_streams
        ids = [1 + 2 * i for i in range(limit + 1)]
        server.data_received(b"".join(_raw_headers(client, i, REQUEST) for i in ids[:-1]))
        indexed = [*REQUEST, (b"x-new", b"1")]  # x-new enters the table here
        server.data_received(_raw_headers(client, ids[-1], indexed))
        assert await _resets(transport) == [(ids[-1], 7)]  # REFUSED_STREAM: safe to retry
        assert len(services.streams) == limit
        assert services.errors == ["h2_refused_stream"]
        assert not transport.is_closing()
        services.streams[0].respond(SMALL)  # one stream ends: room for one more
        await _flushed(transport)
        server.data_received(_raw_headers(client, ids[-1] + 2, indexed))  # x-new now indexed
        assert len(services.streams) == limit + 1
        assert b"x-new: 1\r\n" in services.streams[-1].sent
        assert not transport.is_closing()

    run_async(run())


def _window_update(stream_id: int, increment: int) -> bytes:
    frame = hyperframe.frame.WindowUpdateFrame(stream_id)
    frame.window_increment = increment
    return frame.serialize()


def _data_frame(stream_id: int) -> bytes:
    frame = hyperframe.frame.DataFrame(stream_id)
    frame.data = b"x"
    return frame.serialize()


@pytest.mark.parametrize(
    "provoke",
    [
        pytest.param(lambda c, s: _window_update(s, 2**31 - 1), id="window-overflow"),
        pytest.param(lambda c, s: _data_frame(s), id="data-after-end"),
        pytest.param(lambda c, s: _raw_headers(c, s, [(b"x", b"1")]), id="headers-after-end"),
    ],
)
def test_resets_the_client_makes_us_send_are_bounded_as_its_own(provoke: Any) -> None:
    """MadeYouReset (CVE-2025-8671): a frame that makes the server reset the
    stream, right after its request. Each reset cancels its tunnel stream
    (no backend keeps working for a stream gone), and they count against the
    same bound as the client's own RST_STREAM."""

    async def run() -> None:
        server, transport, services, client = await _connect()
        limit = LIMITS["resets"]
        for stream_id in range(1, 2 * (limit + 1) + 1, 2):
            server.data_received(
                _raw_headers(client, stream_id, REQUEST) + provoke(client, stream_id)
            )
            if transport.is_closing():
                break
        assert len(services.streams) == limit + 1 and transport.is_closing()
        assert all(s.ended_with is not None for s in services.streams)
        assert services.errors == ["h2_flood_resets"]

    run_async(run())
