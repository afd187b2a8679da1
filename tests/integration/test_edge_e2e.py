"""End to end through real processes: client → edge (TLS) → tunnel → origin →
Node.js backend. Real TLS, real sockets, the real `websockets` client library.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop
import websockets

from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack, edge_stack, node_available, tcp_established
from tests.polling import wait_for, wait_until

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")


@pytest.fixture(scope="module")
def stack(test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with edge_stack(test_pki, tmp_path_factory.mktemp("edge")) as s:
        yield s


def test_keepalive_reuses_one_tls_connection(stack: Stack) -> None:
    conn = stack.https()
    statuses = []
    for _ in range(5):
        conn.request("GET", "/ip")
        response = conn.getresponse()
        statuses.append(response.status)
        # Node's "Connection: keep-alive" and "Keep-Alive: timeout=5" are about
        # the origin's pooled connection, not this one (kept 75 s).
        assert response.getheader("Keep-Alive") is None
        assert response.getheader("Connection") is None
        json.loads(response.read())
    sock = conn.sock
    conn.request("GET", "/")
    conn.getresponse().read()
    assert conn.sock is sock, "the edge closed a keep-alive connection"
    conn.close()
    assert statuses == [200] * 5


def test_pipelined_requests_answer_in_order(stack: Stack) -> None:
    raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=scaled(10))
    tls = stack.tls_context().wrap_socket(raw, server_hostname="localhost")
    paths = ["/bytes?n=10", "/bytes?n=2000", "/ip", "/bytes?n=7"]
    tls.sendall(b"".join(f"GET {p} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode() for p in paths))
    reader = tls.makefile("rb")
    bodies = []
    for _ in paths:
        status = reader.readline()
        assert status.startswith(b"HTTP/1.1 200"), status
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        bodies.append(reader.read(length))
    tls.close()
    assert [len(b) for b in bodies[:2]] == [10, 2000] and len(bodies[3]) == 7
    assert json.loads(bodies[2])["backend"] == stack.node_port


def test_client_ip_is_true_and_never_spoofed(stack: Stack) -> None:
    status, body = stack.get(
        "/ip",
        {"X-Forwarded-For": "6.6.6.6", "X-Real-IP": "6.6.6.6", "Forwarded": "for=6.6.6.6"},
    )
    info = json.loads(body)
    assert status == 200
    assert info["x_forwarded_for"] == "127.0.0.1"
    assert info["x_real_ip"] == "127.0.0.1"
    assert "6.6.6.6" not in json.dumps(info)
    assert info["x_forwarded_proto"] == "https"
    assert info["x_request_id"]


def test_chunked_upload_and_download(stack: Stack) -> None:
    conn = stack.https()
    parts = [os.urandom(n) for n in (1, 100, 70000, 3)]
    conn.request(
        "POST",
        "/upload",
        body=iter(parts),
        encode_chunked=True,
        headers={"Transfer-Encoding": "chunked"},
    )
    result = json.loads(conn.getresponse().read())
    assert result == {
        "bytes": sum(map(len, parts)),
        "sha256": hashlib.sha256(b"".join(parts)).hexdigest(),
    }
    conn.request("GET", "/bytes?n=300000&chunked=1")
    response = conn.getresponse()
    assert response.getheader("Transfer-Encoding") == "chunked"
    body = response.read()
    assert body == bytes(i % 251 for i in range(300000))
    conn.close()


def test_chunked_upload_trailers_reach_node_without_policed_fields(stack: Stack) -> None:
    head = b"POST /upload HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"5\r\nhello\r\n0\r\nX-Checksum: 77\r\nX-Forwarded-For: 6.6.6.6\r\nHost: evil\r\n\r\n"
    with stack.tls_socket() as tls:
        tls.sendall(head + body)
        response = http.client.HTTPResponse(tls)  # type: ignore[arg-type]
        response.begin()
        result = json.loads(response.read())
    assert response.status == 200
    assert result["bytes"] == 5 and result["trailers"] == {"x-checksum": "77"}


def test_response_trailers_reach_an_http11_client(stack: Stack) -> None:
    request = b"GET /bytes?n=5&chunked=1&trailer=1 HTTP/1.1\r\nHost: localhost\r\n\r\n"
    received = b""
    with stack.tls_socket() as tls:
        tls.sendall(request)
        while not received.endswith(b"\r\n0\r\nX-Bytes: 5\r\n\r\n"):
            data = tls.recv(65536)
            assert data, received
            received += data
    assert b"\r\ntransfer-encoding: chunked\r\n" in received.lower()


def test_ten_megabytes_both_ways_by_hash(stack: Stack) -> None:
    payload = os.urandom(10 * 1024 * 1024)
    conn = stack.https(timeout=60)
    conn.request(
        "POST", "/echo", body=payload, headers={"Content-Type": "application/octet-stream"}
    )
    response = conn.getresponse()
    echoed = response.read()
    assert response.status == 200
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
    conn.request("POST", "/upload", body=payload)
    assert json.loads(conn.getresponse().read())["sha256"] == hashlib.sha256(payload).hexdigest()
    conn.close()


def test_websocket_echo_text_binary_large_ping_close(stack: Stack) -> None:
    async def main() -> None:
        url = f"wss://localhost:{stack.https_port}/ws"
        async with websockets.connect(url, ssl=stack.tls_context(), max_size=None) as ws:
            await ws.send("hello")
            assert await ws.recv() == "hello"
            blob = os.urandom(1024 * 1024)
            await ws.send(blob)
            assert await ws.recv() == blob
            pong = await ws.ping(b"are you there")
            await asyncio.wait_for(pong, 5)
            await ws.close(code=4001, reason="bye")
            assert ws.close_code == 4001

    uvloop.run(main())


def test_smuggling_attempt_gets_400_and_close(stack: Stack) -> None:
    raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=scaled(10))
    tls = stack.tls_context().wrap_socket(raw, server_hostname="localhost")
    tls.sendall(
        b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    data = tls.recv(4096)
    assert data.startswith(b"HTTP/1.1 400")
    assert tls.recv(4096) == b""  # closed
    tls.close()


def test_origin_down_gives_503_after_the_tunnel_wait_then_recovers(stack: Stack) -> None:
    stack.stop_origin()
    # Each request waits http.tunnel_wait_s (5 s) for a tunnel.
    _, body = wait_for(lambda: stack.get("/ip"), lambda a: a[0] == 503, "no 503", timeout_s=60)
    assert body == b"503 Service Unavailable\n"  # the reason is for the log, not the wire
    stack.start_origin()
    wait_for(
        lambda: stack.get("/ip"), lambda a: a[0] == 200, "edge did not recover without a restart"
    )


def test_metrics_count_handshakes_and_requests(stack: Stack) -> None:
    stack.get("/")
    text = wait_for(  # workers publish their counts every second
        stack.metrics,
        lambda t: 'geoedge_edge_requests_total{status="200"}' in t,
        "no request counted",
    )
    assert "geoedge_edge_tls_handshakes_total" in text
    assert 'geoedge_edge_requests_total{status="200"}' in text
    assert "geoedge_edge_tunnel_srtt_seconds" in text
    assert (
        'geoedge_edge_request_duration_seconds_count{origin="origin-a",protocol="h1",'
        'status_class="2xx"}' in text
    )
    assert 'geoedge_edge_upstream_first_byte_seconds_bucket{le="0.005",origin="origin-a"' in text
    assert 'geoedge_edge_tls_handshake_seconds_count{version="TLSv1.3"}' in text
    assert 'geoedge_process_resident_memory_bytes{daemon="edge",pid="' in text
    promtool = shutil.which("promtool")
    if promtool is not None:  # Debian's prometheus package; the Makefile installs it
        lint = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_node_keepalive_timeout_does_not_cost_the_client_a_handshake(stack: Stack) -> None:
    """Node closes idle backend sockets after 5 s; the client connection stays
    and its next request goes on a fresh stream."""
    conn = stack.https()
    conn.request("GET", "/ip")
    first = json.loads(conn.getresponse().read())
    sock = conn.sock
    # The backend connection goes (the origin retires it after keepalive_timeout_s,
    # Node closes it after its keepAliveTimeout, 5 s) while the client's stays.
    wait_until(
        lambda: not tcp_established(first["remote_port"], first["backend"]),
        "the backend connection stayed",
    )
    conn.request("GET", "/ip")
    response = conn.getresponse()
    assert response.status == 200
    assert json.loads(response.read())["backend"] == first["backend"]
    assert conn.sock is sock, "the client had to reconnect"
    conn.close()


class FlakyBackend:
    """A backend whose first connection closes without answering (like a Node
    socket hitting its keep-alive timeout as the request arrives); later ones
    answer 200. Counts the requests it saw."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            data = conn.recv(65536)
            self.requests.append(data.split(b"\r\n", 1)[0])
            if self.connections % 2 == 1:
                conn.close()  # closes before any response byte
                continue
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            conn.close()


def test_idempotent_request_is_replayed_once_non_idempotent_never(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    backend = FlakyBackend()
    with edge_stack(test_pki, tmp_path, backend_port=backend.port) as stack:
        status, body = stack.get("/replay-me")
        assert (status, body) == (200, b"ok")
        assert backend.requests == [b"GET /replay-me HTTP/1.1"] * 2
        conn = stack.https()
        conn.request("POST", "/not-me", body=b"x")
        response = conn.getresponse()
        assert response.status == 502
        assert backend.requests[2:] == [b"POST /not-me HTTP/1.1"]  # sent once, not replayed


def test_slow_request_head_times_out_with_408(test_pki: PkiFiles, tmp_path: Path) -> None:
    http_table = "[http]\nheader_timeout_s = 1.0\n"
    with edge_stack(test_pki, tmp_path, extra_top=http_table) as stack:
        raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=scaled(10))
        tls = stack.tls_context().wrap_socket(raw, server_hostname="localhost")
        tls.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # ... and never the end of the head
        data = tls.recv(4096)  # without a header deadline: the socket's timeout
        assert data.startswith(b"HTTP/1.1 408"), data
        tls.close()
