"""A multi-worker edge: TLS resumption across workers, SIGTERM drain."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import PkiFiles
from tests.edge_env import edge_stack, node_available

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")


def test_sessions_resume_across_workers_and_are_counted(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path, workers=2) as stack:
        context = stack.tls_context()
        session = None
        resumed = 0
        for i in range(40):
            raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=5)
            tls = context.wrap_socket(raw, server_hostname="localhost", session=session)
            tls.sendall(
                f"GET /?i={i} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
            )
            while tls.recv(65536):
                pass
            resumed += tls.session_reused
            session = tls.session if session is None else session
            tls.close()
        assert resumed == 39, "every connection after the first should resume"
        workers: set[int] = set()
        deadline = time.monotonic() + 5  # access-log lines are written within a second
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            access = [
                json.loads(line)
                for line in stack.log.read_text().splitlines()
                if line.startswith('{"ts"')
            ]
            workers = {e["worker"] for e in access if (e["path"] or "").startswith("/?i=")}
        assert len(workers) == 2, f"all connections went to one worker: {workers}"
        counted = 0.0
        deadline = time.monotonic() + 5  # workers publish their counts every second
        while counted < 39 and time.monotonic() < deadline:
            time.sleep(0.2)
            counted = sum(
                float(line.rsplit(" ", 1)[1])
                for line in stack.metrics().splitlines()
                if line.startswith("geoedge_edge_tls_handshakes_total") and 'resumed="yes"' in line
            )
        assert counted >= 39


def test_sigterm_drains_in_flight_requests(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path, workers=2) as stack:
        result: dict[str, object] = {}

        def slow_request() -> None:
            conn = stack.https(timeout=20)
            conn.request("GET", "/slow?ms=1500")
            response = conn.getresponse()
            result["status"] = response.status
            result["body"] = response.read()

        thread = threading.Thread(target=slow_request)
        thread.start()
        time.sleep(0.5)
        stack.edge.send_signal(signal.SIGTERM)
        thread.join(20)
        assert result.get("status") == 200, result
        stack.edge.wait(20)
        assert stack.edge.returncode == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", stack.https_port), timeout=2)
        _ = http.client


def test_a_drain_answers_a_fresh_connection_and_closes_an_idle_one(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    """A worker retired by a reload (or stopped) while clients keep coming: a
    connection whose handshake is done and whose first request is on its way
    gets that request answered (``Connection: close``), not closed unanswered
    nor refused; an idle keep-alive connection is closed at once."""
    with edge_stack(test_pki, tmp_path) as stack:
        context = stack.tls_context()
        idle = context.wrap_socket(
            socket.create_connection(("127.0.0.1", stack.https_port), timeout=20),
            server_hostname="localhost",
        )
        idle.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        first = b""
        while b"\r\n\r\n" not in first:
            first += idle.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        fresh = context.wrap_socket(
            socket.create_connection(("127.0.0.1", stack.https_port), timeout=20),
            server_hostname="localhost",
        )  # handshaken, no request yet
        stack.edge.send_signal(signal.SIGTERM)
        # The idle keep-alive connection is closed: the worker drains now.
        rest = first
        while chunk := idle.recv(65536):
            rest += chunk
        fresh.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = b""
        while chunk := fresh.recv(65536):
            answer += chunk
        idle.close()
        fresh.close()
        assert stack.edge.wait(20) == 0
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 200"), answer[:200]
    assert b"\r\nconnection: close" in head
