"""Real tunnel endpoints on loopback for adapter tests: an origin-like listener
and an edge-like dialer, over mutual TLS or plain TCP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from geoedge.devstack import free_port as free_port  # the tests import it from here
from tests.conftest import PkiFiles
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.control import ControlHandler
from tunnel.aio.stream import StreamIO, TunnelStream
from tunnel.aio.transport import (
    TunnelDialConfig,
    TunnelListenerConfig,
    dial_tunnel,
    serve_tunnel,
)
from tunnel.mux import SessionConfig

Handler = Callable[[StreamIO], "asyncio.Future[None] | asyncio.Task[None] | object"]


@dataclass
class TunnelServer:
    """Accepts tunnel connections; runs ``handler(StreamIO)`` for each stream."""

    server: asyncio.Server
    port: int
    connections: list[TunnelConnection] = field(default_factory=list)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def close(self) -> None:
        self.server.close()
        for connection in self.connections:
            connection.abort("test over")
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def listener_config(test_pki: PkiFiles, port: int, **overrides: object) -> TunnelListenerConfig:
    base: dict[str, object] = dict(
        address=f"127.0.0.1:{port}",
        transport="tls",
        cert=test_pki.origin.cert,
        key=test_pki.origin.key,
        ca=test_pki.ca,
        allowed_identities=("edge-1",),
    )
    base.update(overrides)
    return TunnelListenerConfig(**base)  # type: ignore[arg-type]


def dial_config(test_pki: PkiFiles, port: int, **overrides: object) -> TunnelDialConfig:
    base: dict[str, object] = dict(
        address=f"127.0.0.1:{port}",
        transport="tls",
        server_name="localhost",
        cert=test_pki.edge.cert,
        key=test_pki.edge.key,
        ca=test_pki.ca,
    )
    base.update(overrides)
    return TunnelDialConfig(**base)  # type: ignore[arg-type]


async def start_server(
    config: TunnelListenerConfig,
    handler: Callable[[StreamIO], object],
    session_config: SessionConfig | None = None,
    control_handlers: Mapping[int, ControlHandler] | None = None,
) -> TunnelServer:
    holder: list[TunnelServer] = []

    def on_stream(stream: TunnelStream) -> asyncio.BaseProtocol:
        io = StreamIO()

        async def run() -> None:
            await asyncio.sleep(0)  # connection_made has run by now
            await handler(io)  # type: ignore[misc]

        task = asyncio.get_running_loop().create_task(run())
        holder[0].tasks.add(task)
        task.add_done_callback(holder[0].tasks.discard)
        return io

    def on_connection(connection: TunnelConnection) -> None:
        holder[0].connections.append(connection)

    server = await serve_tunnel(
        config,
        session_config or SessionConfig(),
        on_stream,
        on_connection=on_connection,
        control_handlers=control_handlers,
    )
    port = server.sockets[0].getsockname()[1]
    holder.append(TunnelServer(server, port))
    return holder[0]


async def connect(
    config: TunnelDialConfig,
    session_config: SessionConfig | None = None,
    control_handlers: Mapping[int, ControlHandler] | None = None,
) -> TunnelConnection:
    return await dial_tunnel(
        config, session_config or SessionConfig(), control_handlers=control_handlers
    )


def open_io(connection: TunnelConnection, **metadata: object) -> StreamIO:
    from tunnel.mux import StreamMetadata

    ios: list[StreamIO] = []

    def factory() -> StreamIO:
        ios.append(StreamIO())
        return ios[-1]

    connection.open_stream(StreamMetadata(**metadata), factory)  # type: ignore[arg-type]
    return ios[0]
