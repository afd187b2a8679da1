"""The edge's connection logic (front_h1 + exchange) over fake transports: each
decision of the request-to-stream path, without sockets or processes."""

from __future__ import annotations

import pytest

from edge.front_h1 import Http1Connection
from tests.conftest import run_async
from tests.edge_fakes import FakeClientTransport, FakeServices
from tests.polling import wait_until_async
from tunnel.mux import ErrorCode

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def connect(
    services: FakeServices | None = None,
) -> tuple[Http1Connection, FakeClientTransport, FakeServices]:
    services = services or FakeServices()
    client = Http1Connection(services, trusted=False)
    transport = FakeClientTransport()
    client.connection_made(transport)
    return client, transport, services


def get(path: str = "/", *extra: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: app.test", *extra]) + "\r\n\r\n").encode()


def test_a_request_is_one_stream_with_its_own_metadata_ended_idle() -> None:
    client, transport, services = connect()
    client.data_received(get("/cart?id=7"))
    (stream,) = services.streams
    assert stream.metadata.method == "GET" and stream.metadata.target == "/cart?id=7"
    assert stream.metadata.host == "app.test"
    assert stream.metadata.client_address == ("203.0.113.9", 40000)
    assert stream.sent.startswith(b"GET /cart?id=7 HTTP/1.1\r\n")
    stream.respond(OK)
    answered = transport.take()  # the request id is echoed to the client
    assert answered == OK.replace(b"OK\r\n", b"OK\r\nX-Request-Id: req0001\r\n", 1)
    assert stream.ended_with == ErrorCode.IDLE  # the backend connection is reusable
    ((record, sent),) = services.logged
    assert (record.status, record.outcome, sent) == (200, "ok", len(answered))
    client.data_received(get("/next"))  # keep-alive: the next request, a new stream
    assert len(services.streams) == 2 and not transport.closed


def test_pipelined_requests_take_turns_and_keep_their_order() -> None:
    client, transport, services = connect()
    client.data_received(get("/a") + get("/b"))
    assert len(services.streams) == 1 and not transport.reading  # /b waits
    services.streams[0].respond(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nA")
    assert len(services.streams) == 2 and transport.reading
    assert services.streams[1].metadata.target == "/b"
    services.streams[1].respond(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nB")
    written = transport.take()
    assert written.index(b"\r\n\r\nA") < written.index(b"\r\n\r\nB")


def test_a_client_that_asks_to_close_is_told_so_and_closed() -> None:
    client, transport, services = connect()
    client.data_received(get("/", "Connection: close"))
    services.streams[0].respond(OK)
    assert b"Connection: close\r\n" in transport.take()
    assert transport.closed


NODE_OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive\r\n"
    b"Keep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok"
)


def test_the_backends_keep_alive_fields_never_reach_the_client() -> None:
    # Node's "Keep-Alive: timeout=5" is about the origin's pooled connection: a
    # client that honours it (undici) would drop an edge connection kept 75 s.
    client, transport, services = connect()
    client.data_received(get())
    services.streams[0].respond(NODE_OK)
    written = transport.take()
    assert written == (
        b"HTTP/1.1 200 OK\r\nX-Request-Id: req0001\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 2\r\n\r\nok"
    )
    client.data_received(get("/next"))
    assert len(services.streams) == 2 and not transport.closed


def test_an_http10_keep_alive_client_is_told_its_connection_stays() -> None:
    client, transport, services = connect()
    request = b"GET / HTTP/1.0\r\nHost: app.test\r\nConnection: keep-alive\r\n\r\n"
    client.data_received(request)
    services.streams[0].respond(NODE_OK)
    written = transport.take()
    head = written.split(b"\r\n\r\n")[0].lower().split(b"\r\n")
    assert [line for line in head if line.startswith((b"connection", b"keep-alive"))] == [
        b"connection: keep-alive"
    ]
    client.data_received(request)  # and it does
    assert len(services.streams) == 2 and not transport.closed


def test_fields_the_backends_connection_names_stay_behind() -> None:
    client, transport, services = connect()
    client.data_received(get())
    services.streams[0].respond(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Pool-Slot, Content-Length\r\n"
        b"X-Pool-Slot: 3\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\nok"
    )
    written = transport.take()
    assert b"X-Pool-Slot" not in written and b"Connection" not in written
    assert b"X-Kept: 1\r\nContent-Length: 2\r\n\r\nok" in written  # framing stays


def test_a_request_id_the_backends_connection_names_is_replaced_by_the_edges() -> None:
    client, transport, services = connect()
    client.data_received(get())
    services.streams[0].respond(
        b"HTTP/1.1 200 OK\r\nConnection: X-Request-Id\r\nX-Request-Id: backend-7\r\n"
        b"Content-Length: 2\r\n\r\nok"
    )
    written = transport.take()
    assert b"backend-7" not in written
    assert written.count(b"X-Request-Id: req0001\r\n") == 1
    client.data_received(get("/next"))  # a backend id the client may see is kept
    services.streams[1].respond(
        b"HTTP/1.1 200 OK\r\nX-Request-Id: backend-8\r\nContent-Length: 2\r\n\r\nok"
    )
    written = transport.take()
    assert b"X-Request-Id: backend-8\r\n" in written and b"req0002" not in written


def test_a_close_delimited_body_ends_with_the_client_connection() -> None:
    client, transport, services = connect()
    client.data_received(get())
    services.streams[0].respond(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\nuntil"
    )
    services.streams[0].backend_eof()
    written = transport.take()
    assert written.endswith(b"Connection: close\r\n\r\nuntil")
    assert b"keep-alive" not in written.lower() and transport.closed


def test_only_the_backend_closing_leaves_the_client_connection_open() -> None:
    client, transport, services = connect()
    client.data_received(get())
    services.streams[0].respond(
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    )
    written = transport.take()
    assert b"Connection" not in written and written.endswith(b"ok")
    assert not transport.closed
    assert services.streams[0].ended_with == ErrorCode.CANCEL  # not reusable


def test_a_close_delimited_response_closes_the_client_too() -> None:
    client, transport, services = connect()
    client.data_received(get())
    stream = services.streams[0]
    stream.respond(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nbody")
    stream.backend_eof()
    assert transport.take().endswith(b"body") and transport.closed


def test_a_get_reset_before_any_response_is_replayed_once() -> None:
    client, transport, services = connect()
    client.data_received(get())
    services.streams[0].reset(ErrorCode.UPSTREAM_RESET)
    assert len(services.streams) == 2  # replayed on a fresh stream
    services.streams[1].reset(ErrorCode.UPSTREAM_RESET)
    assert transport.take().startswith(b"HTTP/1.1 502 ")
    ((record, _),) = services.logged
    assert (record.status, record.outcome, record.retried) == (502, "upstream_reset", True)


def test_a_get_refused_by_an_origin_going_away_waits_for_its_next_tunnel() -> None:
    """An origin restarting refuses the streams it got after it stopped
    accepting (REFUSED_STREAM) and no other tunnel is up yet: the request goes
    again once one is, as a new request would wait, instead of answering 502
    at once; a refusal is no fault, so its one replay stays unspent."""

    async def main() -> None:
        client, transport, services = connect()
        client.data_received(get("/ip"))
        services.tunnel_up = False  # its GOAWAY took the only origin's tunnels away
        services.streams[0].reset(ErrorCode.REFUSED_STREAM)
        assert len(services.streams) == 1 and services.waiters  # waiting, not answered
        assert transport.take() == b""
        services.bring_tunnel_up()
        assert len(services.streams) == 2
        assert services.streams[1].sent.startswith(b"GET /ip HTTP/1.1\r\n")
        services.streams[1].respond(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        assert transport.take().startswith(b"HTTP/1.1 200 ")
        ((record, _),) = services.logged
        assert (record.status, record.resent, record.retried) == (200, 1, False)

    run_async(main(), 5)


def test_a_post_reset_before_any_response_gets_a_502_not_a_replay() -> None:
    client, transport, services = connect()
    client.data_received(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi")
    services.streams[0].reset(ErrorCode.CANCEL)
    assert len(services.streams) == 1
    assert transport.take().startswith(b"HTTP/1.1 502 ") and transport.closed


@pytest.mark.parametrize(
    ("code", "status"), [(ErrorCode.NO_BACKEND, 503), (ErrorCode.TIMEOUT, 504)]
)
def test_the_origins_decisions_are_answered_not_replayed(code: int, status: int) -> None:
    client, transport, services = connect()
    client.data_received(get())
    services.streams[0].reset(code)
    assert len(services.streams) == 1
    assert transport.take().startswith(f"HTTP/1.1 {status} ".encode())


def test_a_reset_mid_response_cuts_the_client_and_blames_the_upstream() -> None:
    client, transport, services = connect()
    client.data_received(get())
    stream = services.streams[0]
    stream.respond(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
    stream.reset(ErrorCode.UPSTREAM_RESET)
    assert transport.aborted  # no close_notify: the client sees the cut
    client.connection_lost(None)
    ((record, _),) = services.logged
    assert (record.status, record.outcome) == (200, "upstream_reset")


def test_an_early_response_closes_the_connection_and_cancels_the_stream() -> None:
    client, transport, services = connect()
    client.data_received(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nfirst")
    stream = services.streams[0]
    stream.respond(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n")
    assert stream.ended_with == ErrorCode.CANCEL  # the backend has unread body
    assert transport.closed  # the rest of the client's body is unread too


def test_a_framing_error_mid_body_is_answered_at_once_and_resets_the_stream() -> None:
    client, transport, services = connect()
    client.data_received(b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
    stream = services.streams[0]
    client.data_received(b"zz\r\n")
    assert stream.ended_with == ErrorCode.CANCEL
    assert transport.take().startswith(b"HTTP/1.1 400 ") and transport.closed
    ((record, _),) = services.logged
    assert record.outcome == "rejected"


def test_a_request_waits_for_a_tunnel_with_reading_paused() -> None:
    async def main() -> None:
        client, transport, services = connect(FakeServices(tunnel_up=False))
        client.data_received(get())
        assert not services.streams and not transport.reading
        services.bring_tunnel_up()
        assert len(services.streams) == 1 and transport.reading
        assert services.streams[0].sent.startswith(b"GET / HTTP/1.1")

    run_async(main(), 5)


def test_a_body_read_while_waiting_for_a_tunnel_goes_up_once_there_is_one() -> None:
    async def main() -> None:
        client, transport, services = connect(FakeServices(tunnel_up=False))
        head = b"POST /p HTTP/1.1\r\nHost: app.test\r\nContent-Length: 10\r\n\r\n"
        client.data_received(head + b"hello")  # read in one go, before the wait began
        assert not services.streams and not transport.reading
        services.bring_tunnel_up()
        (stream,) = services.streams
        assert stream.sent.startswith(b"POST /p HTTP/1.1\r\n")
        assert stream.sent.endswith(b"\r\n\r\nhello") and transport.reading
        client.data_received(b"world")
        assert stream.sent.endswith(b"\r\n\r\nhelloworld")
        stream.respond(OK)
        assert transport.take().startswith(b"HTTP/1.1 200 OK")
        ((record, _),) = services.logged
        assert (record.bytes_in, record.outcome) == (10, "ok")

    run_async(main(), 5)


def test_a_request_that_finds_no_tunnel_in_time_gets_a_503() -> None:
    async def main() -> None:
        client, transport, services = connect(FakeServices(tunnel_up=False, tunnel_wait_s=0.05))
        client.data_received(get())
        await wait_until_async(lambda: services.logged, "the request was never answered")
        assert transport.take().startswith(b"HTTP/1.1 503 ")
        ((record, _),) = services.logged
        assert record.outcome == "no_tunnel"

    run_async(main(), 5)


def test_backpressure_flows_both_ways() -> None:
    client, transport, services = connect()
    client.data_received(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n")
    stream = services.streams[0]
    stream.protocol.pause_writing()  # the tunnel stream is full
    assert not transport.reading
    stream.protocol.resume_writing()
    assert transport.reading
    client.pause_writing()  # the client is slow
    assert not stream.reading
    client.resume_writing()
    assert stream.reading


def test_a_websocket_carries_held_bytes_and_the_client_half_close() -> None:
    client, _transport, services = connect()
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    client.data_received(
        get("/ws", "Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13") + b"early"
    )  # fmt: skip
    stream = services.streams[0]
    stream.respond(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
    )
    assert stream.sent.endswith(b"early")  # held behind the handshake, then sent
    client.data_received(b"frames")
    assert stream.sent.endswith(b"frames")
    client.eof_received()
    assert stream.eof_sent  # the half-close travels through the tunnel
