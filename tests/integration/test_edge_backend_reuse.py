"""Backend keep-alive reuse across client connections (PROTOCOL.md §6.5.1).

Real processes: client → edge (TLS) → tunnel → origin → Node.js. The edge ends
a stream that stopped between exchanges with RESET IDLE; the origin parks the
backend connection and gives it to the next stream. Node.js reports the port
its socket's peer has (``/ip`` ``remote_port``): the same port twice means the
same backend connection served two client connections. Per request the client
address must still be the right one, since only the headers carry it.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import websockets

from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack, edge_stack, node_available, tcp_established
from tests.integration.origin_harness import eventually
from tests.polling import wait_until

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")

SOURCES = ("127.0.0.1", "127.0.0.2")


@pytest.fixture(scope="module")
def stack(test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with edge_stack(test_pki, tmp_path_factory.mktemp("reuse")) as s:
        yield s


def one_request(
    stack: Stack, source: str, path: str = "/ip", *, close_header: bool = True
) -> tuple[http.client.HTTPResponse, bytes]:
    """One client connection from ``source``, one GET, then the client closes."""
    conn = http.client.HTTPSConnection(
        "127.0.0.1",
        stack.https_port,
        context=stack.tls_context(),
        timeout=scaled(10),
        source_address=(source, 0),
    )
    try:
        conn.request("GET", path, headers={"Connection": "close"} if close_header else {})
        response = conn.getresponse()
        return response, response.read()
    finally:
        conn.close()


def reused_total(stack: Stack) -> float:
    return stack.origin_count("geoedge_origin_backend_connections_reused_total")


def ended_marker(stack: Stack) -> float:
    """Grows when a stream ends at the origin (its octets are counted then, in
    the same call that parks its backend connection or not)."""
    return stack.origin_count("geoedge_origin_bytes_total", 'direction="to_backend"')


def request_and_end(stack: Stack, source: str, **kwargs: bool) -> tuple[int, bytes]:
    """:func:`one_request`, then wait until its stream ended at the origin: the
    edge's RESET IDLE goes over either of its two tunnel connections, and the
    next client's OPEN may take the other one."""
    before = ended_marker(stack)
    response, body = one_request(stack, source, **kwargs)
    wait_until(lambda: ended_marker(stack) > before, "the stream did not end at the origin")
    return response.status, body


def test_short_connections_share_a_backend_connection_with_their_own_client_ip(
    stack: Stack,
) -> None:
    before = reused_total(stack)
    ports = []
    for i in range(8):
        source = SOURCES[i % 2]
        status, body = request_and_end(stack, source, close_header=i < 4)
        assert status == 200
        seen = json.loads(body)
        assert seen["x_forwarded_for"] == source
        assert seen["x_real_ip"] == source
        assert seen["forwarded"].startswith(f"for={source};")
        ports.append(seen["remote_port"])
    # One backend connection served (nearly) all eight client connections.
    assert Counter(ports).most_common(1)[0][1] >= 7, ports
    reused = eventually(lambda: reused_total(stack) - before, lambda n: n >= 7)
    assert reused >= 7


def test_a_client_that_asked_to_close_is_told_so(stack: Stack) -> None:
    """Its request went up keep-alive; the response must not say keep-alive."""
    response, _ = one_request(stack, "127.0.0.1", close_header=True)
    assert response.getheader("Connection") == "close"
    assert response.getheader("Keep-Alive") is None
    assert response.will_close


def test_a_websocket_stream_does_not_hand_its_connection_on(stack: Stack) -> None:
    """An upgraded stream ends with CANCEL: its backend connection is not parked."""

    async def session() -> None:
        ssl_context = stack.tls_context()
        uri = f"wss://localhost:{stack.https_port}/ws"
        async with websockets.connect(uri, ssl=ssl_context) as ws:
            await ws.send("hello")
            assert await ws.recv() == "hello"

    for _ in range(3):
        before = ended_marker(stack)
        asyncio.run(session())
        wait_until(
            lambda b=before: ended_marker(stack) > b,  # type: ignore[misc]
            "the WebSocket's stream did not end",
        )
        # Had the upgraded socket been parked, this request would reach Node's
        # WebSocket and never be answered.
        response, body = one_request(stack, "127.0.0.1")
        assert response.status == 200
        assert json.loads(body)["x_forwarded_for"] == "127.0.0.1"


def test_an_idle_connection_past_its_time_is_not_reused(
    test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with edge_stack(
        test_pki,
        tmp_path_factory.mktemp("reuse-expiry"),
        # Long enough for a second request after the first one's end was seen
        # (its count is published once a second), short of Node's 5 s.
        origin_pool_extra="keepalive_timeout_s = 4",
    ) as s:
        _, first = request_and_end(s, "127.0.0.1")
        _, second = request_and_end(s, "127.0.0.1")  # parked again when this returns
        assert json.loads(first)["remote_port"] == json.loads(second)["remote_port"]
        # Past keepalive_timeout_s since it was parked: a lower bound, which
        # load only lengthens (a take checks the deadline, whether or not a
        # sweep ran).
        time.sleep(4.2)
        response, third = one_request(s, "127.0.0.1")
        assert response.status == 200
        assert json.loads(third)["remote_port"] != json.loads(second)["remote_port"]


def test_reuse_off_opens_a_connection_per_stream(
    test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with edge_stack(
        test_pki, tmp_path_factory.mktemp("reuse-off"), origin_pool_extra="keepalive_timeout_s = 0"
    ) as s:
        ports = set()
        for _ in range(4):
            status, body = request_and_end(s, "127.0.0.1")
            assert status == 200
            ports.add(json.loads(body)["remote_port"])
        assert len(ports) == 4
        # A reuse is counted with its stream: once all four are, none was.
        wait_until(lambda: s.origin_count("geoedge_origin_streams_total") >= 4, "streams counted")
        assert reused_total(s) == 0


def test_a_connection_the_backend_closed_while_parked_is_dropped(
    test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Misconfigured on purpose: kept longer than Node's 5 s keepAliveTimeout.
    Node closes the parked connection; the next client must not see a 502."""
    with edge_stack(
        test_pki,
        tmp_path_factory.mktemp("reuse-node-closed"),
        origin_pool_extra="keepalive_timeout_s = 30",
    ) as s:
        _, first = request_and_end(s, "127.0.0.1")
        parked = json.loads(first)["remote_port"]
        # Node closes idle sockets 5-6 s after the response; the origin sees it.
        wait_until(
            lambda: not tcp_established(parked, s.node_port), "Node kept the connection open"
        )
        response, second = one_request(s, "127.0.0.2")
        assert response.status == 200
        seen = json.loads(second)
        assert seen["x_forwarded_for"] == "127.0.0.2"
        assert seen["remote_port"] != json.loads(first)["remote_port"]
