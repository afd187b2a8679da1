"""What the streams of one HTTP/2 client connection share: the ``h2`` state
machine, the table of open streams, the flood counts, the connection's
output and its end.

The connection (:class:`edge.front_h2.Http2Connection`) reads the client and
starts streams; each stream (:class:`edge.front_h2_stream.ClientStream`)
answers its exchange; both queue frames in the one ``h2`` machine and write
them through the :class:`H2Session`, which batches them into as few writes
as it can and counts every octet for the access log (:mod:`edge.ledger`).
"""

from __future__ import annotations

import asyncio
import logging
import time

import h2.config
import h2.connection
import h2.errors
import h2.exceptions
import h2.settings
import hyperframe.frame

from edge.exchange import RequestRecord
from edge.front_h2_stream import ClientStream
from edge.h2_connection import EdgeH2Connection, release_h2
from edge.h2_decoder import RequestHeadDecoder
from edge.h2_encoder import StaticTableEncoder
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
    """One HTTP/2 client connection's ``h2`` machine, open streams and output.

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
        # What a client sends is checked by edge.h2_fields (RFC 9113 §8.2, the
        # same verdicts as h2's inbound pass at a fifth of the cost) before it is
        # translated, which joins the cookies. What we send is built lowercase,
        # without connection-specific fields, from heads our HTTP/1.1 reader
        # accepted (edge.h2_translate), so h2's outbound pass would only check
        # our own work, at ~5 us a head.
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_inbound_headers=False,
            normalize_inbound_headers=False,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        conn: h2.connection.H2Connection = EdgeH2Connection(config=config)
        conn.encoder = StaticTableEncoder()
        conn.decoder = RequestHeadDecoder()
        codes = h2.settings.SettingCodes
        max_header_bytes = services.http_limits.max_header_bytes
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                codes.MAX_CONCURRENT_STREAMS: services.http.h2_max_concurrent_streams,
                codes.MAX_HEADER_LIST_SIZE: max_header_bytes,
                codes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                codes.ENABLE_CONNECT_PROTOCOL: 1,
            },
        )
        conn.decoder.max_header_list_size = max_header_bytes
        self.conn = conn
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
        """Write what ``h2`` has queued, unless writes are being batched."""
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

        The frame is written here, not with ``H2Connection.close_connection``:
        h2's state machine treats a sent GOAWAY as the end of the connection
        and would refuse the responses of the streams still open."""
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
        release_h2(self.conn)
