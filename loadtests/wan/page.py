"""``page`` samples: one page of ``resources`` small GETs requested at once, as a
browser loads a page's subresources from a cold start.

* offered ``h2`` (ALPN ``h2,http/1.1``) and answered ``h2``: one connection, every
  request sent as its own stream in the first flight after the handshake;
* offered ``http/1.1`` only: ``connections`` (6, a browser's per-host limit)
  connections opened at once, each taking the next request when its previous
  response is in (keep-alive, no pipelining).

Timed from the start of the first ``connect()`` to the last octet of the last
response. Every response must be a 200 with its whole body; a negotiated
protocol other than the one offered first is a failed sample. HTTP/2 framing
is the ``h2`` library's (the edge's own), client side.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable

import h2.config
import h2.connection
import h2.events

__all__ = ["PageError", "load_page"]

Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
ReadResponse = Callable[[asyncio.StreamReader, str], Awaitable[int]]


class PageError(Exception):
    """A page load failed: wrong protocol, status, or a stream ended early."""


def _paths(path: str, resources: int) -> list[str]:
    joiner = "&" if "?" in path else "?"
    return [f"{path}{joiner}resource={i}" for i in range(resources)]


async def load_page(
    open_connection: Opener,
    read_response: ReadResponse,
    *,
    host: str,
    path: str,
    alpn: str,
    resources: int,
    connections: int,
    check_tls: Callable[[ssl.SSLObject | None], None],
) -> dict[str, float]:
    """One page load; ``total_ms`` from the first connect to the last octet."""
    start = time.perf_counter()
    paths = _paths(path, resources)
    if alpn == "h2":
        reader, writer = await open_connection()
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            check_tls(ssl_object)
            if ssl_object.selected_alpn_protocol() != "h2":
                raise PageError(f"offered h2, got {ssl_object.selected_alpn_protocol()!r}")
            await _h2_page(reader, writer, host, paths)
        finally:
            writer.close()
    else:
        queue = list(reversed(paths))
        await asyncio.gather(
            *(_h1_worker(open_connection, read_response, host, queue, check_tls)
              for _ in range(min(connections, resources)))
        )  # fmt: skip
    return {"total_ms": round((time.perf_counter() - start) * 1000.0, 3)}


async def _h2_page(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, paths: list[str]
) -> None:
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    connection.increment_flow_control_window(15 * 1024 * 1024)  # as browsers do
    pending: set[int] = set()
    for path in paths:
        stream_id = connection.get_next_available_stream_id()
        connection.send_headers(
            stream_id,
            [(":method", "GET"), (":path", path), (":scheme", "https"),
             (":authority", host), ("user-agent", "geoedge-wan-measure")],
            end_stream=True,
        )  # fmt: skip
        pending.add(stream_id)
    writer.write(connection.data_to_send())
    while pending:
        data = await reader.read(65536)
        if not data:
            raise PageError(f"connection closed with {len(pending)} responses outstanding")
        for event in connection.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                status = dict(event.headers).get(b":status")
                if status != b"200":
                    raise PageError(f"stream {event.stream_id}: status {status!r}")
            elif isinstance(event, h2.events.DataReceived):
                connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                pending.discard(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                raise PageError(f"stream {event.stream_id} reset ({event.error_code})")
            elif isinstance(event, h2.events.ConnectionTerminated):
                raise PageError(f"GOAWAY ({event.error_code})")
        out = connection.data_to_send()
        if out:
            writer.write(out)


async def _h1_worker(
    open_connection: Opener,
    read_response: ReadResponse,
    host: str,
    queue: list[str],
    check_tls: Callable[[ssl.SSLObject | None], None],
) -> None:
    reader, writer = await open_connection()
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        check_tls(ssl_object)
        if ssl_object.selected_alpn_protocol() not in (None, "http/1.1"):
            raise PageError(f"offered http/1.1, got {ssl_object.selected_alpn_protocol()!r}")
        while queue:
            path = queue.pop()
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\n"
                "User-Agent: geoedge-wan-measure\r\nAccept: */*\r\n\r\n".encode()
            )
            await read_response(reader, path)
    finally:
        writer.close()
