"""The asyncio adapter: one tunnel connection as an ``asyncio.Protocol``.

The contract (after websockets' ``sansio.rst``): feed received bytes to the
:class:`~tunnel.mux.Session`, dispatch its events, write what it returns with a
single ``writelines``, re-arm the one timer. No ``await`` in a dispatch step.

Sending is *pulled*: DATA frames are taken from the session only while the
transport is below its high-water mark, and the kernel's unsent queue is kept
short with ``TCP_NOTSENT_LOWAT``, so the choice of which stream goes next is
made by the session's fair scheduler at the last moment, not fixed early in a
deep socket buffer (DESIGN.md principle 5). Control frames are always written.

Reading is paused only when our *control* replies back up (a peer flooding
PINGs while not reading its PONGs): pausing on data backpressure instead could
deadlock two peers that both send bulk data; DATA needs no such guard because
credit windows already bound it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunnel.aio.errors import PeerRefused, StreamOpenError
from tunnel.aio.stream import TunnelStream
from tunnel.aio.warmup import CongestionWarmUp
from tunnel.mux import (
    ConnectionTerminated,
    DataReceived,
    ErrorCode,
    GoAwayReceived,
    PingAcknowledged,
    Session,
    SessionConfig,
    SessionEstablished,
    StreamEnded,
    StreamMetadata,
    StreamOpened,
    StreamReset,
)
from tunnel.mux.constants import SettingId
from tunnel.mux.errors import MuxError, SessionClosedError, StreamClosedError

log = logging.getLogger("geoedge.tunnel")

#: The session's clock. Not ``loop.time()``: uvloop caches it per iteration at
#: millisecond resolution, which reads a loopback RTT as 0 and makes a window
#: consumed within one tick look infinitely fast to the auto-tuner. It is the
#: same CLOCK_MONOTONIC, so session deadlines can be passed to ``call_at``.
_now = time.monotonic

#: How many octets of DATA one flush takes from the scheduler before yielding.
FLUSH_DATA_BYTES = 256 * 1024
#: Kernel unsent-queue cap (TCP_NOTSENT_LOWAT): low enough that a small frame
#: never waits behind much, high enough to keep a fast link busy between flushes.
NOTSENT_LOWAT_BYTES = 128 * 1024
#: Transport write buffer limits: above ``high`` we stop pulling DATA.
WRITE_HIGH_WATER = 256 * 1024
WRITE_LOW_WATER = 64 * 1024
#: Backed-up control replies beyond the high-water mark that pause our reading.
CONTROL_BACKLOG_BYTES = 1024 * 1024
#: Octets read before yielding to the rest of the loop. libuv reads a busy
#: socket up to 32 times per loop turn (up to ~8 MiB of bulk data here), and
#: every callback queued meanwhile (a coroutine waiting on a small response,
#: a flush) waits for all of it: ~10 ms per small request under bulk in
#: ``make bench-tunnel``. Pausing after this many octets and resuming on the
#: next turn lets that work run in between.
READ_BURST_BYTES = 256 * 1024
#: Per-stream send buffer limits (octets queued in the session for one stream).
STREAM_HIGH_WATER = 256 * 1024
STREAM_LOW_WATER = 64 * 1024

StreamAcceptor = Callable[[TunnelStream], asyncio.BaseProtocol | None]


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who is on the other side, as established by the transport layer."""

    peer_identity: str
    peer_address: tuple[str, int] | None
    transport_kind: str  # "tls" or "tcp"


#: Decides who the peer is once the transport is up (after the TLS handshake):
#: returns its identity or raises :class:`PeerRefused`.
Authorizer = Callable[[asyncio.Transport], ConnectionInfo]


def tune_socket(sock: socket.socket | None) -> None:
    """TCP_NODELAY (frames are already coalesced) and TCP_NOTSENT_LOWAT."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        notsent_lowat = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
        sock.setsockopt(socket.IPPROTO_TCP, notsent_lowat, NOTSENT_LOWAT_BYTES)
    except OSError as exc:  # not fatal: only a tuning knob
        log.debug("socket tuning failed: %s", exc)


#: Pieces shorter than this are joined before writing (see :func:`coalesce`).
COALESCE_BYTES = 16 * 1024


def coalesce(chunks: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """Join runs of small pieces (frame headers, control frames, small
    payloads) into one buffer each; large payloads pass through uncopied.

    Why: uvloop's TLS transport encrypts every ``writelines`` item as its own
    TLS record. Unjoined, each small frame cost two or three records (one for
    its 10-octet header) and as many decrypt calls at the peer: TLS record
    handling was a quarter of both ends' CPU in the stream-open benchmark.
    """
    if len(chunks) == 1:
        return chunks
    result: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = []
    run_bytes = 0
    for chunk in chunks:
        size = len(chunk)
        if size >= COALESCE_BYTES:
            if run:
                result.append(b"".join(run))
                run, run_bytes = [], 0
            result.append(chunk)
            continue
        run.append(chunk)
        run_bytes += size
        if run_bytes >= COALESCE_BYTES:
            result.append(b"".join(run))
            run, run_bytes = [], 0
    if run:
        result.append(run[0] if len(run) == 1 else b"".join(run))
    return result


class TunnelConnection(asyncio.Protocol):
    """One tunnel connection. ``on_stream`` is called for each stream the peer
    opens and returns the protocol that will handle it (or None to refuse)."""

    def __init__(
        self,
        config: SessionConfig,
        *,
        client: bool,
        authorize: Authorizer,
        on_stream: StreamAcceptor | None = None,
        learned_window_hint: int = 0,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.config = config
        self._authorize = authorize
        self.info = ConnectionInfo("<unauthenticated>", None, "unknown")
        self.session = Session(
            config, client=client, now=_now(), learned_window_hint=learned_window_hint
        )
        self._on_stream = on_stream
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, TunnelStream] = {}
        self._write_watch: set[TunnelStream] = set()
        self._write_paused = False
        self._read_paused_for_control = False
        self._read_burst = 0
        self._read_yielding = False
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self.established: asyncio.Future[None] = self._loop.create_future()
        self.closed: asyncio.Future[ConnectionTerminated] = self._loop.create_future()
        self.goaway_received = False
        self._listeners: list[Callable[[TunnelConnection, object], None]] = []
        self.warm_up: CongestionWarmUp | None = None

    # -- asyncio.Protocol -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's SSL transport is not an asyncio.Transport subclass: duck-type it.
        transport = typing.cast(asyncio.Transport, transport)
        try:
            self.info = self._authorize(transport)
        except PeerRefused as exc:
            log.warning("tunnel peer %s refused: %s", transport.get_extra_info("peername"), exc)
            transport.abort()
            if not self.established.done():
                self.established.set_exception(exc)
                self.established.exception()
            return
        self._transport = transport
        tune_socket(transport.get_extra_info("socket"))
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self._flush()
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        self._dispatch(self.session.receive_data(data, _now()))
        self._flush()
        self._read_burst += len(data)
        if self._read_burst >= READ_BURST_BYTES and not self._read_yielding:
            transport = self._transport
            if transport is not None:
                self._read_yielding = True
                transport.pause_reading()
                self._loop.call_soon(self._end_read_burst)

    def _end_read_burst(self) -> None:
        self._read_yielding = False
        self._read_burst = 0
        if self._transport is not None and not self._read_paused_for_control:
            self._transport.resume_reading()

    def eof_received(self) -> bool:
        self._dispatch(self.session.connection_lost("peer closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.warm_up is not None:
            self.warm_up.stop()
        reason = f"transport lost: {exc}" if exc else "transport closed"
        self._dispatch(self.session.connection_lost(reason))
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._read_paused_for_control and self._transport is not None:
            self._read_paused_for_control = False
            if not self._read_yielding:
                self._transport.resume_reading()
        self._flush()

    # -- public API ----------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peer_identity":
            return self.info.peer_identity
        if name == "tunnel_info":
            return self.info
        if self._transport is None:
            return default
        return self._transport.get_extra_info(name, default)

    def open_stream(
        self,
        metadata: StreamMetadata | bytes,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        *,
        end_stream: bool = False,
    ) -> TunnelStream:
        """Open a stream (0-RTT: write to it at once). ``metadata`` may come
        already encoded (bytes); the stream's ``metadata`` is then None. Raises
        :class:`~tunnel.aio.errors.StreamOpenError` (with the core's code) when
        it cannot."""
        try:
            stream_id = self.session.open_stream(metadata, end_stream=end_stream)
        except MuxError as exc:
            raise StreamOpenError(str(exc), exc.code) from exc
        stream = TunnelStream(
            self,
            stream_id,
            metadata if isinstance(metadata, StreamMetadata) else None,
            high_water=STREAM_HIGH_WATER,
            low_water=STREAM_LOW_WATER,
            eof_sent=end_stream,
        )
        self._streams[stream_id] = stream
        protocol = protocol_factory()
        stream.set_protocol(protocol)
        protocol.connection_made(stream)
        self._schedule_flush()
        return stream

    @property
    def can_open_stream(self) -> bool:
        return self._transport is not None and self.session.can_open_stream

    @property
    def warming(self) -> bool:
        """Up, but still growing its congestion window (tunnel.aio.warmup): a
        long link's first large response would pay slow start."""
        return self.warm_up is not None and self.warm_up.active

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def srtt_s(self) -> float | None:
        return self.session.rtt.smoothed

    def add_listener(self, listener: Callable[[TunnelConnection, object], None]) -> None:
        """``listener(connection, event)`` for connection-level events
        (SessionEstablished, GoAwayReceived, PingAcknowledged, ConnectionTerminated)."""
        self._listeners.append(listener)

    def go_away(self, reason: str = "draining") -> None:
        """Stop accepting new streams from the peer and let in-flight ones
        finish; the connection closes itself when the last stream is gone."""
        self.session.go_away(ErrorCode.NO_ERROR, reason)
        self._flush()
        self._close_if_drained()

    def abort(self, reason: str = "aborted") -> None:
        """Close now: every stream is reset."""
        if self._transport is not None:
            self.session.go_away(ErrorCode.CANCEL, reason)
            self._flush()
            self._transport.abort()

    async def wait_closed(self) -> ConnectionTerminated:
        return await asyncio.shield(self.closed)

    # -- session plumbing ------------------------------------------------------------

    def _dispatch(self, events: list) -> None:
        streams = self._streams
        for event in events:
            kind = type(event)
            if kind is DataReceived:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream._on_data(event.data)
                else:  # the application already let go: give the credit back
                    self.session.acknowledge_received_data(event.stream_id, len(event.data), _now())
            elif kind is StreamOpened:
                self._accept_stream(event)
            elif kind is StreamEnded:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream._on_eof()
            elif kind is StreamReset:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream._on_reset(event.error_code, event.remote)
            else:
                self._on_connection_event(event)

    def _on_connection_event(self, event: object) -> None:
        if isinstance(event, SessionEstablished):
            if not self.established.done():
                self.established.set_result(None)
            self._start_warm_up()
        elif isinstance(event, GoAwayReceived):
            self.goaway_received = True
            log.info(
                "peer %s is going away: %s %s",
                self.info.peer_identity,
                ErrorCode.name_of(event.error_code),
                event.reason,
            )
            self._close_if_drained()
        elif isinstance(event, ConnectionTerminated):
            self._on_terminated(event)
        elif not isinstance(event, PingAcknowledged):
            return
        for listener in list(self._listeners):
            listener(self, event)

    def _on_terminated(self, event: ConnectionTerminated) -> None:
        level = logging.INFO if event.error_code == ErrorCode.NO_ERROR else logging.WARNING
        log.log(
            level,
            "tunnel to %s terminated: %s (%s, %s)",
            self.info.peer_identity,
            ErrorCode.name_of(event.error_code),
            event.reason,
            "by peer" if event.remote else "locally",
        )
        if not self.established.done():
            self.established.set_exception(
                SessionClosedError(f"terminated before HELLO: {event.reason}")
            )
            self.established.exception()  # mark retrieved: callers may not await it
        if not self.closed.done():
            self.closed.set_result(event)
        if self._transport is not None:
            self._flush()
            if event.error_code == ErrorCode.TIMEOUT:
                self._transport.abort()  # the peer is gone: don't wait on its ACKs
            else:
                self._transport.close()

    def _accept_stream(self, event: StreamOpened) -> None:
        stream = TunnelStream(
            self,
            event.stream_id,
            event.metadata,
            high_water=STREAM_HIGH_WATER,
            low_water=STREAM_LOW_WATER,
        )
        protocol = self._on_stream(stream) if self._on_stream is not None else None
        if protocol is None:
            self.session.reset_stream(event.stream_id, ErrorCode.REFUSED_STREAM)
            return
        self._streams[event.stream_id] = stream
        stream.set_protocol(protocol)
        protocol.connection_made(stream)

    def _start_warm_up(self) -> None:
        """Grow this direction's congestion window before streams need it."""
        transport = self._transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        config = self.config
        self.warm_up = CongestionWarmUp(
            sock,
            write=self._write_padding,
            idle=self._idle_for_padding,
            peer_max_frame_bytes=self.session.peer_settings[SettingId.MAX_FRAME_BYTES],
            rate_bytes_per_s=config.initial_rate_bytes_per_s,
            cap_bytes=config.warm_up_max_bytes,
        )

    def _idle_for_padding(self) -> bool:
        transport = self._transport
        return (
            transport is not None
            and not self._write_paused
            and not self.session.wants_to_send
            and not self.session.closing
            and transport.get_write_buffer_size() == 0
        )

    def _write_padding(self, frame: bytes) -> None:
        if self._transport is not None:
            self._transport.write(frame)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        if transport is None:
            return
        session = self.session
        budget = 0 if self._write_paused else FLUSH_DATA_BYTES
        out = session.data_to_send(budget)
        if out:
            transport.writelines(coalesce(out))
        if self._write_watch:
            self._write_watch = {s for s in self._write_watch if not s._on_writable()}
        if self._write_paused:
            backlog = transport.get_write_buffer_size() - WRITE_HIGH_WATER
            if backlog > CONTROL_BACKLOG_BYTES and not self._read_paused_for_control:
                self._read_paused_for_control = True
                transport.pause_reading()
        elif session.wants_to_send:
            self._schedule_flush()
        self._arm_timer()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _arm_timer(self) -> None:
        deadline = self.session.next_deadline()
        if deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        if self._transport is None:
            return
        self._dispatch(self.session.handle_timer(_now()))
        self._flush()

    def _close_if_drained(self) -> None:
        if self.session.closing and not self._streams and self._transport is not None:
            self._flush()
            self._transport.close()

    # -- called by TunnelStream ----------------------------------------------------

    def _stream_write(self, stream_id: int, data: bytes) -> int:
        try:
            self.session.send_data(stream_id, data)
        except StreamClosedError:
            return 0  # reset meanwhile; its StreamReset event is on its way
        self._schedule_flush()
        return self.session.send_buffered(stream_id)

    def _stream_end(self, stream_id: int) -> None:
        try:
            self.session.end_stream(stream_id)
        except StreamClosedError:
            return
        self._schedule_flush()

    def _stream_reset(self, stream_id: int, error_code: int) -> None:
        self.session.reset_stream(stream_id, error_code)
        self._schedule_flush()

    def _stream_consumed(self, stream_id: int, n: int) -> None:
        self.session.acknowledge_received_data(stream_id, n, _now())
        # Credit returned outside a receive callback (a reader resuming) must go
        # out now, not with the next timer tick; inside one, the flush at the
        # end of data_received sends it and this costs a flag test.
        self._schedule_flush()

    def _stream_buffered(self, stream_id: int) -> int:
        return self.session.send_buffered(stream_id)

    def _watch_write_pause(self, stream: TunnelStream) -> None:
        self._write_watch.add(stream)

    def _stream_gone(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)
        if self.session.closing and not self._streams:
            self._loop.call_soon(self._close_if_drained)
