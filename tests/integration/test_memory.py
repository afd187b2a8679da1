"""Every per-connection object is freed by reference counting when its connection
closes: no reference cycles on the hot path (:mod:`geoedge.memory`).

- the edge's TLS transport with a protocol that keeps it (every way a
  connection can end), and the origin's splices and backend protocols (every
  way a stream can end), in process with the collector off (:mod:`tests.leaks`);
- the real daemons: edge, origin and Node.js processes, WebSockets, short
  connections (aborted handshakes, clients that vanish mid-response) and
  HTTP/2 connections (some with a stream reset), then
  ``SIGUSR2``: each worker's memory report counts what is still alive of its
  own classes *before* any collection, and what a full collection then finds.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import re
import signal
import socket
import ssl
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from edge.listener import TlsListener
from edge.tls_transport import TlsServerTransport
from loadtests.soak_clients import Outcomes, Target, WebSocketBatch, run_short_mix
from origin.forward import BackendProtocol, Splice
from tests.conftest import PkiFiles, run_async, scaled
from tests.edge_env import Stack, edge_stack, node_available, tcp_connections_to
from tests.h2_client import H2Client
from tests.integration.origin_harness import (
    CLIENT,
    SERVER,
    needs_node,
    node_backends,
    origin_config,
    origin_in_process,
    pool,
)
from tests.leaks import collector_off, live
from tests.polling import wait_until, wait_until_async
from tests.tunnel_env import connect, dial_config, free_port, open_io
from tunnel.aio.errors import StreamResetError
from tunnel.mux import ErrorCode

_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


async def settle(seconds: float = 0.1) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def with_node(test: Any) -> Any:
    for mark in needs_node:
        test = mark(test)
    return test


# --------------------------------------------------------------------------- TLS transport


class Holder(asyncio.Protocol):
    """Keeps its transport, as the edge's client connection does; answers
    ``pong`` to ``ping`` and then closes, or waits for the client."""

    def __init__(self, close_after_reply: bool) -> None:
        self.transport: asyncio.Transport | None = None
        self.close_after_reply = close_after_reply
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"pong")
        if self.close_after_reply:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(None)


def test_tls_connections_are_freed_however_they_end(test_pki: PkiFiles) -> None:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(test_pki.server.cert, test_pki.server.key)
    client = ssl.create_default_context(cafile=str(test_pki.ca))

    async def main() -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        address = sock.getsockname()
        holders: list[Holder] = []

        def factory() -> Holder:
            holders.append(Holder(close_after_reply=len(holders) % 2 == 0))
            return holders[-1]

        listener = TlsListener(sock, server, factory, 0.5, linger_s=0.2)

        async def ping_pong() -> None:  # the server closes (even) or the client does (odd)
            reader, writer = await asyncio.open_connection(
                *address, ssl=client, server_hostname="localhost"
            )
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"pong"
            writer.close()

        async def vanish() -> None:  # a reset while the connection is open
            reader, writer = await asyncio.open_connection(
                *address, ssl=client, server_hostname="localhost"
            )
            writer.write(b"ping")
            await reader.readexactly(4)
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
            writer.transport.abort()

        async def no_tls() -> None:  # a failed handshake, and a silent client (timeout)
            for data in (b"GET / HTTP/1.1\r\n\r\n", b""):
                reader, writer = await asyncio.open_connection(*address)
                writer.write(data)
                with contextlib.suppress(ConnectionError):
                    await asyncio.wait_for(reader.read(), 5)
                writer.close()

        with collector_off():
            transports, before = live(TlsServerTransport), live(Holder)
            for _ in range(10):
                await asyncio.gather(ping_pong(), ping_pong(), vanish(), no_tls())
            opened = [h for h in holders if h.transport is not None]
            assert len(holders) == 50 and len(opened) == 30  # 20 never got past TLS
            await asyncio.wait_for(asyncio.gather(*(h.lost for h in opened)), 10)
            del holders[:], opened
            await wait_until_async(  # the lingering closes
                lambda: live(TlsServerTransport) == transports and live(Holder) == before,
                lambda: f"alive: {live(TlsServerTransport)} transports, {live(Holder)} protocols",
            )
        listener.close()
        sock.close()

    run_async(main(), 60)


# --------------------------------------------------------------------------- origin


@with_node
def test_origin_splices_are_freed_however_their_stream_ends(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with node_backends(tmp_path, 1) as nodes:
        dead = pool(
            [f"127.0.0.1:{free_port()}"],
            name="dead",
            health=False,
            default=False,
            hosts=("dead.test",),
        )
        live_pool = pool([nodes[0].address], health=False, keepalive_timeout_s=0.3)
        config = origin_config(test_pki, [live_pool, dead])
        port = int(config.tunnel_listener.address.rpartition(":")[2])

        async def main() -> None:
            async with origin_in_process(config):
                connection = await connect(dial_config(test_pki, port))

                def stream(path: str, host: str = "app.test", close: bool = False) -> Any:
                    io = open_io(
                        connection, client_address=CLIENT, server_address=SERVER, host=host
                    )
                    extra = "Connection: close\r\n" if close else ""
                    io.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode())
                    return io

                async def closed_by_backend() -> None:
                    io = stream("/ip", close=True)
                    assert (await io.read_all()).startswith(b"HTTP/1.1 200")
                    io.write_eof()

                async def parked(end: ErrorCode) -> None:  # keep-alive, then IDLE (or not)
                    io = stream("/ip")
                    data = b""
                    while b'"backend"' not in data:
                        data += await io.read(65536)
                    io.abort(end)

                async def reset_in_flight() -> None:  # the client vanished mid-request
                    io = stream("/slow?ms=2000")
                    await settle(0.1)
                    io.abort(ErrorCode.CANCEL)

                async def no_backend() -> None:
                    io = stream("/ip", host="dead.test")
                    with contextlib.suppress(StreamResetError):
                        await io.read_all()

                with collector_off():
                    splices, backends = live(Splice), live(BackendProtocol)
                    for _ in range(5):
                        await asyncio.gather(
                            closed_by_backend(),
                            parked(ErrorCode.IDLE),
                            parked(ErrorCode.CANCEL),
                            reset_in_flight(),
                            no_backend(),
                        )
                    await wait_until_async(  # parked connections expire after 0.3 s
                        lambda: live(Splice) == splices and live(BackendProtocol) == backends,
                        lambda: f"alive: {live(Splice)} splices, {live(BackendProtocol)} backends",
                    )
                connection.abort()

        run_async(main(), 60)


# --------------------------------------------------------------------------- the daemons


_REPORT = re.compile(r"memory report pid=(\d+) live=(\{[^}]*\}) .*?unreachable=(\d+|None)")

#: Live instances a class may gain over a load, once every connection closed.
ALLOWED_GROWTH = 0


def memory_report(stack: Stack, log: Path, parent_pid: int) -> tuple[dict[str, int], int]:
    """SIGUSR2 to a daemon's supervisor; its (one) worker's report: live
    instances by class, counted before the full collection, and what that found."""
    offset = log.stat().st_size
    os.kill(parent_pid, signal.SIGUSR2)
    deadline = time.monotonic() + scaled(15)
    while time.monotonic() < deadline:
        with log.open("rb") as f:
            f.seek(offset)
            found = _REPORT.search(f.read().decode(errors="replace"))
        if found:
            return ast.literal_eval(found[2]), int(found[3])
        time.sleep(0.1)
    raise AssertionError(f"no memory report in {log}:\n{log.read_text()[-2000:]}")


def h2_load(stack: Stack, connections: int, streams: int) -> int:
    """HTTP/2 clients: ``streams`` requests on each of ``connections``; on every
    other connection the last one is slow, reset by the client, which then
    closes without waiting.
    Returns the responses received whole."""
    whole = 0
    for index in range(connections):
        client = H2Client(stack.https_port, stack.pki.ca)
        try:
            ids = [client.request(f"/?h2={index}.{n}") for n in range(streams - 1)]
            ids.append(client.request("/slow?ms=2000" if index % 2 else "/"))
            for response in client.wait(ids[:-1]):
                whole += response.status == 200
            if index % 2:
                client.conn.reset_stream(ids[-1])
                client.flush()
            else:
                (response,) = client.wait(ids[-1:])
                whole += response.status == 200
        finally:
            client.close()
    return whole


def wait_idle(stack: Stack) -> None:
    """Until the edge has no client connection, the origin no stream open and
    no backend connection (parked ones expire after keepalive_timeout_s, 3 s):
    the census then counts only what outlived its connection."""
    wait_until(
        lambda: (
            stack.edge_count("geoedge_edge_connections_open") == 0
            and stack.origin_count("geoedge_origin_streams_active") == 0
            and tcp_connections_to(stack.node_port) == 0
        ),
        "connections still open",
        timeout_s=60,
    )


@with_node
@pytest.mark.skipif(not node_available(), reason="run `make node` first")
def test_the_daemons_free_every_connection_they_served(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        assert stack.origin is not None
        target = Target("127.0.0.1", stack.https_port, stack.tls_context(), "localhost")
        outcomes = Outcomes()

        async def load(websockets: int, short: int) -> None:
            batch = WebSocketBatch(target, outcomes)
            await batch.open_many(websockets, concurrency=32)
            await run_short_mix(target, short, concurrency=16, outcomes=outcomes)
            await batch.echo_all(concurrency=32)
            await batch.close_all(concurrency=32)

        run_async(load(20, 20), 60)  # warm-up: first-use caches, pools
        assert h2_load(stack, 4, 5) == 4 * 5 - 2
        wait_idle(stack)
        edge_before, _ = memory_report(stack, stack.log, stack.edge.pid)
        origin_before, _ = memory_report(stack, stack.origin_log, stack.origin.pid)

        run_async(load(300, 300), 120)
        assert h2_load(stack, 40, 10) == 40 * 10 - 20
        assert outcomes.total_failed == 0, outcomes.errors
        assert outcomes.ok["ws_echo"] == 320 and outcomes.ok["large_then_vanish"] == 32
        wait_idle(stack)
        edge_after, edge_unreachable = memory_report(stack, stack.log, stack.edge.pid)
        origin_after, origin_unreachable = memory_report(stack, stack.origin_log, stack.origin.pid)

    for name, before, after in (
        ("edge", edge_before, edge_after),
        ("origin", origin_before, origin_after),
    ):
        grown = {
            cls: after[cls] - before.get(cls, 0)
            for cls in after
            if after[cls] - before.get(cls, 0) > ALLOWED_GROWTH
        }
        assert grown == {}, f"{name}: still alive after every connection closed: {grown}"
    # Found by the full collection each report runs: nothing the connections left.
    assert edge_unreachable < 100, edge_unreachable
    assert origin_unreachable < 100, origin_unreachable
