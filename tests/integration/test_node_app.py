"""The sample Node.js backend (deploy/node-app): every endpoint, WebSocket echo, PROXY v1/v2.

Real ``node deploy/node-app/server.js <port>`` processes on loopback, stopped by
PID when the module's tests are done. Skipped when Node.js or the app's
node_modules (``make node`` runs ``npm ci``) are missing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import http.client
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.conftest import scaled
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
APP_DIR = ROOT / "deploy" / "node-app"
NODE = shutil.which("node")
START_TIMEOUT_S = scaled(10.0)
IO_TIMEOUT_S = scaled(5.0)
LARGE_BYTES = 786432
IP_KEYS = {
    "remote_address",
    "remote_port",
    "x_forwarded_for",
    "x_real_ip",
    "forwarded",
    "proxy_protocol_address",
    "backend",
    "x_forwarded_proto",
    "x_request_id",
}
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"

pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node is not installed"),
    pytest.mark.skipif(
        not (APP_DIR / "node_modules" / "ws").is_dir(),
        reason="deploy/node-app/node_modules is missing (run `make node`)",
    ),
]


def pattern(n: int, offset: int = 0) -> bytes:
    """The app's deterministic body: byte i is i % 251."""
    return bytes((offset + i) % 251 for i in range(n))


@dataclass
class NodeApp:
    process: subprocess.Popen[bytes]
    port: int
    stderr_path: Path

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it has not exited within IO_TIMEOUT_S; returns the status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(IO_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(IO_TIMEOUT_S)
        assert self.process.stdout is not None
        self.process.stdout.close()
        return self.process.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(
    tmp_path: Path, port: int, args: list[str], env: dict[str, str] | None = None
) -> NodeApp:
    """Start server.js (told ``port`` by ``args`` or ``env``); wait for ``listening on <port>``."""
    assert NODE is not None
    stderr_path = tmp_path / f"node-{port}.stderr"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [NODE, str(APP_DIR / "server.js"), *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, **(env or {})},
        )
    app = NodeApp(process, port, stderr_path)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    line = process.stdout.readline().decode() if ready else ""
    if line.strip() != f"listening on {port}":
        app.stop()
        pytest.fail(f"node app did not start: {line!r}; stderr: {stderr_path.read_text()!r}")
    return app


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeApp]:
    tmp = tmp_path_factory.mktemp("node")
    port = free_port()
    started = start_app(tmp, port, [str(port)])
    yield started
    started.stop()


@pytest.fixture(scope="module")
def proxy_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeApp]:
    tmp = tmp_path_factory.mktemp("node-proxy")
    port = free_port()
    started = start_app(tmp, port, [str(port), "--proxy-protocol"])
    yield started
    started.stop()


def request(
    app: NodeApp,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", app.port, timeout=IO_TIMEOUT_S)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response, response.read()
    finally:
        conn.close()


def get_json(app: NodeApp, path: str, headers: dict[str, str] | None = None) -> dict:
    response, body = request(app, "GET", path, headers=headers)
    assert response.status == 200
    assert response.getheader("Content-Type") == "application/json"
    return json.loads(body)


# --- plain HTTP endpoints -------------------------------------------------------------------


def test_index_is_a_small_html_page(app: NodeApp) -> None:
    response, body = request(app, "GET", "/")
    assert response.status == 200
    assert response.getheader("Content-Type", "").startswith("text/html")
    assert b"<title>geoedge sample app</title>" in body
    assert b"/ws" in body and len(body) < 4096


def test_health(app: NodeApp) -> None:
    response, body = request(app, "GET", "/health")
    assert (response.status, body) == (200, b"ok")


def test_ip_reports_the_socket_peer_and_nulls(app: NodeApp) -> None:
    seen = get_json(app, "/ip")
    assert set(seen) == IP_KEYS
    assert isinstance(seen.pop("remote_port"), int)
    assert seen == {
        "remote_address": "127.0.0.1",
        "x_forwarded_for": None,
        "x_real_ip": None,
        "forwarded": None,
        "proxy_protocol_address": None,
        "backend": app.port,
        "x_forwarded_proto": None,
        "x_request_id": None,
    }


def test_ip_reports_forwarding_headers(app: NodeApp) -> None:
    seen = get_json(
        app,
        "/ip",
        {
            "X-Forwarded-For": "203.0.113.7, 10.0.0.2",
            "X-Real-IP": "203.0.113.7",
            "Forwarded": "for=203.0.113.7;proto=https",
            "X-Forwarded-Proto": "https",
            "X-Request-Id": "req-42",
        },
    )
    assert seen["x_forwarded_for"] == "203.0.113.7, 10.0.0.2"
    assert seen["x_real_ip"] == "203.0.113.7"
    assert seen["forwarded"] == "for=203.0.113.7;proto=https"
    assert seen["x_forwarded_proto"] == "https"
    assert seen["x_request_id"] == "req-42"
    assert seen["proxy_protocol_address"] is None
    assert isinstance(seen["backend"], int) and seen["backend"] == app.port


def test_headers_reports_the_request_as_received(app: NodeApp) -> None:
    seen = get_json(app, "/headers?x=1", {"X_Forwarded_For": "6.6.6.6", "X-Thing": "a"})
    assert seen["method"] == "GET" and seen["url"] == "/headers?x=1"
    assert seen["http_version"] == "1.1"
    assert ["X_Forwarded_For", "6.6.6.6"] in seen["raw_headers"]
    assert ["X-Thing", "a"] in seen["raw_headers"]
    assert seen["backend"] == app.port


def test_large_is_768_kib_deterministic_with_content_length(app: NodeApp) -> None:
    response, body = request(app, "GET", "/large")
    assert response.status == 200
    assert response.getheader("Content-Length") == str(LARGE_BYTES)
    assert response.getheader("Transfer-Encoding") is None
    assert body == pattern(LARGE_BYTES)
    head, head_body = request(app, "HEAD", "/large")
    assert head.getheader("Content-Length") == str(LARGE_BYTES) and head_body == b""


@pytest.mark.parametrize("n", [0, 1, 1000, 65536 + 17, 3 * 1024 * 1024 + 5])
@pytest.mark.parametrize("chunked", [False, True])
def test_bytes_returns_n_deterministic_bytes(app: NodeApp, n: int, chunked: bool) -> None:
    response, body = request(app, "GET", f"/bytes?n={n}" + ("&chunked=1" if chunked else ""))
    assert response.status == 200
    if chunked:
        assert response.getheader("Transfer-Encoding") == "chunked"
        assert response.getheader("Content-Length") is None
    else:
        assert response.getheader("Content-Length") == str(n)
        assert response.getheader("Transfer-Encoding") is None
    assert len(body) == n
    assert body == pattern(n)


@pytest.mark.parametrize("query", ["", "?n=", "?n=-1", "?n=abc", f"?n={(1 << 30) + 1}"])
def test_bytes_rejects_a_bad_n(app: NodeApp, query: str) -> None:
    response, body = request(app, "GET", f"/bytes{query}")
    assert response.status == 400
    assert b"n must be an integer" in body


@pytest.mark.parametrize("method", ["POST", "PUT"])
@pytest.mark.parametrize("chunked", [False, True])
def test_upload_counts_and_hashes_the_body(app: NodeApp, method: str, chunked: bool) -> None:
    payload = os.urandom(300_000)
    conn = http.client.HTTPConnection("127.0.0.1", app.port, timeout=IO_TIMEOUT_S)
    try:
        if chunked:
            pieces = (payload[i : i + 70_000] for i in range(0, len(payload), 70_000))
            conn.request(method, "/upload", body=pieces, encode_chunked=True)
        else:
            conn.request(method, "/upload", body=payload)
        response = conn.getresponse()
        result = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 200
    assert result == {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def test_upload_wants_post_or_put(app: NodeApp) -> None:
    response, _ = request(app, "GET", "/upload")
    assert response.status == 405
    assert response.getheader("Allow") == "POST, PUT"


def test_echo_keeps_content_length_framing(app: NodeApp) -> None:
    payload = os.urandom(200_000)
    response, body = request(app, "POST", "/echo", payload, {"Content-Type": "application/x-test"})
    assert response.status == 200
    assert response.getheader("Content-Length") == str(len(payload))
    assert response.getheader("Transfer-Encoding") is None
    assert response.getheader("Content-Type") == "application/x-test"
    assert body == payload


def test_echo_keeps_chunked_framing(app: NodeApp) -> None:
    pieces = [b"first;", os.urandom(100_000), b"", b"last"]
    conn = http.client.HTTPConnection("127.0.0.1", app.port, timeout=IO_TIMEOUT_S)
    try:
        conn.request("POST", "/echo", body=iter(pieces), encode_chunked=True)
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 200
    assert response.getheader("Transfer-Encoding") == "chunked"
    assert response.getheader("Content-Length") is None
    assert body == b"".join(pieces)


def test_echo_without_a_body_is_empty(app: NodeApp) -> None:
    response, body = request(app, "POST", "/echo")
    assert (response.status, response.getheader("Content-Length"), body) == (200, "0", b"")


def test_slow_waits_the_requested_time(app: NodeApp) -> None:
    start = time.monotonic()
    response, body = request(app, "GET", "/slow?ms=300")
    elapsed = time.monotonic() - start
    assert response.status == 200 and body == b"slept 300 ms\n"
    # A lower bound only (a timer never fires early; a busy machine makes it later).
    assert elapsed >= 0.29
    bad, _ = request(app, "GET", "/slow?ms=soon")
    assert bad.status == 400


def test_gate_answers_a_group_once_all_of_it_is_held_at_once(app: NodeApp) -> None:
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        held = [pool.submit(request, app, "GET", "/gate?n=3&group=a&ms=60000") for _ in range(2)]
        # Another group neither counts toward this one nor opens it.
        other, body = request(app, "GET", "/gate?n=2&group=b&ms=50")
        assert (other.status, json.loads(body)) == (504, {"together": 1, "wanted": 2})
        assert not any(f.done() for f in held)  # the two are held (the "b" request ran)
        last, body = request(app, "GET", "/gate?n=3&group=a&ms=60000")
        answers = [(r.status, json.loads(b)) for r, b in [f.result() for f in held]]
    assert (last.status, json.loads(body)) == (200, {"together": 3})
    assert answers == [(200, {"together": 3})] * 2

    # A client that leaves stops counting. (A probe that cannot open the gate
    # reports how many are held.)
    def held_in_c() -> int:
        _, body = request(app, "GET", "/gate?n=1000&group=c&ms=1")
        return int(json.loads(body)["together"]) - 1

    with socket.create_connection(("127.0.0.1", app.port), timeout=IO_TIMEOUT_S) as gone:
        gone.sendall(b"GET /gate?n=1000&group=c&ms=60000 HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(lambda: held_in_c() == 1, "the request is held")
    wait_until(lambda: held_in_c() == 0, "the request whose client left still counts")
    bad, _ = request(app, "GET", "/gate?n=0&ms=1")
    assert bad.status == 400


@pytest.mark.parametrize("code", [200, 201, 404, 418, 500, 502, 503, 599])
def test_status_returns_the_requested_code(app: NodeApp, code: int) -> None:
    response, body = request(app, "GET", f"/status?code={code}")
    assert response.status == code
    assert body == f"status {code}\n".encode()


def test_status_204_has_no_body_and_bad_codes_are_refused(app: NodeApp) -> None:
    response, body = request(app, "GET", "/status?code=204")
    assert (response.status, body) == (204, b"")
    for query in ("", "?code=99", "?code=600", "?code=x"):
        refused, _ = request(app, "GET", f"/status{query}")
        assert refused.status == 400, query


def test_unknown_path_is_404(app: NodeApp) -> None:
    response, body = request(app, "GET", "/nope")
    assert response.status == 404
    assert b"/nope" in body


def test_keep_alive_serves_many_requests_on_one_connection(app: NodeApp) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", app.port, timeout=IO_TIMEOUT_S)
    try:
        conn.connect()
        first_socket = conn.sock
        for path in ("/health", "/ip", "/bytes?n=10&chunked=1", "/large", "/health"):
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            assert response.getheader("Connection") == "keep-alive"
        assert conn.sock is first_socket  # http.client reconnects silently otherwise
    finally:
        conn.close()


# --- WebSocket echo --------------------------------------------------------------------------


async def websocket_session(uri: str, sock: socket.socket | None = None) -> dict[str, object]:
    extra = {"sock": sock} if sock is not None else {}
    async with connect(uri, proxy=None, open_timeout=IO_TIMEOUT_S, **extra) as ws:
        await ws.send("hello, edge")
        text = await ws.recv()
        blob = bytes(range(256)) * 300
        await ws.send(blob)
        binary = await ws.recv()
        pong_waiter = await ws.ping(b"are you there")
        latency = await asyncio.wait_for(pong_waiter, IO_TIMEOUT_S)
        await ws.close(code=4001, reason="bye")
        return {
            "text": text,
            "binary_ok": binary == blob,
            "latency": latency,
            "close_code": ws.close_code,
            "close_reason": ws.close_reason,
        }


def test_websocket_echoes_text_binary_pings_and_close_code(app: NodeApp) -> None:
    result = asyncio.run(
        asyncio.wait_for(websocket_session(f"ws://127.0.0.1:{app.port}/ws"), 4 * IO_TIMEOUT_S)
    )
    assert result["text"] == "hello, edge"
    assert result["binary_ok"] is True
    assert isinstance(result["latency"], float)
    # The code we see is the one the server sent back: it echoed ours.
    assert result["close_code"] == 4001
    assert result["close_reason"] == "bye"


def test_websocket_on_another_path_is_refused(app: NodeApp) -> None:
    async def attempt() -> None:
        async with connect(f"ws://127.0.0.1:{app.port}/other", proxy=None):
            pass

    with pytest.raises(InvalidStatus) as info:
        asyncio.run(asyncio.wait_for(attempt(), 2 * IO_TIMEOUT_S))
    assert info.value.response.status_code == 404


# --- PROXY protocol ---------------------------------------------------------------------------


def proxy_v1(src: str, src_port: int, family: str = "TCP4") -> bytes:
    dst = "192.0.2.1" if family == "TCP4" else "2001:db8::1"
    return f"PROXY {family} {src} {dst} {src_port} 443\r\n".encode()


def proxy_v2(src: str, src_port: int, *, command: int = 0x1, tlv: bytes = b"") -> bytes:
    if ":" in src:
        family, addresses = 0x21, socket.inet_pton(socket.AF_INET6, src) + bytes(15) + b"\x01"
    else:
        family, addresses = 0x11, socket.inet_pton(socket.AF_INET, src) + bytes([192, 0, 2, 1])
    body = addresses + struct.pack("!HH", src_port, 443) + tlv
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack("!H", len(body)) + body


def connection_after(app: NodeApp, header: bytes, *, split: bool = False) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", app.port), timeout=IO_TIMEOUT_S)
    if split:  # one byte per segment: the parser must wait for the rest
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(header)):
            sock.sendall(header[i : i + 1])
            time.sleep(0.001)
    else:
        sock.sendall(header)
    return sock


def http_over(sock: socket.socket, port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=IO_TIMEOUT_S)
    conn.sock = sock  # already connected, PROXY header already sent
    return conn


def ip_over(conn: http.client.HTTPConnection) -> dict:
    conn.request("GET", "/ip")
    response = conn.getresponse()
    assert response.status == 200
    return json.loads(response.read())


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (proxy_v1("203.0.113.7", 55555), "203.0.113.7:55555"),
        (proxy_v1("2001:db8::7", 4444, "TCP6"), "[2001:db8::7]:4444"),
        (proxy_v2("198.51.100.9", 40000), "198.51.100.9:40000"),
        (proxy_v2("2001:db8:0:0:0:0:0:9", 1), "[2001:db8::9]:1"),
        # An AWS NLB appends TLVs (type 0xEA: VPC endpoint id); they are skipped.
        (proxy_v2("198.51.100.9", 40000, tlv=b"\xea\x00\x05\x01vpce"), "198.51.100.9:40000"),
        (proxy_v2("198.51.100.9", 40000, command=0x0), None),  # LOCAL: a health check
        (b"PROXY UNKNOWN ignored rest\r\n", None),
    ],
)
def test_proxy_header_source_shows_in_ip(
    proxy_app: NodeApp, header: bytes, expected: str | None
) -> None:
    conn = http_over(connection_after(proxy_app, header), proxy_app.port)
    try:
        seen = ip_over(conn)
        assert set(seen) == IP_KEYS
        assert seen["proxy_protocol_address"] == expected
        assert seen["remote_address"] == "127.0.0.1"
        # Keep-alive: the next request on the same connection keeps the address.
        again = ip_over(conn)
        assert again["proxy_protocol_address"] == expected
    finally:
        conn.close()


def test_proxy_header_sent_byte_by_byte(proxy_app: NodeApp) -> None:
    sock = connection_after(proxy_app, proxy_v2("198.51.100.10", 1234), split=True)
    conn = http_over(sock, proxy_app.port)
    try:
        assert ip_over(conn)["proxy_protocol_address"] == "198.51.100.10:1234"
    finally:
        conn.close()


def test_proxy_header_and_request_in_one_segment(proxy_app: NodeApp) -> None:
    header = proxy_v1("203.0.113.8", 8080)
    request_bytes = b"GET /ip HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", proxy_app.port), timeout=IO_TIMEOUT_S) as sock:
        sock.sendall(header + request_bytes)
        response = http.client.HTTPResponse(sock)
        response.begin()
        seen = json.loads(response.read())
    assert seen["proxy_protocol_address"] == "203.0.113.8:8080"


@pytest.mark.parametrize(
    "header",
    [
        b"GET /ip HTTP/1.1\r\nHost: x\r\n\r\n",  # no header at all
        b"PROXY TCP4 300.1.1.1 192.0.2.1 1 2\r\n",  # bad address
        b"PROXY TCP4 203.0.113.7 192.0.2.1 65536 443\r\n",  # bad port
        b"PROXY " + b"A" * 120 + b"\r\n",  # longer than 107 bytes
        V2_SIGNATURE + b"\x31\x11\x00\x0c" + bytes(12),  # version 3
        V2_SIGNATURE + b"\x21\x11\x00\x04" + bytes(4),  # IPv4 block too short
    ],
)
def test_bad_or_missing_proxy_header_closes_the_connection(
    proxy_app: NodeApp, header: bytes
) -> None:
    with connection_after(proxy_app, header) as sock:
        sock.sendall(b"GET /ip HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        deadline = time.monotonic() + IO_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    assert received == b""
    assert "dropped connection" in proxy_app.stderr_path.read_text()


def test_websocket_works_behind_a_proxy_header(proxy_app: NodeApp) -> None:
    sock = connection_after(proxy_app, proxy_v2("198.51.100.11", 5555))
    sock.setblocking(False)
    result = asyncio.run(
        asyncio.wait_for(
            websocket_session(f"ws://127.0.0.1:{proxy_app.port}/ws", sock), 4 * IO_TIMEOUT_S
        )
    )
    assert result["text"] == "hello, edge"
    assert result["binary_ok"] is True
    assert result["close_code"] == 4001


# --- process behaviour -----------------------------------------------------------------------


def test_port_and_proxy_mode_from_the_environment(tmp_path: Path) -> None:
    port = free_port()
    started = start_app(tmp_path, port, [], env={"PORT": str(port), "PROXY_PROTOCOL": "1"})
    try:
        conn = http_over(connection_after(started, proxy_v1("203.0.113.9", 9)), port)
        try:
            seen = ip_over(conn)
        finally:
            conn.close()
        assert seen["backend"] == port
        assert seen["proxy_protocol_address"] == "203.0.113.9:9"
    finally:
        assert started.stop() == 0


def test_sigterm_exits_cleanly_with_clients_connected(tmp_path: Path) -> None:
    port = free_port()
    started = start_app(tmp_path, port, [str(port)])
    idle = http.client.HTTPConnection("127.0.0.1", started.port, timeout=IO_TIMEOUT_S)
    try:
        idle.request("GET", "/health")
        idle.getresponse().read()  # now an idle keep-alive connection
        started.process.send_signal(signal.SIGTERM)
        status = started.process.wait(IO_TIMEOUT_S)
        assert status == 0
    finally:
        idle.close()
        started.stop()


def test_bad_arguments_are_reported(tmp_path: Path) -> None:
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(APP_DIR / "server.js"), "--bogus"],
        capture_output=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2
    assert b'unknown argument "--bogus"' in done.stderr


def test_once_counts_each_request_id(app: NodeApp) -> None:
    first = get_json(app, "/once", {"X-Once-Id": "abc"})
    again = get_json(app, "/once", {"X-Once-Id": "abc"})
    other = get_json(app, "/once", {"X-Once-Id": "xyz"})
    assert (first["seen"], again["seen"], other["seen"]) == (1, 2, 1)
