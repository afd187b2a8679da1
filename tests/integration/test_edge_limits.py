"""Deadlines and limits at the edge (issue "Trust nobody by accident"), end to end:
real edge, real origin balancer, real TLS, Node.js.

- a request the edge rejects mid-body gets its 400/413 at once, its stream is
  reset, and the backend connection it was on is not reused;
- the head deadline is absolute (a trickle does not extend it), the body and
  response deadlines are progress deadlines, a long-poll path and a WebSocket
  are exempt from the response one;
- connection caps refuse before the TLS handshake; the request rate limit
  answers 429.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack, edge_stack, node_available
from tests.polling import wait_for, wait_until

pytestmark = pytest.mark.skipif(not node_available(), reason="npm ci the sample app first")

DEADLINES = """
[http]
header_timeout_s = 2.0
body_timeout_s = 2.0
first_byte_timeout_s = 2.0
between_bytes_timeout_s = 2.0
long_poll_prefixes = ["/slow?long", "/gate?long"]
[http.limits]
max_body_bytes = 1000
"""

CAPS = """
[admission]
max_connections = 6
max_connections_per_client_ip = 3
requests_per_s_per_client_ip = 0.25
request_burst = 3
"""


@pytest.fixture(scope="module")
def stack(test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with edge_stack(test_pki, tmp_path_factory.mktemp("deadlines"), extra_top=DEADLINES) as s:
        yield s


def tls_connect(stack: Stack, source: str = "127.0.0.1") -> ssl.SSLSocket:
    raw = socket.create_connection(
        ("127.0.0.1", stack.https_port), timeout=scaled(20), source_address=(source, 0)
    )
    return stack.tls_context().wrap_socket(raw, server_hostname="localhost")


def read_all(tls: ssl.SSLSocket) -> bytes:
    data = b""
    try:
        while chunk := tls.recv(65536):
            data += chunk
    except (ssl.SSLError, OSError):
        pass
    return data


def backend_port_seen(stack: Stack) -> int:
    """The source port of the origin's connection to Node that served ``/ip``."""
    status, body = stack.get("/ip")
    assert status == 200
    return int(json.loads(body)["remote_port"])


STREAMS = "geoedge_origin_streams_total"


def wait_stream_at_backend(stack: Stack, before: float) -> None:
    """Until the origin has put one more stream than ``before`` on a backend
    connection (the request's head went up the whole way)."""
    wait_until(lambda: stack.origin_count(STREAMS) > before, "the request reached the backend")


def head_deadline_passed(stack: Stack) -> None:
    """Proof that the edge's deadline sweep ran past ``header_timeout_s`` after
    this call: a connection that sends part of a head now gets its 408. A sweep
    checks every connection of its worker (the stack runs one) at one instant,
    so any other connection quiet since before this call has been checked
    against its own deadline by then too."""
    with tls_connect(stack) as canary:
        canary.sendall(b"GET /ip HTTP/1.1\r\n")
        assert read_all(canary).startswith(b"HTTP/1.1 408")


# -- framing errors close at once ------------------------------------------------------


def test_a_malformed_chunk_gets_its_400_at_once_and_the_backend_connection_goes(
    stack: Stack,
) -> None:
    """It used to wait for the response to the malformed request, which the
    backend never sends: a minute or more, holding a socket, a stream and a
    backend connection."""
    parked = backend_port_seen(stack)  # this Node connection is parked for reuse
    streams = stack.origin_count(STREAMS)
    with tls_connect(stack) as tls:
        tls.sendall(
            b"POST /upload?bad-chunk HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n"
        )
        wait_stream_at_backend(stack, streams)  # on the parked connection
        tls.sendall(b"zz\r\n")  # not a chunk size
        reply = read_all(tls)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    # At once, not when the backend answers: it never does, so waiting for it
    # would end at the response deadline, in a 504 logged "upstream_timeout".
    line = last_access_line(stack, "/upload?bad-chunk")
    assert (line["status"], line["outcome"]) == (400, "rejected"), line
    assert backend_port_seen(stack) != parked  # the half-fed connection was not reused


def test_a_chunked_body_past_max_body_bytes_gets_413_at_once(stack: Stack) -> None:
    streams = stack.origin_count(STREAMS)
    with tls_connect(stack) as tls:
        tls.sendall(
            b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3e8\r\n" + b"x" * 1000 + b"\r\n"
        )
        wait_stream_at_backend(stack, streams)  # mid-body: the first 1000 went up
        tls.sendall(b"1\r\nx\r\n")
        assert read_all(tls).startswith(b"HTTP/1.1 413")


def test_a_content_length_past_max_body_bytes_gets_413_before_anything_goes_up(
    stack: Stack,
) -> None:
    with tls_connect(stack) as tls:
        tls.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n")
        assert read_all(tls).startswith(b"HTTP/1.1 413")


# -- deadlines -----------------------------------------------------------------------


def test_a_head_trickled_a_byte_at_a_time_is_cut_at_the_header_deadline(stack: Stack) -> None:
    """The header deadline used to be an idle timeout: every byte reset it."""
    head = b"GET /ip HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    with tls_connect(stack) as tls:
        tls.settimeout(0.25)  # an octet every 0.25 s: an idle deadline (2 s) never fires
        started = time.monotonic()
        reply, sent = b"", 0
        for octet in head:
            try:
                tls.sendall(bytes([octet]))
                sent += 1
                reply = tls.recv(4096)
            except TimeoutError:
                continue
            except (ssl.SSLError, OSError):
                break
            if reply or time.monotonic() - started > scaled(15):
                break
        elapsed = time.monotonic() - started
    # Cut while the trickle went on (the head is never whole): the deadline is
    # absolute. An idle deadline would let the loop run to its 15 s bound.
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert 0 < sent < len(head), sent
    # Not before the deadline: a lower bound cannot fail on a slow machine
    # (2 s from the first octet, which went out after ``started``).
    assert elapsed > 1.9, elapsed


def test_a_stalled_request_body_gets_408_at_the_body_deadline(stack: Stack) -> None:
    with tls_connect(stack) as tls:
        tls.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        started = time.monotonic()
        reply = read_all(tls)  # without a body deadline: the socket's timeout, no reply
        elapsed = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert elapsed > 1.9, elapsed  # not before it (a lower bound: load only adds to it)


def test_a_backend_that_never_answers_gets_a_504_at_the_response_deadline(stack: Stack) -> None:
    started = time.monotonic()
    status, body = stack.get("/slow?ms=20000")  # Node would answer 200 after 20 s
    elapsed = time.monotonic() - started
    assert status == 504, body
    assert elapsed > 1.9, elapsed  # not before it (a lower bound: load only adds to it)
    line = last_access_line(stack, "/slow?ms=20000")
    assert (line["status"], line["outcome"]) == (504, "upstream_timeout")


def test_a_long_poll_path_may_wait_past_the_response_deadline(stack: Stack) -> None:
    """The long poll is held at Node until the test opens its gate, which it
    does only once the edge's sweep has been past its response deadline."""
    gate = "/gate?long=1&group=long-poll&n=2&ms=60000"
    result: list[tuple[int, bytes]] = []
    streams = stack.origin_count(STREAMS)
    poll = threading.Thread(target=lambda: result.append(stack.get(gate)))
    poll.start()
    try:
        wait_stream_at_backend(stack, streams)
        head_deadline_passed(stack)
    finally:  # the second of the group, straight to Node: the long poll is answered
        stack.answer_gate(gate)
        poll.join(scaled(20))
    assert result and result[0][0] == 200, result
    assert json.loads(result[0][1]) == {"together": 2}


def test_a_websocket_outlives_the_response_deadline(stack: Stack) -> None:
    with tls_connect(stack) as tls:
        tls.sendall(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        assert tls.recv(4096).startswith(b"HTTP/1.1 101")
        head_deadline_passed(stack)  # a sweep ran past the response deadlines since the 101
        tls.sendall(bytes([0x81, 0x82, 0, 0, 0, 0]) + b"hi")  # masked text "hi"
        assert tls.recv(4096) == bytes([0x81, 2]) + b"hi"


def last_access_line(stack: Stack, path: str) -> dict:
    def lines() -> list[dict]:
        return [
            json.loads(line)
            for line in stack.log.read_text().splitlines()
            if line.startswith("{") and f'"path":"{path}"' in line
        ]

    return wait_until(lines, f"no access-log line for {path}")[-1]


# -- admission -----------------------------------------------------------------------


def handshake_refused(stack: Stack, source: str = "127.0.0.1") -> bool:
    """True when the edge closes the connection instead of answering the hello."""
    try:
        tls_connect(stack, source).close()
    except (ssl.SSLError, OSError):
        return True
    return False


def test_connection_caps_refuse_before_the_handshake(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path, extra_top=CAPS) as s:
        held = [tls_connect(s) for _ in range(3)]
        assert handshake_refused(s)  # the fourth from 127.0.0.1
        others = [tls_connect(s, "127.0.0.2") for _ in range(3)]  # another address
        assert handshake_refused(s, "127.0.0.3")  # six in all: the global cap
        held.pop().close()
        # A place came back, once the edge has seen the close.
        wait_until(lambda: not handshake_refused(s), "no place came back", interval_s=0.2)
        for tls in held + others:
            tls.close()
        metrics = wait_for(
            s.metrics, lambda text: "max_connections_per_client_ip" in text, "no refusal counted"
        )
        assert 'reason="max_connections_per_client_ip"' in metrics
        assert 'reason="max_connections"' in metrics


def test_the_request_rate_limit_answers_429(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path, extra_top=CAPS) as s:
        statuses = [s.get("/ip")[0] for _ in range(5)]
        assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:], statuses
        # A token comes back every 4 s: the same address is served again. (At 0.25/s,
        # the fourth request is refused unless the first four took 4 s.)
        wait_until(lambda: s.get("/ip")[0] == 200, "no token came back", interval_s=0.5)
