"""Stand-ins for the edge's surroundings, for unit tests of its connection logic.

Not mocks of the thing under test: the front ends and exchanges run for real;
these fakes stand where the TLS socket, the tunnel and the worker are, and
record what was done to them.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from typing import Any

from edge.admission import RequestRate
from edge.config import HttpConfig, RedirectListenerConfig
from edge.deadlines import Deadlines
from edge.exchange import RequestRecord
from edge.http1 import HttpLimits
from tunnel.aio.errors import NoTunnelAvailable, StreamResetError
from tunnel.mux import StreamMetadata


class FakeClientTransport(asyncio.Transport):
    """The client's (TLS) transport: records writes and flow-control calls."""

    def __init__(self, peer: tuple[str, int] = ("203.0.113.9", 40000)) -> None:
        super().__init__()
        self.written = bytearray()
        self.peer = peer
        self.reading = True
        self.closed = False
        self.aborted = False
        self.protocol: asyncio.Protocol | None = None
        self.buffered = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed and not self.aborted, "write after close"
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol  # type: ignore[assignment]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self.peer
        if name == "sockname":
            return ("192.0.2.1", 443)
        return default

    def take(self) -> bytes:
        data = bytes(self.written)
        self.written.clear()
        return data


class FakeStream(asyncio.Transport):
    """A tunnel stream: records what the exchange wrote and how it ended."""

    def __init__(self, metadata: bytes, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.encoded_metadata = metadata
        self.protocol = protocol
        self.sent = bytearray()
        self.ended_with: int | None = None  # the RESET code the exchange sent
        self.eof_sent = False
        self.reading = True
        self.buffered = 0
        protocol.connection_made(self)

    @functools.cached_property
    def metadata(self) -> StreamMetadata:
        """Decoded when a test reads it: the decoding is the origin's work, not
        the edge's (``make bench-edge-logic`` runs on these stand-ins)."""
        return StreamMetadata.decode(self.encoded_metadata)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self.ended_with is None, "write after reset"
        self.sent += data

    def write_eof(self) -> None:
        self.eof_sent = True

    def abort(self, error_code: int = 0) -> None:
        if self.ended_with is None:
            self.ended_with = error_code
            self.protocol.connection_lost(StreamResetError(error_code, remote=False))

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return self.buffered

    # -- what the origin does -----------------------------------------------------

    def respond(self, data: bytes) -> None:
        self.protocol.data_received(data)

    def backend_eof(self) -> None:
        self.protocol.eof_received()

    def reset(self, code: int) -> None:
        """The origin (or the tunnel) resets the stream."""
        self.ended_with = -code
        self.protocol.connection_lost(StreamResetError(code, remote=True))


#: The HTTP/2 engine a FakeServices made now configures (tests.h2_engines;
#: the ``h2_engine`` fixture sets it for the length of a test).
h2_engine_under_test = "auto"


def _http_config() -> HttpConfig:
    return HttpConfig(h2_engine=h2_engine_under_test)


@dataclass
class FakeServices:
    """The worker: streams on demand (or none: no tunnel), logs kept."""

    tunnel_up: bool = True
    draining: bool = False
    edge_id: str = "edge-test"
    http: HttpConfig = field(default_factory=_http_config)
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    tunnel_wait_s: float = 5.0
    cache: Any = None  # edge.cache.EdgeCache, or None: neither cache nor compression
    hsts_field: bytes | None = None
    redirect: RedirectListenerConfig | None = None
    request_rate: RequestRate = field(default_factory=lambda: RequestRate(0.0, 1))
    deadlines: Deadlines = field(default_factory=lambda: Deadlines(10, 75, 30, 60, 60, 3600, ()))
    streams: list[FakeStream] = field(default_factory=list)
    logged: list[tuple[RequestRecord, int]] = field(default_factory=list)
    waiters: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    connections: set[Any] = field(default_factory=set)
    ids: int = 0

    def open_stream(self, metadata: bytes, factory: Any) -> tuple[str, FakeStream]:
        if not self.tunnel_up:
            raise NoTunnelAvailable("no usable tunnel")
        stream = FakeStream(metadata, factory())
        self.streams.append(stream)
        return "origin-a", stream

    def wait_for_tunnel(self, waiter: Any) -> bool:
        self.waiters.append(waiter)
        return True

    def stop_waiting_for_tunnel(self, waiter: Any) -> None:
        if waiter in self.waiters:
            self.waiters.remove(waiter)

    def bring_tunnel_up(self) -> None:
        self.tunnel_up = True
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            waiter.tunnel_ready()

    def count_error(self, reason: str) -> None:
        self.errors.append(reason)

    def warn(self, message: str, *args: object) -> None:
        pass

    def ready(self) -> bool:
        return self.tunnel_up and not self.draining

    def new_request_id(self) -> str:
        self.ids += 1
        return f"req{self.ids:04d}"

    def admit(self, client_ip: str) -> Any:
        return lambda: None

    def acme_http01(self, host: str | None, path: str) -> str | None:
        return None

    def connection_opened(self, connection: Any, facts: Any) -> None:
        self.connections.add(connection)

    def connection_closed(self, connection: Any) -> None:
        self.connections.discard(connection)

    def log_request(
        self, record: RequestRecord, client_ip: str | None, sent: int, facts: Any = None
    ) -> None:
        self.logged.append((record, sent))
