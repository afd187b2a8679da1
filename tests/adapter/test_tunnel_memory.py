"""Tunnel streams and connections over real mutual TLS on loopback, freed by
reference counting alone once they end (the collector is off: :mod:`tests.leaks`).

A stream's protocol holds the stream (its transport) and the stream holds its
protocol, as the edge's ``Upstream`` and the origin's ``Splice`` do: unless the
stream lets go when it ends, every stream is a cycle, and with the daemons'
collector tuning one that lives until restart. (``StreamIO``, the tests' own
awaitable protocol, keeps the error it raises, a cycle of its own: these
tests use plain protocols, like the daemons.)"""

from __future__ import annotations

import asyncio

from tests.conftest import PkiFiles, run_async
from tests.leaks import collector_off, live
from tests.polling import wait_until_async
from tests.tunnel_env import connect, dial_config, listener_config
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.stream import TunnelStream
from tunnel.aio.transport import serve_tunnel
from tunnel.mux import ErrorCode, Session, SessionConfig, StreamMetadata


class Echo(asyncio.Protocol):
    """Server side: sends back what it got once the peer has ended."""

    def __init__(self) -> None:
        self.stream: TunnelStream | None = None
        self.received = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.stream = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received += data

    def eof_received(self) -> bool:
        assert self.stream is not None
        self.stream.write(self.received)
        self.stream.write_eof()
        return True


class Client(asyncio.Protocol):
    """Client side: keeps its stream, collects the answer, reports the end."""

    def __init__(self) -> None:
        self.stream: TunnelStream | None = None
        self.received = b""
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.stream = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received += data

    def eof_received(self) -> bool:
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(exc)


async def settle(*counts: tuple[type, int]) -> None:
    """Until every class in ``counts`` is back to its count: the peer's side
    of a stream or connection goes when its last frames arrived there, and
    callbacks those frames scheduled (connection_lost...) have run. Within
    5 s (scaled): loopback takes milliseconds even on a busy machine, and an
    object that waits for a timer of its own to go is not freed "at once"."""

    def back() -> bool:
        return all(live(cls) == count for cls, count in counts)

    def which() -> str:
        return ", ".join(f"{c.__name__}: {live(c)} (was {n})" for c, n in counts)

    await wait_until_async(back, lambda: f"objects left alive: {which()}", timeout_s=5)


async def echo_server(test_pki: PkiFiles) -> tuple[asyncio.Server, list[TunnelConnection]]:
    accepted: list[TunnelConnection] = []
    server = await serve_tunnel(
        listener_config(test_pki, 0),
        SessionConfig(),
        lambda stream: Echo(),
        on_connection=accepted.append,
    )
    return server, accepted


def test_streams_ended_or_reset_are_freed_at_once(test_pki: PkiFiles) -> None:
    async def main() -> None:
        server, _ = await echo_server(test_pki)
        conn = await connect(dial_config(test_pki, server.sockets[0].getsockname()[1]))
        with collector_off():
            streams, clients, echoes = live(TunnelStream), live(Client), live(Echo)

            async def ended(size: int) -> None:
                client = Client()
                stream = conn.open_stream(StreamMetadata(host="a"), lambda: client)
                stream.write(b"x" * size)
                stream.write_eof()
                assert await client.lost is None
                assert len(client.received) == size

            async def reset(code: int) -> None:
                client = Client()
                stream = conn.open_stream(StreamMetadata(host="a"), lambda: client)
                stream.write(b"half a request")
                await asyncio.sleep(0.01)
                stream.abort(code)
                assert getattr(await client.lost, "code", None) == code

            await asyncio.gather(
                *(ended(i * 1000 + 1) for i in range(20)),
                *(reset(ErrorCode.CANCEL if i % 2 else ErrorCode.IDLE) for i in range(20)),
            )
            await settle((TunnelStream, streams), (Client, clients), (Echo, echoes))
            assert conn.open_streams == 0
            assert live(TunnelStream) == streams  # the client's and the server's
            assert live(Client) == clients
            assert live(Echo) == echoes
        conn.abort()
        server.close()

    run_async(main(), 30)


def test_closed_tunnel_connections_are_freed_with_their_sessions(test_pki: PkiFiles) -> None:
    async def main() -> None:
        server, accepted = await echo_server(test_pki)
        port = server.sockets[0].getsockname()[1]
        with collector_off():
            connections, sessions = live(TunnelConnection), live(Session)
            for _ in range(5):
                conn = await connect(dial_config(test_pki, port))
                client = Client()
                conn.open_stream(StreamMetadata(host="a"), lambda c=client: c).write_eof()
                await client.lost
                conn.abort()
                await conn.wait_closed()
                del conn, client
            accepted.clear()  # the test's own list of the server's connections
            await settle((TunnelConnection, connections), (Session, sessions))
            assert live(TunnelConnection) == connections
            assert live(Session) == sessions
        server.close()

    run_async(main(), 30)
