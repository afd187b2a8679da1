"""Every byte delivered, or an honest error (issue "Lose nothing"), end to end with
a real edge, the real origin balancer, real TLS and Node.js:

- a request that finds no tunnel waits for one that is coming up (edge start,
  origin restart) instead of failing, and gets a 503 at the bound;
- a stream that breaks under a request gives the client a 502 (or a replay),
  never a bare close, on the first request of a connection and on later ones;
- the access log's ``bytes_out`` is what the client was sent, and its
  ``outcome`` says whose fault an error was;
- an outage writes a few warning lines, not one per request.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PkiFiles, scaled
from tests.edge_env import (
    ROOT,
    Processes,
    Stack,
    edge_stack,
    node_available,
    start_edge,
    wait_port,
    write_edge_config,
    write_origin_config,
)
from tests.polling import wait_until
from tests.tunnel_env import free_port

pytestmark = pytest.mark.skipif(not node_available(), reason="npm ci the sample app first")

PATTERN_MODULUS = 251  # the sample app's bodies: octet i is i % 251


def pattern(length: int) -> bytes:
    return bytes(i % PATTERN_MODULUS for i in range(length))


def access_lines(log: Path) -> list[dict]:
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"request_id"' in line:
            lines.append(json.loads(line))
    return lines


def wait_access_line(log: Path, path: str, timeout: float = 10.0) -> dict:
    """The access-log line of the last request for ``path`` (lines are flushed within 1 s)."""
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        found = [line for line in access_lines(log) if line["path"] == path]
        if found:
            return found[-1]
        time.sleep(0.1)
    raise AssertionError(f"no access-log line for {path}:\n{log.read_text()[-3000:]}")


def tls_connect(port: int, pki: PkiFiles, timeout: float = 30.0) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(pki.ca))
    raw = socket.create_connection(("127.0.0.1", port), timeout=scaled(timeout))
    return context.wrap_socket(raw, server_hostname="localhost", suppress_ragged_eofs=False)


def read_response(tls: ssl.SSLSocket) -> tuple[int, dict[str, str], bytes, str]:
    """One response with a Content-Length: (status, headers, body, how it ended:
    "complete", "close_notify", or the error of a ragged end)."""
    data = bytearray()
    ending = "complete"
    while b"\r\n\r\n" not in data:
        try:
            chunk = tls.recv(65536)
        except (ssl.SSLError, OSError) as exc:
            return 0, {}, bytes(data), f"{type(exc).__name__}"
        if not chunk:
            return 0, {}, bytes(data), "close_notify"
        data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    length = int(headers.get("content-length", "0"))
    received = bytearray(body)
    while len(received) < length:
        try:
            chunk = tls.recv(65536)
        except (ssl.SSLError, OSError) as exc:
            ending = type(exc).__name__
            break
        if not chunk:
            ending = "close_notify"
            break
        received += chunk
    return status, headers, bytes(received), ending


def kill_origin(stack: Stack) -> None:
    """SIGKILL the origin's workers and its supervisor: an origin host that dies."""
    assert stack.origin is not None
    children = subprocess.run(
        ["pgrep", "-P", str(stack.origin.pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)
    stack.stop_origin()


@pytest.fixture
def stack(test_pki: PkiFiles, tmp_path: Path) -> Iterator[Stack]:
    with edge_stack(test_pki, tmp_path, extra_top="") as s:
        yield s


# -- waiting for a tunnel ---------------------------------------------------------


def test_requests_sent_before_the_first_tunnel_is_up_wait_for_it(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    """Right after an edge starts it used to answer 502 until its first tunnel
    connection was up (14 of the first 17 requests in one run)."""
    procs = Processes()
    node_port, origin_port = free_port(), free_port()
    https_port, admin_port = free_port(), free_port()
    try:
        procs.node(node_port)
        origin_config = write_origin_config(
            tmp_path / "origin.toml", test_pki, port=origin_port, backends=[node_port]
        )
        config = write_edge_config(
            tmp_path / "edge.toml",
            test_pki,
            https_port=https_port,
            admin_port=admin_port,
            origins=[("origin-a", origin_port)],
            extra_top=PATIENT,
        )
        log = tmp_path / "edge.log"
        start_edge(procs, config, log)
        wait_port(https_port)  # the edge accepts; no origin runs yet
        sent = threading.Semaphore(0)

        def get() -> int:
            with tls_connect(https_port, test_pki) as tls:
                tls.sendall(b"GET /ip HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                sent.release()
                return read_response(tls)[0]

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(get) for _ in range(12)]
            for _ in futures:  # every request went out before the origin starts
                assert sent.acquire(timeout=scaled(30)), "a request was never sent"
            procs.start([sys.executable, "-m", "origin", "--config", str(origin_config)], cwd=ROOT)
            statuses = [f.result(timeout=scaled(60)) for f in futures]
        assert statuses == [200] * 12
    finally:
        procs.stop_all()


def test_a_request_waits_at_most_tunnel_wait_s_then_gets_a_503(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with edge_stack(test_pki, tmp_path, extra_top="[http]\ntunnel_wait_s = 1.0\n") as s:
        s.stop_origin()
        wait_unhealthy(s)
        started = time.monotonic()
        status, body = s.get("/ip")
        waited = time.monotonic() - started
        assert status == 503, body
        # The bound is the point ("at most tunnel_wait_s"): 1 s plus a
        # connection and an answer, scaled; the lower one cannot fail on load.
        assert 0.9 <= waited < scaled(4)
        line = wait_access_line(s.log, "/ip")
        assert (line["status"], line["outcome"]) == (503, "no_tunnel")


def test_a_request_during_an_origin_restart_waits_for_the_new_tunnel(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with edge_stack(test_pki, tmp_path, extra_top=PATIENT) as stack:
        stack.stop_origin()
        wait_unhealthy(stack)
        result: list[int] = []
        sent = threading.Event()

        def get() -> None:
            with tls_connect(stack.https_port, stack.pki) as tls:
                tls.sendall(b"GET /ip HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                sent.set()
                result.append(read_response(tls)[0])

        thread = threading.Thread(target=get)
        thread.start()
        assert sent.wait(scaled(30)), "the request was never sent"  # before the origin starts
        stack.start_origin()
        thread.join(scaled(60))
        assert result == [200]


#: Requests wait for a tunnel longer than an origin takes to start on a busy
#: machine (the default, 5 s, is what test_..._then_gets_a_503 checks).
PATIENT = "[http]\ntunnel_wait_s = 60.0\n"


def wait_unhealthy(stack: Stack, timeout: float = 10) -> None:
    import http.client

    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", stack.admin_port, timeout=scaled(5))
        conn.request("GET", "/healthz")
        if conn.getresponse().status != 200:
            return
        time.sleep(0.05)
    raise AssertionError("the edge still reports a tunnel up")


# -- a stream that breaks under a request ---------------------------------------------


#: Held at Node until the origin is gone (its gate never opens).
HELD = "/gate?n=2&group=killed&ms=600000"


@pytest.mark.parametrize(
    "request_bytes",
    [
        f"GET {HELD} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        f"POST {HELD} HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc".encode(),
    ],
    ids=["get", "post"],
)
def test_an_origin_killed_under_a_keepalive_request_gives_an_answer_not_a_close(
    stack: Stack, request_bytes: bytes
) -> None:
    """The second request of a keep-alive connection, in flight when the origin
    dies, used to get a bare close and a 499 in the access log. A POST gets a
    502 (the origin's fault; it may have run). A GET is replayed, once, and a
    replay waits for a tunnel as a new request does: with the only origin dead,
    none comes within ``tunnel_wait_s``, so it gets the 503 a new request would.
    Unless the edge's other tunnel connection to that origin (it keeps two) is
    not yet known dead when the replay leaves: the replay goes on it, breaks
    with it, and gets the 502 of a second failure. Which of the two depends on
    the order the kernel reports the connections' ends, not on the edge."""
    with tls_connect(stack.https_port, stack.pki) as tls:
        tls.sendall(b"GET /ip HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(tls)[0] == 200
        streams = stack.origin_count("geoedge_origin_streams_total")
        tls.sendall(request_bytes)
        wait_until(  # in flight: at Node, held there
            lambda: stack.origin_count("geoedge_origin_streams_total") > streams,
            "the request never reached Node",
        )
        replayed = stack.edge_count("geoedge_edge_errors_total", 'reason="replayed"')
        kill_origin(stack)
        status, _, body, _ = read_response(tls)
    line = wait_access_line(stack.log, HELD)
    assert line["status"] == status, body
    if request_bytes.startswith(b"GET"):
        assert (status, line["outcome"]) in {(503, "no_tunnel"), (502, "upstream_reset")}, body
        wait_until(  # the replay happened, either way
            lambda: stack.edge_count("geoedge_edge_errors_total", 'reason="replayed"') > replayed,
            "the GET was not replayed",
        )
    else:
        assert (status, line["outcome"]) == (502, "upstream_reset"), body


def test_an_origin_killed_mid_response_closes_and_logs_the_upstream(stack: Stack) -> None:
    size = 400_000_000
    with tls_connect(stack.https_port, stack.pki) as tls:
        tls.sendall(f"GET /bytes?n={size} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        tls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        received = 0
        while received < 10_000_000:
            received += len(tls.recv(1 << 20))
        kill_origin(stack)
        ending = read_to_the_end(tls)
    assert ending != "close_notify"  # a cut the client can tell from an end
    line = wait_access_line(stack.log, f"/bytes?n={size}")
    assert line["status"] == 200
    assert line["outcome"] == "upstream_reset"
    assert line["bytes_out"] < size


def read_to_the_end(tls: ssl.SSLSocket) -> str:
    """Read and discard until the connection ends; how it ended."""
    while True:
        try:
            if not tls.recv(1 << 20):
                return "close_notify"
        except (ssl.SSLError, OSError) as exc:
            return type(exc).__name__


# -- the access log counts what the client was sent ----------------------------------


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_connection_close_large_responses_arrive_whole_and_are_logged_as_sent(
    stack: Stack, version: ssl.TLSVersion
) -> None:
    expected = hashlib.sha256(pattern(768 * 1024)).hexdigest()
    context = ssl.create_default_context(cafile=str(stack.pki.ca))
    context.minimum_version = context.maximum_version = version
    for i in range(6):
        path = f"/bytes?n={768 * 1024}&i={i}"
        raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=scaled(30))
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # a slow reader
        with context.wrap_socket(
            raw, server_hostname="localhost", suppress_ragged_eofs=False
        ) as tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            head_and_body = bytearray()
            while True:
                if i % 2:
                    time.sleep(0.001)
                chunk = tls.recv(65536)
                if not chunk:
                    break  # close_notify: a ragged end raises instead
                head_and_body += chunk
        body = bytes(head_and_body).partition(b"\r\n\r\n")[2]
        assert hashlib.sha256(body).hexdigest() == expected, (i, len(body))
        line = wait_access_line(stack.log, path)
        assert line["bytes_out"] == len(head_and_body), line
        assert line["outcome"] == "ok"


def test_a_client_that_leaves_mid_response_is_logged_with_what_it_was_sent(
    stack: Stack,
) -> None:
    size = 200_000_000
    path = f"/bytes?n={size}"
    raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=scaled(30))
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    context = ssl.create_default_context(cafile=str(stack.pki.ca))
    tls = context.wrap_socket(raw, server_hostname="localhost")
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    tls.recv(65536)
    time.sleep(0.5)  # every buffer on the way fills up
    tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    tls.close()  # a reset: the client is gone
    line = wait_access_line(stack.log, path)
    assert line["outcome"] == "client_closed"
    assert 0 < line["bytes_out"] < 50_000_000  # what the kernel took, not the whole body


# -- an outage is a few lines -------------------------------------------------------


def test_an_outage_writes_a_few_warning_lines_not_one_per_request(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with edge_stack(test_pki, tmp_path, extra_top="[http]\ntunnel_wait_s = 0.2\n") as s:
        s.stop_origin()
        wait_unhealthy(s)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda _: s.get("/ip")[0], range(80)))
        assert statuses == [503] * 80
        # Every request logged (access lines are flushed within a second): the
        # warnings they could cause have been written by then.
        wait_until(
            lambda: sum(line["path"] == "/ip" for line in access_lines(s.log)) >= 80,
            "not every request was logged",
        )
        warnings = [
            line
            for line in s.log.read_text().splitlines()
            if "WARNING" in line and "geoedge.edge" in line
        ]
        assert 1 <= len(warnings) <= 10, warnings


# -- the same for keep-alive connections and WebSockets ---------------------------------


def test_large_keepalive_responses_arrive_whole_to_slow_and_fast_readers(stack: Stack) -> None:
    size = 768 * 1024
    expected = hashlib.sha256(pattern(size)).hexdigest()
    raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=scaled(30))
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    context = ssl.create_default_context(cafile=str(stack.pki.ca))
    with context.wrap_socket(raw, server_hostname="localhost", suppress_ragged_eofs=False) as tls:
        for i in range(6):
            tls.sendall(f"GET /bytes?n={size}&k={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            if i % 2:
                time.sleep(0.2)  # a late reader: every buffer on the way is full first
            status, _, body, ending = read_response(tls)
            assert (status, ending) == (200, "complete")
            assert hashlib.sha256(body).hexdigest() == expected, (i, len(body))


def test_a_websocket_closed_right_after_a_large_message_delivers_it_whole(
    stack: Stack,
) -> None:
    """The client sends a 4 MiB message and its close frame back to back; the
    backend echoes the message, answers the close and ends its connection, so
    the edge closes the client right behind the last octets of the echo."""
    message = os.urandom(4 * 1024 * 1024)
    with tls_connect(stack.https_port, stack.pki) as tls:
        tls.sendall(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        reader = WsReader(tls)
        assert reader.read_head().startswith(b"HTTP/1.1 101")
        tls.sendall(ws_frame(0x2, message) + ws_frame(0x8, (1000).to_bytes(2, "big")))
        opcode, echoed = reader.read_frame()
        assert opcode == 0x2
        assert hashlib.sha256(echoed).digest() == hashlib.sha256(message).digest()
        opcode, payload = reader.read_frame()
        assert (opcode, payload[:2]) == (0x8, (1000).to_bytes(2, "big"))
        assert reader.read_to_end() == "close_notify"


def test_a_websocket_is_logged_at_its_end_with_its_close_code_and_who_sent_it(
    stack: Stack,
) -> None:
    """One access-log line when the session ends: duration, bytes each way, and
    the first Close frame's code and sender (the edge follows the frames)."""
    message = os.urandom(70_000)  # a 64-bit length field on the way back
    with tls_connect(stack.https_port, stack.pki) as tls:
        tls.sendall(
            b"GET /ws?close-code HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        reader = WsReader(tls)
        assert reader.read_head().startswith(b"HTTP/1.1 101")
        tls.sendall(ws_frame(0x2, message[:100]))  # split: a frame across writes
        time.sleep(0.05)
        tls.sendall(ws_frame(0x2, message)[:50])
        time.sleep(0.05)
        tls.sendall(ws_frame(0x2, message)[50:] + ws_frame(0x8, (4001).to_bytes(2, "big")))
        assert reader.read_frame()[0] == 0x2 and reader.read_frame()[0] == 0x2
        opcode, payload = reader.read_frame()
        assert (opcode, payload[:2]) == (0x8, (4001).to_bytes(2, "big"))
        reader.read_to_end()
    lines = wait_until(
        lambda: [
            json.loads(line)
            for line in stack.log.read_text(errors="replace").splitlines()
            if line.startswith('{"ts"') and '"/ws?close-code"' in line
        ],
        "no access-log line for the WebSocket",
    )
    (line,) = lines
    assert (line["protocol"], line["status"]) == ("ws", 101)
    assert (line["ws_close_code"], line["ws_closed_by"]) == (4001, "client")
    assert line["bytes_in"] > 70_100 and line["bytes_out"] > 70_100
    assert line["duration_ms"] >= 100


def ws_frame(opcode: int, payload: bytes) -> bytes:
    """One masked client frame (RFC 6455 §5.2)."""
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        header = bytes([0x80 | opcode, 0x80 | size])
    elif size < 65536:
        header = bytes([0x80 | opcode, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        header = bytes([0x80 | opcode, 0x80 | 127]) + size.to_bytes(8, "big")
    repeated = (mask * (size // 4 + 1))[:size]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(
        size, "big"
    )
    return header + mask + masked


class WsReader:
    """Reads a 101 head and unmasked server frames from a blocking TLS socket."""

    def __init__(self, tls: ssl.SSLSocket) -> None:
        self.tls = tls
        self.buffer = bytearray()

    def _fill(self, size: int) -> None:
        while len(self.buffer) < size:
            chunk = self.tls.recv(1 << 20)
            if not chunk:
                raise AssertionError(f"closed with {len(self.buffer)} of {size} octets")
            self.buffer += chunk

    def _take(self, size: int) -> bytes:
        self._fill(size)
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def read_head(self) -> bytes:
        while b"\r\n\r\n" not in self.buffer:
            self._fill(len(self.buffer) + 1)
        end = self.buffer.index(b"\r\n\r\n") + 4
        return self._take(end)

    def read_frame(self) -> tuple[int, bytes]:
        first, second = self._take(2)
        size = second & 0x7F
        if size == 126:
            size = int.from_bytes(self._take(2), "big")
        elif size == 127:
            size = int.from_bytes(self._take(8), "big")
        payload = self._take(size)
        if not first & 0x80:  # a fragmented message: gather its continuations
            while True:
                opcode, more = self.read_frame_raw()
                payload += more
                if opcode & 0x80:
                    break
        return first & 0x0F, payload

    def read_frame_raw(self) -> tuple[int, bytes]:
        first, second = self._take(2)
        size = second & 0x7F
        if size == 126:
            size = int.from_bytes(self._take(2), "big")
        elif size == 127:
            size = int.from_bytes(self._take(8), "big")
        return first, self._take(size)

    def read_to_end(self) -> str:
        try:
            while self.tls.recv(65536):
                pass
        except (ssl.SSLError, OSError) as exc:
            return type(exc).__name__
        return "close_notify"
