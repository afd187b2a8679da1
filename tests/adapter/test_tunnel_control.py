"""CONTROL messages over real sockets and real mutual TLS 1.3 (PROTOCOL.md
§5.14, IMPLEMENTATION.md §N11): a message and its answer both ways, every
kind of answer a handler table gives, a peer that predates CONTROL (the wait
times out, the connection carries on), the end of a connection during a
wait, and a burst paced so the peer's error budget is untouched."""

from __future__ import annotations

import asyncio
import ssl
import typing
from collections.abc import Awaitable

import pytest

from tests.conftest import PkiFiles, run_async, scaled
from tests.mux_pair import PREFACE, raw_frame, raw_hello
from tests.tunnel_env import connect, dial_config, listener_config, start_server
from tunnel.aio import control as control_module
from tunnel.aio.control import ControlHandler, ControlHandlers, ControlReply, echo
from tunnel.aio.errors import ControlLost, ControlSendError, ControlTimeout
from tunnel.aio.stream import StreamIO
from tunnel.aio.tls import tunnel_server_context
from tunnel.mux import ControlKind, ControlStatus, ErrorCode, SessionConfig

APPLIED, REFUSED, UNKNOWN_KIND = ControlStatus
ECHO = ControlKind.ECHO
PURGE, BROKEN, SLOW, WRONG, HANGS = 0x0201, 0x0202, 0x0203, 0x0204, 0x0205


async def no_streams(io: StreamIO) -> None:
    io.close()


def test_messages_and_their_answers_both_ways(test_pki: PkiFiles) -> None:
    purged: list[bytes] = []

    async def purge(body: bytes) -> ControlReply:
        await asyncio.sleep(0)  # an awaitable handler
        purged.append(body)
        return ControlReply(APPLIED, f"purged {len(purged)}")

    def broken(body: bytes) -> ControlReply:
        raise ValueError("cannot open /var/lib/geoedge/secret")  # text stays here

    async def slow_broken(body: bytes) -> ControlReply:
        await asyncio.sleep(0)
        raise KeyError("tag")

    def wrong(body: bytes) -> ControlReply:
        return "applied"  # type: ignore[return-value]  # not a ControlReply

    edge_handlers = ControlHandlers(
        {ECHO: echo, PURGE: purge, BROKEN: broken, SLOW: slow_broken, WRONG: wrong}
    )

    async def main() -> None:
        server = await start_server(
            listener_config(test_pki, 0), no_streams, control_handlers={ECHO: echo}
        )
        edge = await connect(dial_config(test_pki, server.port), control_handlers=edge_handlers)
        [origin] = server.connections
        timeout = scaled(10)
        assert await origin.send_control(ECHO, b"probe \xe2\x9c\x93", timeout) == ControlReply(
            APPLIED, "probe \u2713"
        )
        assert await edge.send_control(ECHO, b"back", timeout) == ControlReply(APPLIED, "back")
        replies = await asyncio.gather(
            origin.send_control(PURGE, b'{"tag": "a"}', timeout),
            origin.send_control(PURGE, b'{"tag": "b"}', timeout),
            origin.send_control(BROKEN, b"{}", timeout),
            origin.send_control(SLOW, b"{}", timeout),
            origin.send_control(WRONG, b"{}", timeout),
            origin.send_control(0x0300, b"{}", timeout),  # no handler
            origin.send_control(ECHO, b"\xff not utf-8", timeout),
            edge.send_control(PURGE, b"{}", timeout),  # the origin handles ECHO only
        )
        assert replies == [
            ControlReply(APPLIED, "purged 1"),
            ControlReply(APPLIED, "purged 2"),
            ControlReply(REFUSED, "ValueError"),
            ControlReply(REFUSED, "KeyError"),
            ControlReply(REFUSED, "TypeError"),
            ControlReply(UNKNOWN_KIND, ""),
            ControlReply(REFUSED, "ECHO body is not UTF-8"),
            ControlReply(UNKNOWN_KIND, ""),
        ]
        assert purged == [b'{"tag": "a"}', b'{"tag": "b"}']
        with pytest.raises(ControlSendError):  # above the peer's MAX_FRAME_BYTES
            await origin.send_control(PURGE, bytes(65536 - 5), timeout)
        with pytest.raises(ControlSendError):
            await origin.send_control(ControlKind.ACK, b"", timeout)
        assert not edge.closed.done() and not origin.closed.done()
        edge.abort()
        await server.close()

    run_async(main())


def hanging_handler() -> tuple[ControlHandler, asyncio.Event, asyncio.Event]:
    """A handler that never returns, and the events of its start and its
    cancellation."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hangs(body: bytes) -> ControlReply:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    return hangs, started, cancelled


def test_a_handler_that_runs_too_long_is_refused(
    test_pki: PkiFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control_module, "HANDLER_TIMEOUT_S", 0.2)
    hangs, _, cancelled = hanging_handler()

    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), no_streams)
        edge = await connect(dial_config(test_pki, server.port), control_handlers={HANGS: hangs})
        reply = await server.connections[0].send_control(HANGS, b"{}", scaled(10))
        assert reply == ControlReply(REFUSED, "TimeoutError")
        assert cancelled.is_set()
        edge.abort()
        await server.close()

    run_async(main())


def test_the_end_of_the_connection_ends_the_wait_and_the_handlers(test_pki: PkiFiles) -> None:
    hangs, started, cancelled = hanging_handler()

    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), no_streams)
        edge = await connect(dial_config(test_pki, server.port), control_handlers={HANGS: hangs})
        waiting = asyncio.ensure_future(server.connections[0].send_control(HANGS, b"", 3600))
        await started.wait()
        edge.abort("going")
        with pytest.raises(ControlLost):
            await waiting
        await cancelled.wait()  # the edge's handler did not outlive its connection
        with pytest.raises(ControlLost):
            await server.connections[0].send_control(ECHO, b"late", 10)
        await server.close()

    run_async(main())


def test_a_burst_is_paced_and_costs_the_peer_nothing(test_pki: PkiFiles) -> None:
    """120 messages at once: 50 leave at once, the rest at 50 a second, so the
    peer never goes past its free allowance (100 at once, 100 a second) and
    its error budget, which does not refill here, is untouched."""
    stingy = SessionConfig(error_budget_refill_per_s=0.001)
    quiet = SessionConfig(ping_interval_s=600, ping_timeout_s=1200)  # no keepalive PINGs

    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), no_streams, quiet)
        edge = await connect(
            dial_config(test_pki, server.port), stingy, control_handlers={ECHO: echo}
        )
        origin = server.connections[0]
        await origin.send_control(ECHO, b"first", scaled(10))  # its HELLO's PING is in
        budget = edge.session.statistics().error_budget_left
        replies = await asyncio.gather(
            *(origin.send_control(ECHO, str(i).encode(), scaled(20)) for i in range(120))
        )
        assert replies == [ControlReply(APPLIED, str(i)) for i in range(120)]
        assert edge.session.statistics().error_budget_left == budget
        edge.abort()
        await server.close()

    run_async(main())


class OlderOrigin(asyncio.Protocol):
    """An origin from before PROTOCOL.md §5.14, written by hand from the spec:
    its preface and HELLO, a PONG for every PING, and every other frame
    ignored, unknown types included (§5.12)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.preface_read = False
        self.ignored: list[int] = []
        self.control_seen = asyncio.Event()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's SSL transport is not an asyncio.Transport subclass.
        self.transport = typing.cast(asyncio.Transport, transport)
        self.transport.write(raw_hello())

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.preface_read and len(self.buffer) >= len(PREFACE):
            assert self.buffer[: len(PREFACE)] == PREFACE
            del self.buffer[: len(PREFACE)]
            self.preface_read = True
        while self.preface_read and len(self.buffer) >= 10:
            length = int.from_bytes(self.buffer[6:10], "big")
            if len(self.buffer) < 10 + length:
                return
            frame_type, payload = self.buffer[0], bytes(self.buffer[10 : 10 + length])
            del self.buffer[: 10 + length]
            if frame_type == 0x6 and self.transport is not None:  # PING
                self.transport.write(raw_frame(0x7, 0, 0, payload))
            elif frame_type not in (0x0, 0x9):  # HELLO, PADDING
                self.ignored.append(frame_type)
                if frame_type == 0xA:
                    self.control_seen.set()


def test_a_peer_that_predates_control_never_answers_and_the_wait_times_out(
    test_pki: PkiFiles,
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        peers: list[OlderOrigin] = []

        def factory() -> OlderOrigin:
            peers.append(OlderOrigin())
            return peers[-1]

        context: ssl.SSLContext = tunnel_server_context(
            test_pki.origin.cert, test_pki.origin.key, test_pki.ca
        )
        server = await loop.create_server(factory, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        edge = await connect(dial_config(test_pki, port))
        sending: Awaitable[ControlReply] = edge.send_control(ECHO, b"are you there", scaled(0.5))
        waiting = asyncio.ensure_future(sending)
        [peer] = peers
        await peer.control_seen.wait()  # it arrived, and was ignored
        with pytest.raises(ControlTimeout) as raised:
            await waiting
        assert raised.value.code == ErrorCode.TIMEOUT
        assert peer.ignored.count(0xA) == 1
        assert not edge.closed.done()  # the connection carries on
        assert edge.session.established
        edge.abort()
        server.close()
        await server.wait_closed()

    run_async(main())
