"""A tunnel stream presented as an asyncio *transport*.

Why a transport: the edge and the origin splice a tunnel stream to a socket
(client TLS connection, backend TCP connection). If the stream speaks the same
contract as the socket's transport — ``write``/``write_eof``/``pause_reading``/
``resume_reading``/``close``/``abort`` one way, an ``asyncio.Protocol``'s
``data_received``/``eof_received``/``connection_lost``/``pause_writing``/
``resume_writing`` the other — the splice code is the same for both ends and
backpressure flows end to end:

- reading side: while the stream's reading is paused, arriving DATA is held
  (bounded by the stream's receive window) and *not acknowledged*, so the
  peer's sender runs out of credit and stops (PROTOCOL.md §7.3);
- writing side: :meth:`write` queues into the session; above the high-water
  mark the protocol gets ``pause_writing()``, below the low-water mark
  ``resume_writing()``.

:class:`StreamIO` is an awaitable wrapper for code that prefers ``await``
(tests, tools); the daemons' hot paths use the callback contract.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

from tunnel.aio.errors import StreamResetError
from tunnel.mux import ErrorCode, StreamMetadata


class StreamCarrier(Protocol):
    """What a stream needs of the connection that carries it
    (:class:`tunnel.aio.connection.TunnelConnection`): its extra info, and to
    hear when the stream is finished."""

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...
    def _stream_gone(self, stream_id: int) -> None: ...


class StreamSender(Protocol):
    """What a stream needs to send (the connection's
    :class:`tunnel.aio.connection_writer.ConnectionWriter`): its session's
    stream commands, keyed by stream id, each flushed soon after."""

    def send_data(self, stream_id: int, data: bytes) -> int: ...
    def end_stream(self, stream_id: int) -> None: ...
    def reset_stream(self, stream_id: int, error_code: int) -> None: ...
    def send_buffered(self, stream_id: int) -> int: ...
    def acknowledge_received_data(self, stream_id: int, n: int) -> None: ...
    def watch_write_pause(self, stream: TunnelStream) -> None: ...


class TunnelStream(asyncio.Transport):
    """One multiplexed stream; see the module docstring for the contract."""

    __slots__ = (
        "_closed",
        "_connection",
        "_eof_received",
        "_eof_sent",
        "_held",
        "_high_water",
        "_low_water",
        "_protocol",
        "_reading_paused",
        "_writer",
        "_writing_paused",
        "metadata",
        "stream_id",
    )

    def __init__(
        self,
        connection: StreamCarrier,
        writer: StreamSender,
        stream_id: int,
        metadata: StreamMetadata | None,
        *,
        high_water: int,
        low_water: int,
        eof_sent: bool = False,
    ) -> None:
        super().__init__()
        self._connection = connection
        self._writer = writer
        self.stream_id = stream_id
        self.metadata = metadata
        self._protocol: asyncio.BaseProtocol | None = None
        self._reading_paused = False
        # A deque only while data is held (an empty one is 760 B, on every
        # idle stream: a WebSocket's, for hours).
        self._held: deque[bytes] | tuple[()] = ()
        self._eof_received = False
        self._eof_sent = eof_sent  # opened with END_STREAM: nothing more to write
        self._closed = False
        self._writing_paused = False
        self._high_water = high_water
        self._low_water = low_water

    # -- asyncio.Transport -------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "metadata":
            return self.metadata
        if name == "stream_id":
            return self.stream_id
        if name == "tunnel":
            return self._connection
        return self._connection.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closed or self._eof_sent

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed or self._eof_sent or not data:
            return
        if not isinstance(data, bytes):
            data = bytes(data)  # the session keeps a reference: it must not change
        buffered = self._writer.send_data(self.stream_id, data)
        if buffered > self._high_water and not self._writing_paused:
            self._writing_paused = True
            self._writer.watch_write_pause(self)
            self._protocol.pause_writing()  # type: ignore[union-attr]

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def write_eof(self) -> None:
        if self._closed or self._eof_sent:
            return
        self._eof_sent = True
        self._writer.end_stream(self.stream_id)
        self._maybe_finished()

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        """Finish our side gracefully (END_STREAM after the queued data); the
        stream goes away once the peer has ended its side too."""
        self.write_eof()

    def abort(self, error_code: int = ErrorCode.CANCEL) -> None:
        """Reset the stream both ways; queued data is dropped."""
        if self._closed:
            return
        self._writer.reset_stream(self.stream_id, error_code)
        self._finish(StreamResetError(error_code, remote=False))

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self) -> None:
        if not self._reading_paused:
            return
        self._reading_paused = False
        held = self._held
        if isinstance(held, deque):
            while held and not self._reading_paused and not self._closed:
                self._deliver(held.popleft())
            if not held:
                self._held = ()
        if not self._held and self._eof_received and not self._reading_paused:
            self._deliver_eof()

    def is_reading(self) -> bool:
        return not self._reading_paused

    def held(self) -> bytes:
        """The octets received while reading was paused, not yet delivered (the
        origin reads a request's head here to choose a backend by a header)."""
        return b"".join(self._held)

    def get_write_buffer_size(self) -> int:
        return self._writer.send_buffered(self.stream_id)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is not None:
            self._high_water = high
        self._low_water = low if low is not None else self._high_water // 4

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low_water, self._high_water

    # -- called by TunnelConnection and its ConnectionWriter -------------------

    def _on_data(self, data: bytes) -> None:
        if self._reading_paused or self._held:
            if isinstance(self._held, tuple):
                self._held = deque()
            self._held.append(data)
        else:
            self._deliver(data)

    def _deliver(self, data: bytes) -> None:
        self._writer.acknowledge_received_data(self.stream_id, len(data))
        self._protocol.data_received(data)  # type: ignore[union-attr]

    def _on_eof(self) -> None:
        self._eof_received = True
        if not self._held and not self._reading_paused:
            self._deliver_eof()

    def _deliver_eof(self) -> None:
        protocol = self._protocol
        if isinstance(protocol, asyncio.Protocol):
            protocol.eof_received()
        self._maybe_finished()

    def _on_reset(self, code: int, remote: bool) -> None:
        self._finish(StreamResetError(code, remote))

    def _on_writable(self) -> bool:
        """Called after the writer flushed; True when no longer watched."""
        if self._closed:
            return True
        if self._writer.send_buffered(self.stream_id) <= self._low_water:
            self._writing_paused = False
            self._protocol.resume_writing()  # type: ignore[union-attr]
            return True
        return False

    def _maybe_finished(self) -> None:
        if self._eof_sent and self._eof_received and not self._held:
            self._finish(None)

    def _finish(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._held = ()
        self._connection._stream_gone(self.stream_id)
        # The protocol usually holds this stream (as asyncio protocols hold their
        # transport): letting go of it here, as asyncio's own transports do after
        # connection_lost, leaves no cycle, so reference counting frees both.
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.connection_lost(exc)


class StreamIO(asyncio.Protocol):
    """``await``-style access to a stream, with the same backpressure.

    Reading pauses the stream above ``read_limit`` buffered octets; ``drain``
    waits while the stream's write side is paused.
    """

    def __init__(self, read_limit: int = 1024 * 1024) -> None:
        self.transport: TunnelStream | None = None
        self._buffer = bytearray()
        self._read_limit = read_limit
        self._eof = False
        self._exc: BaseException | None = None
        self._closed = asyncio.get_running_loop().create_future()
        self._data_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, TunnelStream)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > self._read_limit and self.transport is not None:
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._exc = exc
        self._eof = True
        self._wake_reader()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._drain_waiter = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        self._drain_waiter = None

    def _wake_reader(self) -> None:
        if self._data_waiter is not None and not self._data_waiter.done():
            self._data_waiter.set_result(None)

    async def _wait_for_data(self) -> None:
        self._data_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._data_waiter
        finally:
            self._data_waiter = None

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` octets (all buffered when -1); b"" at end of stream.
        Raises :class:`StreamResetError` if the stream was reset."""
        while not self._buffer and not self._eof:
            await self._wait_for_data()
        if not self._buffer and self._exc is not None:
            raise self._exc
        size = len(self._buffer) if n < 0 else min(n, len(self._buffer))
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        if (
            self.transport is not None
            and not self.transport.is_reading()
            and len(self._buffer) <= self._read_limit // 2
        ):
            self.transport.resume_reading()
        return data

    async def read_all(self) -> bytes:
        chunks = []
        while chunk := await self.read():
            chunks.append(chunk)
        return b"".join(chunks)

    async def readexactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = await self.read(n - len(out))
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(out), n)
            out += chunk
        return bytes(out)

    def write(self, data: bytes) -> None:
        if self._exc is not None:
            raise self._exc
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        if self._exc is not None:
            raise self._exc
        if self._drain_waiter is not None:
            # Shielded: a caller's timeout must not cancel the waiter that
            # every later drain() shares.
            await asyncio.shield(self._drain_waiter)
        if self._exc is not None:
            raise self._exc

    def write_eof(self) -> None:
        assert self.transport is not None
        self.transport.write_eof()

    def abort(self, error_code: int = ErrorCode.CANCEL) -> None:
        assert self.transport is not None
        self.transport.abort(error_code)

    async def wait_closed(self) -> None:
        await self._closed

    @property
    def exception(self) -> BaseException | None:
        return self._exc
