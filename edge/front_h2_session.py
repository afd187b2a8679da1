"""What the streams of one HTTP/2 client connection share: the HTTP/2 state
machine (of the engine :mod:`edge.h2_engine` chose: libnghttp2's or
``h2``'s), the table of open streams, the flood counts, the connection's
output and its end.

The connection (:class:`edge.front_h2.Http2Connection`) reads the client and
starts streams; each stream (:class:`edge.front_h2_stream.ClientStream`)
answers its exchange; both queue frames in the one HTTP/2 machine and write
them through the :class:`H2Session`, which batches them into as few writes
as it can and counts every octet for the access log (:mod:`edge.ledger`).
"""

from __future__ import annotations

import asyncio
import logging
import time

import h2.errors
import h2.exceptions
import hyperframe.frame

from edge.exchange import RequestRecord
from edge.front_h2_stream import ClientStream
from edge.h2_engine import new_server_connection, release_connection, resolve_engine
from edge.h2_floods import FloodCounters
from edge.ledger import OutputLedger
from edge.services import EdgeServices
from geoedge.logs import LogThrottle

__all__ = ["CONNECTION_WINDOW", "STREAM_WINDOW", "H2Session"]

throttled = LogThrottle(logging.getLogger("geoedge.edge"))

#: The window a request body may use on a stream, and on the connection.
STREAM_WINDOW = 1024 * 1024
CONNECTION_WINDOW = 4 * 1024 * 1024


class H2Session:
    """One HTTP/2 client connection's state machine (``conn``), open streams and output.

    Invariants:

    - every octet written to the transport is counted in ``ledger.queued``,
      and goes out through :meth:`flush`, or :meth:`write_now` for the frames
      that must leave ahead of a batch (a GOAWAY, the last frames of a close);
    - :meth:`flush` writes nothing while ``batching`` (a read of the client,
      or an exchange's ``writes_begin``/``writes_end``, is under way); at most
      one deferred flush (``flush_soon``) is pending;
    - ``streams`` holds the streams not yet settled; once ``going_away`` (the
      client's GOAWAY, or ours: the edge draining), no stream is added and the
      connection closes when the last one settles;
    - ``floods`` counts what the client sent of each kind :mod:`edge.h2_floods`
      bounds; past a bound the connection goes away (:meth:`count`);
    - once ``closing``, no exchange is left running and nothing more is
      written; :meth:`release` (the connection is lost) leaves nothing that
      refers back to the session.
    """

    __slots__ = (
        "batching",
        "client_ip",
        "closing",
        "conn",
        "engine",
        "floods",
        "flush_soon",
        "going_away",
        "hsts",
        "ledger",
        "services",
        "streams",
        "transport",
        "write_paused",
    )

    def __init__(self, services: EdgeServices, ledger: OutputLedger[RequestRecord]) -> None:
        self.services = services
        self.hsts = services.hsts_field
        self.ledger = ledger
        self.engine = engine = resolve_engine(services.http.h2_engine)
        self.conn = new_server_connection(
            engine,
            max_concurrent_streams=services.http.h2_max_concurrent_streams,
            max_header_list_size=services.http_limits.max_header_bytes,
            stream_window=STREAM_WINDOW,
        )
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, ClientStream] = {}
        self.batching = 0
        self.flush_soon = False
        self.write_paused = False  # the transport's buffer is above its high-water mark
        self.going_away = False
        self.closing = False
        self.client_ip = ""  # for the log, once the connection is made
        self.floods = FloodCounters(time.monotonic())

    def start(self, transport: asyncio.Transport) -> None:
        """Write to ``transport`` from now on, starting with our SETTINGS and window."""
        self.transport = transport
        self.ledger.attach(transport)
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self.flush()

    # -- output -----------------------------------------------------------------------

    def flush(self) -> None:
        """Write what the connection has queued, unless writes are being batched."""
        if self.batching:
            return
        data = self.conn.data_to_send()
        transport = self.transport
        if data and transport is not None and not transport.is_closing():
            self.ledger.queued += len(data)
            transport.write(data)
        self.ledger.check()

    def flush_deferred(self) -> None:
        self.flush_soon = False
        self.flush()

    def write_now(self, data: bytes) -> None:
        """Write ``data`` at once, batched or not."""
        transport = self.transport
        if data and transport is not None and not transport.is_closing():
            self.ledger.queued += len(data)
            transport.write(data)

    # -- the end ----------------------------------------------------------------------

    def stream_done(self, stream_id: int) -> None:
        streams = self.streams
        streams.pop(stream_id, None)
        if self.going_away and not streams:
            self.close()

    def close_if_done(self) -> None:
        if self.going_away and not self.streams:
            self.close()

    def announce_going_away(self) -> None:
        """GOAWAY(NO_ERROR) once: the streams open finish, new ones are refused
        (REFUSED_STREAM, safe to retry: RFC 9113 §6.8); closes when done.

        The frame is written here, not with ``close_connection``: both
        engines treat a GOAWAY they send as the end of the connection and
        would refuse the responses of the streams still open."""
        if not self.going_away:
            self.going_away = True
            self.flush()
            frame = hyperframe.frame.GoAwayFrame(0)
            frame.last_stream_id = self.conn.highest_inbound_stream_id
            frame.error_code = h2.errors.ErrorCodes.NO_ERROR
            self.write_now(frame.serialize())
        self.close_if_done()

    def count(self, what: str) -> None:
        """One more frame of a kind :mod:`edge.h2_floods` bounds; past its
        bound, GOAWAY(ENHANCE_YOUR_CALM) and close."""
        if self.floods.over(what):
            self.services.count_error(f"h2_flood_{what}")
            throttled.warning("HTTP/2 %s flood from %s: closing", what, self.client_ip)
            self.go_away(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def go_away(self, code: int) -> None:
        """A connection error: GOAWAY with ``code``, then close at once."""
        try:
            self.conn.close_connection(error_code=code)
        except h2.exceptions.ProtocolError:
            pass
        self.close()

    def close(self) -> None:
        """Close the transport after the frames queued; the exchanges are cancelled."""
        if self.closing:
            return
        self.write_now(self.conn.data_to_send())
        self.closing = True
        for stream in list(self.streams.values()):
            if stream.exchange is not None:
                stream.exchange.cancel("client_closed")
        if self.transport is not None:
            self.transport.close()

    def release(self) -> None:
        """The connection is lost: cancel every exchange, log what is left."""
        self.closing = True
        for stream in list(self.streams.values()):
            if stream.exchange is not None:
                stream.exchange.cancel("client_closed")
        self.streams.clear()
        self.ledger.settle(final=True)
        release_connection(self.conn)
