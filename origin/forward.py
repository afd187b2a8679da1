"""Splice a tunnel stream and a backend TCP connection (the origin's hot path).

Both sides are asyncio transports (a :class:`~tunnel.aio.stream.TunnelStream` is
one), so the splice is two small protocols calling each other, with no task,
no queue and no copy per chunk:

===============================  ============================================
event                            action
===============================  ============================================
stream data                      ``backend.write``; count ``bytes_up``
backend data                     ``stream.write``; count ``bytes_down``
backend transport full           ``stream.pause_reading()``: the edge's sender
                                 runs out of credit (PROTOCOL.md §7.3)
stream full (edge slow)          ``backend.pause_reading()``: TCP pushes back
stream EOF (END_STREAM)          ``backend.write_eof()`` (half-close)
backend EOF                      ``stream.write_eof()`` (half-close)
stream reset                     ``backend.abort()`` with an RST (SO_LINGER 0)
backend reset / error            ``stream.abort(UPSTREAM_RESET)``; but
                                 ``stream.write_eof()`` on a reused connection
                                 that sent nothing back yet (its keep-alive
                                 timeout raced the request)
stream reset IDLE                park the backend connection if it is clean
                                 (:mod:`origin.keepalive`), else reset it
stream ended both ways           ``backend.close()`` (after its queue drains)
===============================  ============================================

The stream exists before the backend connection: its protocol is a
:class:`Splice` from the start, with reading paused, because the edge sends
the first bytes right behind OPEN (0-RTT; PROTOCOL.md §6). Those bytes wait
in the stream (unacknowledged) until :meth:`Splice.attach`, which writes the
PROXY header, if any, and resumes reading.

TCP_NODELAY: uvloop (and asyncio) set it on every TCP transport they create,
so no ``setsockopt`` per connection here.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from geoedge.proxy import TlvType, encode_ssl_tlv, encode_v1, encode_v2
from tunnel.aio.errors import TunnelError
from tunnel.aio.stream import TunnelStream
from tunnel.mux import ErrorCode, StreamMetadata

__all__ = ["BackendProtocol", "Splice", "proxy_preamble"]

#: Backend transport write-buffer limits: above ``high`` the edge is paused.
BACKEND_HIGH_WATER = 256 * 1024
BACKEND_LOW_WATER = 64 * 1024

_MAX_UNIQUE_ID = 128
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
_UNSPECIFIED = {4: ("0.0.0.0", 0), 6: ("::", 0)}
_monotonic = time.monotonic
_IDLE = ErrorCode.IDLE  # not read off the class per stream (tunnel.mux.stream)


class Splice(asyncio.Protocol):
    """The stream's protocol; owns the backend transport once attached.

    ``on_finished(splice, error)`` is called once, when the stream is gone;
    ``error`` is the exception the stream ended with (None: graceful).
    """

    __slots__ = (
        "backend",
        "backend_eof",
        "backend_open",
        "backend_protocol",
        "bytes_down",
        "bytes_up",
        "connect_task",
        "connected_at",
        "finished",
        "first_byte_at",
        "last_up",
        "on_finished",
        "on_idle",
        "opened_at",
        "pool",
        "queued_s",
        "reserved",
        "reused",
        "status",
        "stream",
        "tag",
    )

    def __init__(
        self,
        on_finished: Callable[[Splice, BaseException | None], None],
        on_idle: Callable[[Splice], bool] | None = None,
    ) -> None:
        self.stream: TunnelStream | None = None
        self.backend: asyncio.Transport | None = None
        self.backend_protocol: BackendProtocol | None = None
        self.on_idle = on_idle
        self.reused = False
        self.backend_open = False
        self.backend_eof = False
        self.bytes_up = 0
        self.bytes_down = 0
        self.finished = False
        self.on_finished = on_finished
        self.connect_task: asyncio.Task[None] | None = None
        self.tag: Any = None  # the caller's (the backend this stream went to)
        self.reserved: Any = None  # the caller's (a backend counted, not yet connected)
        self.pool = "-"  # the pool the stream was routed to
        # Monotonic times for the access log and histograms (0: not yet).
        self.opened_at = _monotonic()
        self.connected_at = 0.0
        self.first_byte_at = 0.0
        self.last_up = self.opened_at  # the last octet from the edge (deadlines)
        self.status = 0  # the backend's response status, from its first octets
        self.queued_s = 0.0  # time spent waiting for a backend slot (origin.queue)

    # -- stream side (asyncio.Protocol of the TunnelStream) -----------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, TunnelStream)
        self.stream = transport
        transport.pause_reading()  # until a backend is connected

    def data_received(self, data: bytes) -> None:
        self.bytes_up += len(data)
        self.last_up = _monotonic()
        if self.backend_open:
            self.backend.write(data)  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        if self.backend_open:
            self.backend.write_eof()  # type: ignore[union-attr]
        return True

    def pause_writing(self) -> None:
        if self.backend_open:
            self.backend.pause_reading()  # type: ignore[union-attr]

    def resume_writing(self) -> None:
        if self.backend_open:
            self.backend.resume_reading()  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        self.finished = True
        backend = self.backend
        if backend is not None and self.backend_open:
            self.backend_open = False
            if exc is None:
                backend.close()
            elif not (isinstance(exc, TunnelError) and exc.code == _IDLE and self._park()):
                _reset(backend)
        elif self.connect_task is not None:
            task, self.connect_task = self.connect_task, None
            task.cancel()  # its CancelledError's frames hold this splice: no way back
        self.on_finished(self, exc)
        # The backend connection's protocol points back here until its transport
        # closes (and a parked one is no longer ours): dropping our side leaves no
        # cycle, so reference counting frees the splice with its stream.
        self.backend_protocol = None

    def _park(self) -> bool:
        """The edge ended the stream between exchanges (RESET IDLE): offer the
        backend connection for reuse if nothing of this stream is left on it."""
        backend = self.backend
        if (
            self.on_idle is None
            or self.backend_eof
            or self.backend_protocol is None
            or backend is None
            or backend.get_write_buffer_size()
        ):
            return False
        return self.on_idle(self)

    # -- called by the connector ----------------------------------------------------------

    def attach(
        self,
        backend: asyncio.Transport,
        preamble: bytes = b"",
        protocol: BackendProtocol | None = None,
    ) -> None:
        """The backend is connected: send the PROXY header, let the stream flow.

        ``protocol``: the backend connection's :class:`BackendProtocol`, for a
        connection that may be parked later, or one taken from the idle pool.
        """
        self.connect_task = None
        if self.finished:  # the edge gave up while we connected
            backend.close()
            return
        if protocol is not None:
            protocol.splice = self
            self.backend_protocol = protocol
        self.backend = backend
        self.backend_open = True
        backend.set_write_buffer_limits(high=BACKEND_HIGH_WATER, low=BACKEND_LOW_WATER)
        if preamble:
            backend.write(preamble)
        self.stream.resume_reading()  # type: ignore[union-attr]

    def time_out(self) -> None:
        """A deadline passed: reset the backend connection (never reused) and the
        stream with TIMEOUT."""
        backend = self.backend
        if backend is not None and self.backend_open:
            self.backend_open = False
            _reset(backend)
        if not self.finished and self.stream is not None:
            self.stream.abort(ErrorCode.TIMEOUT)

    def fail(self, error_code: int) -> None:
        """No backend could be connected: reset the stream with ``error_code``."""
        self.connect_task = None
        if not self.finished and self.stream is not None:
            self.stream.abort(error_code)

    def backend_closed(self, exc: Exception | None) -> None:
        if not self.backend_open:
            return
        self.backend_open = False
        stream = self.stream
        if stream is None:
            return
        if exc is None or self.backend_eof or (self.reused and not self.bytes_down):
            # A reset after the backend's FIN (we wrote into a socket it had
            # closed) does not spoil a response that was complete. And a reused
            # connection that breaks before its first byte back is the backend's
            # keep-alive timeout racing our request: end the stream as a close
            # before any response, which the edge replays when that is safe.
            stream.write_eof()
        else:
            stream.abort(ErrorCode.UPSTREAM_RESET)


class BackendProtocol(asyncio.Protocol):
    """The backend connection's protocol: everything goes to the splice's stream.

    Between streams the connection may be parked (:mod:`origin.keepalive`):
    ``splice`` is None then, and anything the backend sends, or its closing,
    ends the connection: a backend has nothing to say between exchanges.
    """

    __slots__ = ("_forget", "deadline", "last_active", "splice", "transport")

    def __init__(self, splice: Splice) -> None:
        self.splice: Splice | None = splice
        self.transport: asyncio.Transport | None = None
        self.last_active = 0.0
        self._forget: Callable[[BackendProtocol], None] | None = None  # while parked
        self.deadline = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        splice = self.splice
        if splice is None:
            self.close_parked()
            return
        now = self.last_active = _monotonic()
        if not splice.bytes_down:
            splice.first_byte_at = now
            splice.status = response_status(data)
        splice.bytes_down += len(data)
        splice.stream.write(data)  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        splice = self.splice
        if splice is None:
            self.close_parked()
            return False
        splice.backend_eof = True
        splice.stream.write_eof()  # type: ignore[union-attr]
        return True  # keep our sending half open: the edge may still be sending

    def pause_writing(self) -> None:
        if self.splice is not None:
            self.splice.stream.pause_reading()  # type: ignore[union-attr]

    def resume_writing(self) -> None:
        if self.splice is not None:
            self.splice.stream.resume_reading()  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.splice is None:
            self.close_parked()
            return
        self.splice.backend_closed(exc)

    # -- keep-alive reuse (origin.keepalive) ----------------------------------------------

    def park(self, forget: Callable[[BackendProtocol], None], deadline: float) -> None:
        self.splice = None
        self._forget = forget
        self.deadline = deadline
        self.transport.resume_reading()  # type: ignore[union-attr]  # to see a close

    @property
    def parked(self) -> bool:
        return self._forget is not None

    def unpark(self) -> bool:
        """Taken for a new stream: False if the connection died meanwhile."""
        self._forget = None
        return self.transport is not None and not self.transport.is_closing()

    def close_parked(self) -> None:
        forget, self._forget = self._forget, None
        if forget is not None:
            forget(self)
        if self.transport is not None:
            self.transport.close()


def response_status(data: bytes) -> int:
    """The status code of a response whose first octets are ``data`` (0 if they
    do not start an HTTP/1.x status line whole)."""
    if data[:7] == b"HTTP/1." and data[12:13] in (b" ", b"\r") and data[9:12].isdigit():
        return int(data[9:12])
    return 0


def _reset(transport: asyncio.Transport) -> None:
    """Abort with an RST, not a FIN: a reset stream means the client is gone, and
    the backend should see its request fail (Node.js: ``ECONNRESET``, 'aborted'),
    not a request that merely finished sending."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    transport.abort()


def proxy_preamble(mode: str, metadata: StreamMetadata | None) -> bytes:
    """The PROXY header for a backend that wants one (``mode`` ``v1``/``v2``/``off``).

    Source is the client address the edge saw, destination the address it was
    accepted on. v2 also carries ALPN, AUTHORITY (the SNI), SSL (version,
    cipher) and UNIQUE_ID (the request id) when the edge sent them. Without a
    client address: v1 ``UNKNOWN``, v2 family UNSPEC (the backend then uses the
    connection's own addresses, spec §2.2).
    """
    if mode == "off":
        return b""
    source = metadata.client_address if metadata else None
    destination = metadata.server_address if metadata else None
    if source is not None and destination is None:
        destination = _UNSPECIFIED[6 if ":" in source[0] else 4]
    if source is None:
        destination = None
    if mode == "v1":
        return encode_v1(source, destination)
    tlvs: list[tuple[int, bytes]] = []
    if metadata is not None:
        if metadata.alpn:
            tlvs.append((TlvType.ALPN, metadata.alpn.encode()))
        if metadata.server_name:
            tlvs.append((TlvType.AUTHORITY, metadata.server_name.encode()))
        if metadata.tls_version:
            tlvs.append(encode_ssl_tlv(version=metadata.tls_version, cipher=metadata.tls_cipher))
        if metadata.request_id:
            tlvs.append((TlvType.UNIQUE_ID, metadata.request_id.encode()[:_MAX_UNIQUE_ID]))
    return encode_v2(source, destination, tlvs=tlvs)
