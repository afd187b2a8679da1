"""A backend that takes its time on purpose, for the response deadlines of
both hops (tests/integration/test_origin_deadlines.py,
test_response_deadlines.py); and reading one HTTP/1.1 message off a socket.

HTTP/1.1 on a thread per connection, one request each. It reads the head and
the Content-Length body, sleeps ``?ms=`` milliseconds, then by path:
``/hang-head`` answers nothing, ``/hang-body`` sends a head and 10 of 100
octets and goes silent, anything else answers ``ok`` and closes. A connection
it holds is recorded in ``closed_by_peer`` once the origin gives up on it.
Every target read is in ``received``; one with ``?hold=1`` waits for the test
to set ``release`` before it sleeps and answers (held for as long as the test
needs, not for a time).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.conftest import PkiFiles
from tests.edge_env import Stack, edge_stack

__all__ = ["SlowBackend", "read_message", "slow_stack"]


def read_message(sock: socket.socket) -> bytes:
    """One Content-Length message (request or response), or what arrives
    before the connection ends."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class SlowBackend:
    """Listening on ``port`` from construction to :meth:`close`."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.closed_by_peer: list[str] = []
        self.received: list[str] = []
        self.release = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                request = read_message(conn)
                if b"\r\n\r\n" not in request:
                    return
                target = request.split(b" ", 2)[1].decode()
                self.received.append(target)
                query = parse_qs(urlsplit(target).query)
                if query.get("hold") == ["1"]:
                    self.release.wait(60)
                time.sleep(int(query.get("ms", ["0"])[0]) / 1000)
                if target.startswith("/hang-body"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
                elif not target.startswith("/hang-head"):
                    # One request per connection: the origin must not park it for the next.
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                    )
                    return
                conn.settimeout(10)
            except OSError:
                return
            try:  # hold the connection until the origin gives up on it
                if conn.recv(1) == b"":
                    self.closed_by_peer.append(target)
            except OSError:  # a reset, or the 10 s passed
                self.closed_by_peer.append(target)

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def slow_stack(test_pki: PkiFiles, tmp: Path, **edge_stack_options: Any) -> Iterator[Stack]:
    """An edge and an origin in front of a :class:`SlowBackend`, which the stack
    carries as ``backend``; ``edge_stack_options`` as :func:`edge_stack` takes them."""
    backend = SlowBackend()
    try:
        with edge_stack(test_pki, tmp, backend_port=backend.port, **edge_stack_options) as stack:
            stack.backend = backend  # type: ignore[attr-defined]
            yield stack
    finally:
        backend.close()
