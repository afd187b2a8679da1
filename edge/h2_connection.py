"""``h2``'s connection as the edge's HTTP/2 front end uses it (its server side).

Three departures from ``h2``, each where ``h2`` would end the whole
connection for what RFC 9113 makes a stream error, or keep it alive too long:

- a request's ``content-length`` is left to the front end
  (:class:`_RequestStream`): :func:`edge.h2_fields.check_request` reads it and
  :class:`edge.front_h2_requests.Http2Requests` holds the body to it;
- a stream opened past ``max_concurrent_streams`` is refused alone
  (:class:`EdgeH2Connection`, :class:`StreamRefused`);
- :func:`release_h2` breaks the reference cycle a connection is, once lost.

:func:`new_h2_connection` makes one as the edge configures it: the ``h2``
engine of :mod:`edge.h2_engine`, the pure-Python one.

They rely on names private to ``h2`` (4.x); ``tests/unit/test_edge_h2_connection.py``
fails if a later ``h2`` renames them.
"""

from __future__ import annotations

from typing import cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream
import hyperframe.frame

from edge.h2_decoder import RequestHeadDecoder
from edge.h2_encoder import StaticTableEncoder

__all__ = ["EdgeH2Connection", "StreamRefused", "new_h2_connection", "release_h2"]


class _RequestStream(h2.stream.H2Stream):
    """An ``h2`` stream that leaves the request's ``content-length`` to the edge.

    ``h2`` parses it when the HEADERS arrive and counts every DATA frame
    against it, raising ``ProtocolError`` out of ``receive_data``: a
    connection error that ends every stream of the connection and drops the
    frames read after the faulty one, where RFC 9113 §8.1.1 makes a malformed
    request a stream error. :func:`edge.h2_fields.check_request` checks the
    value (the same rule as ``h2``'s) and :class:`edge.front_h2_requests.Http2Requests`
    counts the body against it, resetting only that stream.
    ``tests/unit/test_edge_h2_connection.py`` checks that both methods are
    still ``h2``'s."""

    __slots__ = ()

    def _initialize_content_length(self, headers: object) -> None:
        pass

    def _track_content_length(self, length: int, end_stream: bool) -> None:
        pass


class StreamRefused(h2.events.Event):
    """The client opened a stream past our ``max_concurrent_streams``; it was
    reset with REFUSED_STREAM and nothing of it reaches the front end."""

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class EdgeH2Connection(h2.connection.H2Connection):
    """``h2``'s connection, its streams :class:`_RequestStream`, and a stream
    opened past the concurrency limit refused alone.

    ``h2`` raises ``TooManyStreamsError`` out of ``receive_data`` for such a
    HEADERS frame: GOAWAY and the end of every stream of the connection,
    where RFC 9113 §5.1.2 makes it a stream error (PROTOCOL_ERROR or
    REFUSED_STREAM). A client may do it innocently: until our SETTINGS reach
    it, the limit it knows is none. So the stream is received as any other,
    with the limit lifted for that one frame (its header block must still
    update the HPACK table, §4.3, and h2 must know the stream to ignore what
    follows on it), then reset with REFUSED_STREAM, which tells the client
    it may send the request again (§8.7); the front end gets a
    :class:`StreamRefused` instead of its events.
    ``tests/unit/test_edge_h2_connection.py`` checks the ``h2`` names this relies on."""

    _lifting_limit = False

    @property
    def open_inbound_streams(self) -> int:
        return 0 if self._lifting_limit else super().open_inbound_streams

    def _begin_new_stream(
        self, stream_id: int, allowed_ids: h2.connection.AllowedStreamIDs
    ) -> h2.stream.H2Stream:
        stream = super()._begin_new_stream(stream_id, allowed_ids)
        stream.__class__ = _RequestStream
        return stream

    def _receive_headers_frame(
        self, frame: hyperframe.frame.HeadersFrame
    ) -> tuple[list[hyperframe.frame.Frame], list[h2.events.Event]]:
        try:
            return super()._receive_headers_frame(frame)
        except h2.exceptions.TooManyStreamsError:
            pass
        self._lifting_limit = True
        try:
            frames, _events = super()._receive_headers_frame(frame)
        finally:
            self._lifting_limit = False
        self.reset_stream(frame.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
        return frames, [StreamRefused(frame.stream_id)]


#: SETTINGS_NO_RFC7540_PRIORITIES (RFC 9218 §2.1), which h2 does not name:
#: the edge ignores RFC 7540 priority signals, on either engine, and says so.
NO_RFC7540_PRIORITIES = 0x9


def new_h2_connection(
    *, max_concurrent_streams: int, max_header_list_size: int, stream_window: int
) -> EdgeH2Connection:
    """A server connection with our settings, HPACK coders and field checks.

    What a client sends is checked by edge.h2_fields (RFC 9113 §8.2, the same
    verdicts as h2's inbound pass at a fifth of the cost) before it is
    translated, which joins the cookies. What we send is built lowercase,
    without connection-specific fields, from heads our HTTP/1.1 reader
    accepted (edge.h2_translate), so h2's outbound pass would only check our
    own work, at ~5 us a head."""
    config = h2.config.H2Configuration(
        client_side=False,
        header_encoding=None,
        validate_inbound_headers=False,
        normalize_inbound_headers=False,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    conn = EdgeH2Connection(config=config)
    conn.encoder = StaticTableEncoder()
    conn.decoder = RequestHeadDecoder()
    codes = h2.settings.SettingCodes
    conn.local_settings = h2.settings.Settings(
        client=False,
        initial_values={
            codes.MAX_CONCURRENT_STREAMS: max_concurrent_streams,
            codes.MAX_HEADER_LIST_SIZE: max_header_list_size,
            codes.INITIAL_WINDOW_SIZE: stream_window,
            codes.ENABLE_CONNECT_PROTOCOL: 1,
            # h2 sends any setting it is given; its type names only the ones it knows.
            cast("h2.settings.SettingCodes", NO_RFC7540_PRIORITIES): 1,
        },
    )
    conn.decoder.max_header_list_size = max_header_list_size
    return conn


def release_h2(conn: h2.connection.H2Connection) -> None:
    """Break the reference cycle every ``H2Connection`` is: its frame handlers
    are its own bound methods, kept in a dict it owns. The daemons almost never
    run a full collection (:mod:`geoedge.memory`), so without this each
    closed connection, its streams and HPACK tables would live until restart
    (~100 objects per connection, found by ``tests/integration/test_memory.py``).
    Only the receive path uses the table, and a lost connection receives nothing."""
    table = getattr(conn, "_frame_dispatch_table", None)
    if isinstance(table, dict):
        table.clear()
