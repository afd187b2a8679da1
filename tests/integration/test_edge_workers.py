"""A multi-worker edge: TLS resumption across workers, SIGTERM drain."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import ssl
import threading
from pathlib import Path

import pytest

from tests.conftest import PkiFiles, scaled
from tests.edge_env import edge_stack, node_available
from tests.polling import wait_for, wait_until

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")


def test_sessions_resume_across_workers_and_are_counted(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path, workers=2) as stack:
        context = stack.tls_context()
        session = None
        resumed = 0
        for i in range(40):
            raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=scaled(10))
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

        def access_workers() -> set[int]:  # access-log lines are written within a second
            access = [
                json.loads(line)
                for line in stack.log.read_text().splitlines()
                if line.startswith('{"ts"')
            ]
            return {e["worker"] for e in access if (e["path"] or "").startswith("/?i=")}

        workers = wait_for(access_workers, lambda w: len(w) == 2, "not both workers served")
        assert len(workers) == 2, f"all connections went to one worker: {workers}"
        counted = wait_for(  # workers publish their counts every second
            lambda: stack.edge_count("geoedge_edge_tls_handshakes_total", 'resumed="yes"'),
            lambda n: n >= 39,
            "resumptions not counted",
        )
        assert counted == 39


def closed_by_the_edge(tls: ssl.SSLSocket) -> bool:
    """The edge closed this idle keep-alive connection (a draining worker does)."""
    tls.settimeout(0.01)
    try:
        return tls.recv(1) == b""
    except TimeoutError:
        return False
    except (ssl.SSLError, OSError):
        return True


def test_sigterm_drains_in_flight_requests(test_pki: PkiFiles, tmp_path: Path) -> None:
    """The request is held at Node (/gate) from before the SIGTERM until both
    workers are seen draining (each closes its idle connections: eight idle
    witnesses, spread over the two by the kernel), then answered."""
    gate = f"/gate?n=2&group=drain&ms={int(scaled(60) * 1000)}"
    with edge_stack(test_pki, tmp_path, workers=2) as stack:
        result: dict[str, object] = {}

        def slow_request() -> None:
            conn = stack.https(timeout=60)
            conn.request("GET", gate)
            response = conn.getresponse()
            result["status"] = response.status
            result["body"] = response.read()

        witnesses = []
        for _ in range(8):
            raw = socket.create_connection(("127.0.0.1", stack.https_port), scaled(10))
            witnesses.append(stack.tls_context().wrap_socket(raw, server_hostname="localhost"))
            witnesses[-1].sendall(b"GET /ip HTTP/1.1\r\nHost: x\r\n\r\n")
            assert witnesses[-1].recv(65536).startswith(b"HTTP/1.1 200")  # now idle
        streams = stack.origin_count("geoedge_origin_streams_total")
        thread = threading.Thread(target=slow_request)
        thread.start()
        wait_until(
            lambda: stack.origin_count("geoedge_origin_streams_total") > streams,
            "the request never reached Node",
        )
        stack.edge.send_signal(signal.SIGTERM)
        wait_until(lambda: all(closed_by_the_edge(w) for w in witnesses), "no drain began")
        for witness in witnesses:
            witness.close()
        stack.answer_gate(gate)  # the second of the group: the held one is answered
        thread.join(scaled(30))
        assert result.get("status") == 200, result
        assert json.loads(result["body"]) == {"together": 2}  # type: ignore[arg-type]
        stack.edge.wait(scaled(30))
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
