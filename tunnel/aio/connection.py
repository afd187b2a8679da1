"""The asyncio adapter: one tunnel connection as an ``asyncio.Protocol``.

The contract (after websockets' ``sansio.rst``): feed received bytes to the
:class:`~tunnel.mux.Session`, dispatch its events, write what it returns with a
single ``writelines``, re-arm the one timer. No ``await`` in a dispatch step.

:class:`TunnelConnection` is composed of owned parts, each in its own module:

- :class:`~tunnel.aio.connection_writer.ConnectionWriter`: the write side
  (flushing, write pause, the one timer) and the stream commands each
  :class:`~tunnel.aio.stream.TunnelStream` calls to send;
- :class:`~tunnel.aio.read_pacing.ReadPacer`: when the transport reads;
- :class:`~tunnel.aio.warmup.CongestionWarmUp`: padding that grows a new
  TCP connection's congestion window;
- :class:`~tunnel.aio.control.ControlChannel`: CONTROL messages sent and
  answered (PROTOCOL.md §5.14).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tunnel.aio.connection_writer import ConnectionWriter, session_clock
from tunnel.aio.control import ControlChannel, ControlHandler, ControlReply
from tunnel.aio.errors import PeerRefused, StreamOpenError
from tunnel.aio.read_pacing import ReadPacer
from tunnel.aio.stream import TunnelStream
from tunnel.aio.tcp_info import TcpInfo, read_tcp_info
from tunnel.aio.trace import ConnectionTrace, trace_interval_s
from tunnel.aio.warmup import CongestionWarmUp
from tunnel.mux import (
    ConnectionTerminated,
    ControlAcknowledged,
    ControlReceived,
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
from tunnel.mux.errors import MuxError, SessionClosedError

log = logging.getLogger("geoedge.tunnel")

#: Kernel unsent-queue cap (TCP_NOTSENT_LOWAT): low enough that a small frame
#: never waits behind much, high enough to keep a fast link busy between flushes.
NOTSENT_LOWAT_BYTES = 128 * 1024
#: Per-stream send buffer limits (octets queued in the session for one stream).
STREAM_HIGH_WATER = 256 * 1024
STREAM_LOW_WATER = 64 * 1024

#: Congestion controls the kernel refused, said once per process (not per socket).
_UNAVAILABLE_CONGESTION_CONTROL: set[str] = set()

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


def tune_socket(sock: socket.socket | None, congestion_control: str = "") -> None:
    """TCP_NODELAY (frames are already coalesced), TCP_NOTSENT_LOWAT and, when
    configured, the congestion control (``TCP_CONGESTION``)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        notsent_lowat = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
        sock.setsockopt(socket.IPPROTO_TCP, notsent_lowat, NOTSENT_LOWAT_BYTES)
    except OSError as exc:  # not fatal: only a tuning knob
        log.debug("socket tuning failed: %s", exc)
    if congestion_control:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion_control.encode())
        except OSError as exc:  # the kernel lacks it (or forbids it): keep the default
            if congestion_control not in _UNAVAILABLE_CONGESTION_CONTROL:
                _UNAVAILABLE_CONGESTION_CONTROL.add(congestion_control)
                log.warning(
                    "tunnel sockets: congestion control %r unavailable (%s); they keep the"
                    " host's default",
                    congestion_control,
                    exc.strerror or exc,
                )


class TunnelConnection(asyncio.Protocol):
    """One tunnel connection. ``on_stream`` is called for each stream the peer
    opens and returns the protocol that will handle it (or None to refuse);
    ``control_handlers`` answer the peer's CONTROL messages by kind
    (:mod:`tunnel.aio.control`).

    Owns the session and what it carries: feeding it (``data_received``,
    ``eof_received``, ``connection_lost``), dispatching its events (stream
    events to the stream by id, connection events to the lifecycle below), the
    table of live streams, and the lifecycle: ``established`` and ``closed``,
    GOAWAY, the listeners, drain and close. Writing belongs to its
    :class:`ConnectionWriter` (``_writer``), reading's pace to its
    :class:`ReadPacer` (``_reading``), padding to ``warm_up``.

    Invariants: a stream is in the table from its open (or accept) until it
    finishes; draining (the session closing), the connection closes once the
    table is empty. The writer and the pacer are attached to the transport
    from an authorised ``connection_made`` to ``connection_lost``; only then
    do they hold it, or (the writer) this connection's dispatch, so a
    connection whose handshake failed is freed by reference counting alone.
    """

    def __init__(
        self,
        config: SessionConfig,
        *,
        client: bool,
        authorize: Authorizer,
        on_stream: StreamAcceptor | None = None,
        learned_window_hint: int = 0,
        control_handlers: Mapping[int, ControlHandler] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.config = config
        self._authorize = authorize
        self.info = ConnectionInfo("<unauthenticated>", None, "unknown")
        self.session = Session(
            config, client=client, now=session_clock(), learned_window_hint=learned_window_hint
        )
        self._on_stream = on_stream
        self._reading = ReadPacer(self._loop)
        self._writer = ConnectionWriter(self._loop, self.session, self._reading)
        self._control = ControlChannel(
            self._loop, self.session, self._writer, control_handlers or {}
        )
        self._streams: dict[int, TunnelStream] = {}
        self.established: asyncio.Future[None] = self._loop.create_future()
        self.closed: asyncio.Future[ConnectionTerminated] = self._loop.create_future()
        self.goaway_received = False
        self._listeners: list[Callable[[TunnelConnection, object], None]] = []
        self.warm_up: CongestionWarmUp | None = None
        self._trace: ConnectionTrace | None = None

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
        tune_socket(transport.get_extra_info("socket"), self.config.congestion_control)
        self._reading.attach(transport)
        self._writer.attach(transport, self._dispatch)

    def data_received(self, data: bytes) -> None:
        self._dispatch(self.session.receive_data(data, session_clock()))
        self._writer.flush()
        self._reading.received(len(data))

    def eof_received(self) -> bool:
        self._dispatch(self.session.connection_lost("peer closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.warm_up is not None:
            self.warm_up.stop()
        if self._trace is not None:
            self._trace.stop()
        reason = f"transport lost: {exc}" if exc else "transport closed"
        self._dispatch(self.session.connection_lost(reason))
        self._writer.detach()
        self._reading.detach()

    def pause_writing(self) -> None:
        self._writer.pause_writing()

    def resume_writing(self) -> None:
        self._writer.resume_writing()

    # -- public API ----------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peer_identity":
            return self.info.peer_identity
        if name == "tunnel_info":
            return self.info
        transport = self._writer.transport
        if transport is None:
            return default
        return transport.get_extra_info(name, default)

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
            self._writer,
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
        self._writer.schedule_flush()
        return stream

    async def send_control(self, kind: int, body: bytes, timeout_s: float) -> ControlReply:
        """Send a CONTROL message (PROTOCOL.md §5.14) and wait up to
        ``timeout_s`` for the peer's answer. Raises
        :class:`~tunnel.aio.errors.ControlTimeout` (no ACK in time: an older
        peer never answers), :class:`~tunnel.aio.errors.ControlLost` (the
        connection ended first) or :class:`~tunnel.aio.errors.ControlSendError`."""
        return await self._control.send(kind, body, timeout_s)

    @property
    def can_open_stream(self) -> bool:
        return self._writer.transport is not None and self.session.can_open_stream

    @property
    def warming(self) -> bool:
        """Up, but still growing its congestion window (tunnel.aio.warmup): a
        long link's first large response would pay slow start."""
        return self.warm_up is not None and self.warm_up.active

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def tcp_info(self) -> TcpInfo | None:
        """The kernel's view of this connection now (``TCP_INFO``), or None."""
        transport = self._writer.transport
        return None if transport is None else read_tcp_info(transport.get_extra_info("socket"))

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
        self._writer.flush()
        self._close_if_drained()

    def abort(self, reason: str = "aborted") -> None:
        """Close now: every stream is reset."""
        transport = self._writer.transport
        if transport is not None:
            self.session.go_away(ErrorCode.CANCEL, reason)
            self._writer.flush()
            transport.abort()

    async def wait_closed(self) -> ConnectionTerminated:
        return await asyncio.shield(self.closed)

    # -- session events ------------------------------------------------------------

    def _dispatch(self, events: list[Any]) -> None:
        # Any, not list[Event]: the loop tells events apart by one ``type(event)``
        # compared with ``is`` (the fastest test), which mypy cannot narrow by.
        streams = self._streams
        for event in events:
            kind = type(event)
            if kind is DataReceived:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream._on_data(event.data)
                else:  # the application already let go: give the credit back
                    self.session.acknowledge_received_data(
                        event.stream_id, len(event.data), session_clock()
                    )
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

    def _accept_stream(self, event: StreamOpened) -> None:
        stream = TunnelStream(
            self,
            self._writer,
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

    def _on_connection_event(self, event: object) -> None:
        if isinstance(event, ControlReceived):
            self._control.on_received(event, self.info.peer_identity)
            return
        if isinstance(event, ControlAcknowledged):
            self._control.on_acknowledged(event)
            return
        if isinstance(event, SessionEstablished):
            if not self.established.done():
                self.established.set_result(None)
            self.warm_up = CongestionWarmUp.start(self._writer, self.config)
            interval = trace_interval_s()
            if interval is not None:
                self._trace = ConnectionTrace(self, interval)
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
        self._control.close(event.error_code)
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
        transport = self._writer.transport
        if transport is not None:
            self._writer.flush()
            if event.error_code == ErrorCode.TIMEOUT:
                transport.abort()  # the peer is gone: don't wait on its ACKs
            else:
                transport.close()

    # -- drain ---------------------------------------------------------------------

    def _close_if_drained(self) -> None:
        transport = self._writer.transport
        if self.session.closing and not self._streams and transport is not None:
            self._writer.flush()
            transport.close()

    def _stream_gone(self, stream_id: int) -> None:
        """Called by a stream when it finishes."""
        self._streams.pop(stream_id, None)
        if self.session.closing and not self._streams:
            self._loop.call_soon(self._close_if_drained)
