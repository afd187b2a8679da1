"""The origin's side of backend keep-alive reuse (PROTOCOL.md §6.5.1), driven over a
real mutual-TLS tunnel the way an edge drives it, against real Node.js backends.

A stream ended with RESET IDLE leaves its backend connection parked; the next
stream to that backend takes it (Node's ``/ip`` shows the same ``remote_port``).
CANCEL never parks, and neither does a pool that sends PROXY headers: that
header speaks for one client, so each stream needs its own connection.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PkiFiles, run_async
from tests.integration.origin_harness import (
    CLIENT,
    SERVER,
    metric_values,
    metrics_when,
    needs_node,
    node_backends,
    origin_config,
    origin_in_process,
    pool,
)
from tests.tunnel_env import connect, dial_config, open_io
from tunnel.aio.connection import TunnelConnection
from tunnel.mux import ErrorCode

pytestmark = needs_node

REUSED = "geoedge_origin_backend_connections_reused_total"
STREAMS = "geoedge_origin_streams_total"


async def exchange(
    connection: TunnelConnection,
    *,
    end: ErrorCode,
    client: tuple[str, int] = CLIENT,
) -> dict[str, Any]:
    """One keep-alive ``GET /ip`` on a new stream; read the response whole (by its
    Content-Length), then end the stream with RESET ``end``, as an edge does."""
    io = open_io(connection, client_address=client, server_address=SERVER, host="app.test")
    io.write(b"GET /ip HTTP/1.1\r\nHost: app.test\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += await io.read(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    if len(body) < length:
        body += await io.readexactly(length - len(body))
    io.abort(end)
    return json.loads(body)


def run(test_pki: PkiFiles, tmp_path: Path, ends: list[ErrorCode], **settings: Any) -> Any:
    with node_backends(tmp_path, 1, proxy_protocol="proxy_protocol" in settings) as nodes:
        config = origin_config(test_pki, [pool([nodes[0].address], health=False, **settings)])
        port = int(config.tunnel_listener.address.rpartition(":")[2])

        async def main() -> tuple[list[dict[str, Any]], str]:
            async with origin_in_process(config):
                connection = await connect(dial_config(test_pki, port))
                seen = []
                for i, end in enumerate(ends):
                    client = (f"203.0.113.{i + 1}", 40000 + i)
                    # Its RESET goes out before the next stream's OPEN on this one
                    # connection: the origin parks (or not) before it sees the next.
                    seen.append(await exchange(connection, end=end, client=client))
                connection.abort()
                # Every stream counted (a reuse is counted with its stream, in the
                # same publication): then the reuses, or their absence, show.
                text = await metrics_when(config, STREAMS, lambda n: n >= len(ends))
                return seen, text

        return run_async(main(), 30)


def test_idle_end_parks_the_backend_connection_for_the_next_stream(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    seen, metrics = run(test_pki, tmp_path, [ErrorCode.IDLE, ErrorCode.IDLE, ErrorCode.CANCEL])
    ports = [s["remote_port"] for s in seen]
    assert ports[0] == ports[1] == ports[2]  # the third took what the second left
    reused = metric_values(metrics, REUSED)
    assert sum(reused.values()) == 2


def test_cancel_end_never_parks(test_pki: PkiFiles, tmp_path: Path) -> None:
    seen, _ = run(test_pki, tmp_path, [ErrorCode.CANCEL, ErrorCode.CANCEL, ErrorCode.IDLE])
    ports = [s["remote_port"] for s in seen]
    assert len(set(ports)) == 3


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_proxy_protocol_pool_gives_each_stream_its_own_connection(
    test_pki: PkiFiles, tmp_path: Path, version: str
) -> None:
    seen, metrics = run(test_pki, tmp_path, [ErrorCode.IDLE] * 3, proxy_protocol=version)
    assert [s["proxy_protocol_address"] for s in seen] == [
        f"203.0.113.{i + 1}:{40000 + i}" for i in range(3)
    ]
    assert len({s["remote_port"] for s in seen}) == 3
    assert not sum(metric_values(metrics, REUSED).values())


def test_a_reused_connection_reset_before_answering_ends_like_a_close(
    test_pki: PkiFiles,
) -> None:
    """The race behind keep-alive reuse: the backend's idle timeout fires just as
    a reused connection carries a new request. The backend here (a raw socket
    server, standing in for that timing) answers the first request keep-alive
    and resets the connection on the second. The stream must end as a close
    before any response (the edge then replays a GET, or answers 502), not as
    UPSTREAM_RESET (which the edge must treat as "maybe processed")."""
    import socket
    import struct

    async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = json.dumps({"remote_port": writer.get_extra_info("peername")[1]}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await reader.readuntil(b"\r\n\r\n")
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def main() -> tuple[bytes, BaseException | None, float]:
        server = await asyncio.start_server(backend, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        config = origin_config(test_pki, [pool([address], health=False)])
        port = int(config.tunnel_listener.address.rpartition(":")[2])
        try:
            async with origin_in_process(config):
                connection = await connect(dial_config(test_pki, port))
                await exchange(connection, end=ErrorCode.IDLE)  # RESET, then the next OPEN
                io = open_io(connection, client_address=CLIENT, server_address=SERVER)
                io.write(b"GET /ip HTTP/1.1\r\nHost: app.test\r\n\r\n")
                data = await io.read_all()
                error = io.exception
                text = await metrics_when(config, REUSED, lambda n: n >= 1)
                connection.abort()
        finally:
            server.close()
        reused = metric_values(text, REUSED)
        return data, error, sum(reused.values())

    data, error, reused = run_async(main(), 30)
    assert reused == 1  # the second stream did take the parked connection
    assert data == b""
    assert error is None, error
