"""A draining edge closes its WebSockets itself, spread over a window: each
client gets a Close 1001 between frames (a large message in flight arrives
whole first), the backend gets one too, and the access log says the edge
closed it. Real edge, origin and Node (the sample app's echo)."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack, edge_stack, node_available
from tests.integration.test_edge_lose_nothing import WsReader, tls_connect, ws_frame

pytestmark = pytest.mark.skipif(not node_available(), reason="run `make node` first")

SOCKETS = 12
WINDOW_S = 2.0


def open_websocket(stack: Stack, index: int) -> tuple[object, WsReader]:
    tls = tls_connect(stack.https_port, stack.pki)
    tls.sendall(
        f"GET /ws?drain={index} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    reader = WsReader(tls)
    assert reader.read_head().startswith(b"HTTP/1.1 101")
    tls.sendall(ws_frame(0x1, b"hello"))
    assert reader.read_frame() == (0x1, b"hello")
    return tls, reader


def test_a_drain_closes_websockets_with_1001_spread_over_the_window(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    keys = f"drain_websocket_window_s = {WINDOW_S}\n"
    with edge_stack(test_pki, tmp_path, edge_keys=keys) as stack:
        sockets = [open_websocket(stack, i) for i in range(SOCKETS)]
        # One of them has a 2 MiB echo on its way back when the drain starts.
        big = os.urandom(2 * 1024 * 1024)
        sockets[0][0].sendall(ws_frame(0x2, big))  # type: ignore[attr-defined]
        # In flight means on its way back: the drain starts once the echo's first
        # octets reach the client (before that, a Close may rightly come first:
        # the edge cannot know an echo is coming).
        readable, _, _ = select.select([sockets[0][0]], [], [], scaled(10))
        assert readable, "the echo never started"
        closes: list[tuple[int, float, int, bytes]] = []
        lock = threading.Lock()

        def wait_for_close(index: int, reader: WsReader) -> None:
            frames = []
            while True:
                opcode, payload = reader.read_frame()
                if opcode == 0x8:
                    with lock:
                        closes.append((index, time.monotonic(), len(frames), payload[:2]))
                    if index == 0:
                        frames_seen[:] = frames
                    return
                frames.append((opcode, payload))

        frames_seen: list[tuple[int, bytes]] = []
        threads = [
            threading.Thread(target=wait_for_close, args=(i, reader), daemon=True)
            for i, (_, reader) in enumerate(sockets)
        ]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        os.kill(stack.edge.pid, signal.SIGTERM)
        for thread in threads:
            thread.join(scaled(15))
        assert stack.edge.wait(scaled(20)) == 0
        for tls, _ in sockets:
            tls.close()  # type: ignore[attr-defined]
        lines = [
            json.loads(line)
            for line in stack.log.read_text(errors="replace").splitlines()
            if line.startswith('{"ts"') and '"/ws?drain=' in line
        ]
    assert len(closes) == SOCKETS, closes
    assert {code for _, _, _, code in closes} == {(1001).to_bytes(2, "big")}
    # The echo in flight arrived whole before the Close, not cut by it.
    assert frames_seen and frames_seen[0][0] == 0x2 and frames_seen[0][1] == big
    # Spread over the window, not one wave.
    offsets = sorted(at - started for _, at, _, _ in closes)
    assert offsets[-1] <= WINDOW_S + scaled(2), offsets
    assert offsets[-1] - offsets[0] >= WINDOW_S / 4, offsets
    assert len(lines) == SOCKETS
    assert {(line["ws_close_code"], line["ws_closed_by"]) for line in lines} == {(1001, "edge")}


def test_a_websocket_opened_during_a_drain_is_closed_with_1001(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    """A client whose connection was accepted before the drain and whose upgrade
    is answered during it (a reload retires the worker meanwhile) gets a Close
    1001 to reconnect on, not a cut at the drain deadline."""
    with edge_stack(test_pki, tmp_path) as stack:
        idle = tls_connect(stack.https_port, stack.pki)
        idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert WsReader(idle).read_head().startswith(b"HTTP/1.1 200")
        fresh = tls_connect(stack.https_port, stack.pki)  # handshaken, no request yet
        os.kill(stack.edge.pid, signal.SIGTERM)
        idle.settimeout(scaled(20))
        while idle.recv(65536):  # closed by the drain: the worker drains now
            pass
        fresh.sendall(
            b"GET /ws?late=1 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        reader = WsReader(fresh)
        assert reader.read_head().startswith(b"HTTP/1.1 101")
        opcode, payload = reader.read_frame()
        while opcode != 0x8:
            opcode, payload = reader.read_frame()
        fresh.sendall(ws_frame(0x8, payload[:2]))
        fresh.close()
        idle.close()
        assert stack.edge.wait(scaled(20)) == 0
    assert payload[:2] == (1001).to_bytes(2, "big")
