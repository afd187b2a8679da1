# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""The edge's HTTP/2 server connection on libnghttp2: the part of
``h2.connection.H2Connection`` the front end uses, emitting ``h2``'s events.

Why a binding: ``h2`` parses every frame, runs its state machines and
flow-control arithmetic in Python; libnghttp2 (what curl, Node.js, Apache
httpd and nghttpx use) does the same in C. The front end
(:mod:`edge.front_h2`, :mod:`edge.front_h2_requests`,
:mod:`edge.front_h2_stream`, :mod:`edge.front_h2_session`) keeps every
decision of its own -- the field checks (:mod:`edge.h2_fields`), the
content-length count, the flood bounds (:mod:`edge.h2_floods`), GOAWAY on
drain, the response side of flow control -- and runs unchanged on either
connection (:mod:`edge.h2_engine` chooses; ``docs/http2.md`` says what each
costs). The session is driven through memory (``nghttp2_session_mem_recv``,
``nghttp2_session_mem_send``); what it writes collects in one buffer that
:meth:`NgHttp2Connection.data_to_send` hands over, as ``h2``'s does.

How nghttp2 is held to the edge's behaviour (the ``h2`` connection's,
:mod:`edge.h2_connection`), each checked by the tests that run on both
connections and by the differential property
``tests/property/test_h2_engines_agree.py``:

- no HTTP messaging (``nghttp2_option_set_no_http_messaging``): nghttp2
  neither checks fields nor counts a request's body against its
  ``content-length``; both are the front end's, which resets only the
  stream (RFC 9113 §8.1.1);
- no automatic WINDOW_UPDATE (``nghttp2_option_set_no_auto_window_update``):
  request DATA is credited back when the front end acknowledges it
  (``nghttp2_session_consume``). nghttp2 credits padding itself; what it
  credited is kept per stream and taken off the front end's acknowledgement,
  which counts padding as ``h2`` does (``flow_controlled_length``);
- a stream past ``max_concurrent_streams`` is refused alone, REFUSED_STREAM
  (RFC 9113 §5.1.2), and the front end gets :class:`edge.h2_connection.StreamRefused`.
  nghttp2 1.52 refuses so only while the limit is unacknowledged, and ends
  the connection (PROTOCOL_ERROR) once the client acknowledged it. So the
  limit goes in a SETTINGS frame of our own that nghttp2 never sees, the
  open streams are counted here (``_open``) and a stream past the limit is
  reset REFUSED_STREAM once its header block is decoded. nghttp2 is given
  the acknowledgement of its own SETTINGS when the client's first frame is
  read, and the client's acknowledgements are not passed on (but inside a
  header block, where nghttp2 must see the frame to refuse it);
- HEADERS or DATA on a stream the client already ended (half-closed
  (remote)) is a stream error, STREAM_CLOSED (RFC 9113 §5.1), which nghttp2
  makes a connection error: such a frame is met before nghttp2 reads it, the
  stream reset first, and nghttp2 then ignores the frame as one for a closed
  stream (still decoding its header block, so HPACK's table stays right);
- HEADERS or DATA on a stream nghttp2 no longer knows (it keeps no closed
  streams) would be ignored; they are answered as ``h2`` answers them
  (RFC 9113 §5.1, §5.1.1; :meth:`NgHttp2Connection._closed_stream_frame`),
  from the latest resets and skipped ids remembered here. A WINDOW_UPDATE
  of 0 and a padded DATA frame without room for its padding end the
  connection on any stream (§6.9, §6.1), where nghttp2 ignores them on a
  closed one;
- PRIORITY frames, which nghttp2 skips once it said
  SETTINGS_NO_RFC7540_PRIORITIES, are read here and reported (the front end
  counts them: PRIORITY floods); a client's PUSH_PROMISE and a frame whose
  stream id must (not) be 0 are refused at their header, as ``h2`` refuses
  them;
- the front end counts resets the client causes (MadeYouReset): each
  RST_STREAM nghttp2 sends of its own is reported as ``StreamReset`` with
  ``remote_reset`` false, as ``h2`` reports its own. Input is fed to
  nghttp2 one frame at a time and what it queued is taken after each, so
  these events come in the order of the frames that caused them;
- the flood bounds are the front end's: nghttp2's own limits that would act
  first or otherwise are lifted or set to ``h2``'s: RST_STREAM rate
  (``nghttp2_option_set_stream_reset_rate_limit``), queued PING/SETTINGS
  acknowledgements (``max_outbound_ack``), SETTINGS entries
  (``max_settings``), and CONTINUATION frames (``max_continuations`` = 63:
  ``h2`` refuses the 64th, GOAWAY PROTOCOL_ERROR);
- HPACK bombs: the header list is counted as it is decoded (32 octets per
  field plus name and value, RFC 9113 §6.5.2) and past
  ``max_header_list_size`` the connection ends with GOAWAY
  ENHANCE_YOUR_CALM, as ``h2`` ends it;
- a trailer block without END_STREAM ends the connection (PROTOCOL_ERROR),
  as ``h2`` ends it;
- a connection error (GOAWAY queued by nghttp2, or one of the above) makes
  :meth:`NgHttp2Connection.receive_data` raise ``h2.exceptions.ProtocolError``
  and drop that read's events, as ``h2`` does, with the GOAWAY in
  :meth:`NgHttp2Connection.data_to_send`.

Where nghttp2 stays itself (RFC 9113 allows or requires it, and ``h2``
differs; the differential property and docs/http2.md name each): a
connection whose first frame is not SETTINGS is refused (§3.4); frames after
the client's GOAWAY are read and the open streams answered (§6.8; ``h2``
ends the connection); a stream's DATA past its window resets that stream
(§6.9.1; ``h2`` ends the connection); a header block on a stream that is
closed, ended or skipped is decoded for HPACK's table only, not counted
against ``max_header_list_size`` (nothing of it is kept); responses are
HPACK-coded by nghttp2, with its dynamic table and Huffman coding,
``authorization``, ``proxy-authorization`` and ``set-cookie`` never indexed
(RFC 7541 §7.1.3).

Invariants: callbacks run only inside the nghttp2 calls made here, with the
GIL held; ``_chunk`` is drained by the one ``nghttp2_session_mem_send`` that
follows its ``nghttp2_submit_data`` (the front end sends DATA only within
the windows nghttp2 reports), so no data provider outlives a call.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from edge.libnghttp2 cimport *

import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from edge.h2_connection import StreamRefused

__all__ = ["NgHttp2Connection", "library_version"]

#: The settings the connection says first, then ``max_concurrent_streams``
#: alone in a frame of its own (see the module docstring).
cdef size_t _MAX_SETTINGS_ENTRIES = 16384 // 6 + 1  # every entry a frame can carry
#: Our SETTINGS_MAX_FRAME_SIZE: the default, never changed.
cdef Py_ssize_t _MAX_FRAME_SIZE = 16384
#: How many closed streams the connection remembers of each kind (see
#: ``_closed_stream_frame``): a reset's or a skip's answer is right for this
#: long after it; ``h2`` remembers 65536 closed streams, at ~100 octets each.
cdef Py_ssize_t _MAX_REMEMBERED = 1024
#: ``h2`` refuses a header block of more than 64 frames (HEADERS and 63 CONTINUATION).
cdef size_t _MAX_CONTINUATIONS = 63

#: A SETTINGS acknowledgement (RFC 9113 §6.5), fed to nghttp2 after the
#: client's first SETTINGS (see the module docstring).
cdef const uint8_t *_SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"

cdef object _RequestReceived = h2.events.RequestReceived
cdef object _TrailersReceived = h2.events.TrailersReceived
cdef object _DataReceived = h2.events.DataReceived
cdef object _StreamEnded = h2.events.StreamEnded
cdef object _StreamReset = h2.events.StreamReset
cdef object _WindowUpdated = h2.events.WindowUpdated
cdef object _RemoteSettingsChanged = h2.events.RemoteSettingsChanged
cdef object _SettingsAcknowledged = h2.events.SettingsAcknowledged
cdef object _PingReceived = h2.events.PingReceived
cdef object _PingAckReceived = h2.events.PingAckReceived
cdef object _PriorityUpdated = h2.events.PriorityUpdated
cdef object _ConnectionTerminated = h2.events.ConnectionTerminated
cdef object _StreamRefused = StreamRefused
cdef object _ErrorCodes = h2.errors.ErrorCodes
cdef object _Settings = h2.settings.Settings
cdef object _ProtocolError = h2.exceptions.ProtocolError
cdef object _StreamClosedError = h2.exceptions.StreamClosedError
cdef object _FlowControlError = h2.exceptions.FlowControlError
cdef object _FrameTooLargeError = h2.exceptions.FrameTooLargeError

#: Response fields no intermediary may keep in its HPACK table (RFC 7541 §7.1.3).
cdef frozenset _NEVER_INDEXED = frozenset({b"authorization", b"proxy-authorization", b"set-cookie"})


def library_version() -> str:
    """The version of the libnghttp2 this binding runs on (the shared
    library loaded, which a security update may have changed since the build)."""
    return nghttp2_version(0).version_str.decode()


cdef object _error_code(uint32_t code):
    """``h2``'s spelling of an error code: the ``ErrorCodes`` member, or the
    number when it is not one."""
    try:
        return _ErrorCodes(code)
    except ValueError:
        return code


cdef inline object _new(object cls):
    """An event without running its ``__init__`` (every attribute is set here)."""
    return cls.__new__(cls)


cdef class NgHttp2Connection:
    """One client connection's HTTP/2 server session on libnghttp2; see the module docstring.

    The methods are ``h2.connection.H2Connection``'s, with its arguments, its
    return values and its exceptions, for what the edge uses.
    """

    cdef nghttp2_session *_session
    cdef bytearray _out
    cdef list _events
    cdef list _fields
    cdef Py_ssize_t _field_bytes
    cdef Py_ssize_t _max_header_list_size
    cdef int32_t _max_concurrent_streams
    cdef int32_t _stream_window
    cdef bint _receiving
    cdef bint _failed  # a connection error: nothing more is read
    cdef object _failure  # its message
    cdef object _reason  # nghttp2's last word on an error (its error callback)
    cdef object _callback_error  # an exception raised in a callback, raised again after
    cdef object _data  # the DATA frame being read: None, bytes, or a list of its pieces
    cdef dict _padding  # stream -> padding octets nghttp2 credited, not yet acknowledged
    cdef set _open  # the client's streams open (not closed): max_concurrent_streams counts them
    # Streams nghttp2 no longer knows (see _closed_stream_frame): those closed
    # by a reset, either way (the latest _MAX_REMEMBERED, in order), and the
    # ids the client skipped ((first, last) ranges, the latest _MAX_REMEMBERED).
    cdef dict _reset_closed
    cdef list _skipped
    cdef uint32_t _block_error  # a connection error at the end of this header block
    cdef bint _quiet  # a reset sent now is not reported (h2 reports none)
    cdef object _remote_settings
    cdef int32_t _highest_inbound
    # Reading input one frame at a time (see the module docstring).
    cdef Py_ssize_t _preface_left
    cdef Py_ssize_t _frame_left
    cdef uint8_t _head[9]
    cdef Py_ssize_t _head_length
    cdef int32_t _frame_stream
    cdef uint8_t _frame_kind
    cdef bint _block_ends  # the header block ends with the frame being read (END_HEADERS)
    cdef bint _holding  # a reset sent now is reported at the end of the frame: _held
    cdef object _held
    cdef bint _skipping
    cdef Py_ssize_t _frame_length
    # The first octets of a PRIORITY, WINDOW_UPDATE or padded DATA frame's
    # payload, as they are read (_end_frame checks them).
    cdef uint8_t _payload[5]
    cdef Py_ssize_t _payload_length  # how many; -1: not such a frame
    cdef bint _settings_applied
    # The DATA being sent (see the invariants).
    cdef bytes _chunk
    cdef Py_ssize_t _chunk_at

    def __cinit__(self) -> None:
        self._session = NULL
        self._payload_length = -1

    def __init__(
        self,
        *,
        max_concurrent_streams: int,
        max_header_list_size: int,
        stream_window: int,
    ) -> None:
        cdef nghttp2_session_callbacks *callbacks
        cdef nghttp2_option *option
        cdef int rv
        self._out = bytearray()
        self._events = []
        self._fields = []
        self._padding = {}
        self._open = set()
        self._reset_closed = {}
        self._skipped = []
        self._max_header_list_size = max_header_list_size
        self._max_concurrent_streams = max_concurrent_streams
        self._stream_window = stream_window
        self._remote_settings = _Settings(client=True)
        self._preface_left = 24
        if nghttp2_session_callbacks_new(&callbacks) != 0:
            raise MemoryError()
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, _on_frame_recv)
        nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, _on_frame_send)
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, _on_begin_headers)
        nghttp2_session_callbacks_set_on_begin_frame_callback(callbacks, _on_begin_frame)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, _on_header)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, _on_data_chunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, _on_stream_close)
        nghttp2_session_callbacks_set_error_callback2(callbacks, _on_error)
        if nghttp2_option_new(&option) != 0:
            nghttp2_session_callbacks_del(callbacks)
            raise MemoryError()
        nghttp2_option_set_no_http_messaging(option, 1)
        nghttp2_option_set_no_auto_window_update(option, 1)
        nghttp2_option_set_no_closed_streams(option, 1)
        nghttp2_option_set_max_outbound_ack(option, <size_t>1 << 40)
        nghttp2_option_set_max_settings(option, _MAX_SETTINGS_ENTRIES)
        nghttp2_option_set_stream_reset_rate_limit(option, <uint64_t>1 << 62, 0)
        nghttp2_option_set_max_continuations(option, _MAX_CONTINUATIONS)
        rv = nghttp2_session_server_new2(&self._session, callbacks, <void *>self, option)
        nghttp2_option_del(option)
        nghttp2_session_callbacks_del(callbacks)
        if rv != 0:
            raise MemoryError()

    def __dealloc__(self) -> None:
        if self._session is not NULL:
            nghttp2_session_del(self._session)
            self._session = NULL

    # -- h2.connection.H2Connection's interface ------------------------------------------

    def initiate_connection(self) -> None:
        """Our SETTINGS: nghttp2's, then ``max_concurrent_streams`` in a frame
        of our own (see the module docstring)."""
        cdef nghttp2_settings_entry entries[4]
        entries[0].settings_id = NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE
        entries[0].value = <uint32_t>self._max_header_list_size
        entries[1].settings_id = NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
        entries[1].value = <uint32_t>self._stream_window
        entries[2].settings_id = NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL
        entries[2].value = 1
        entries[3].settings_id = NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES
        entries[3].value = 1
        _check(nghttp2_submit_settings(self._session, NGHTTP2_FLAG_NONE, entries, 4))
        self._flush()
        # SETTINGS (RFC 9113 §6.5): length 6, type 0x4, no flags, stream 0; one entry.
        self._out += b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03" + (
            <uint32_t>self._max_concurrent_streams
        ).to_bytes(4, "big")

    def increment_flow_control_window(self, increment: int, stream_id: int | None = None) -> None:
        _check(nghttp2_submit_window_update(
            self._session, NGHTTP2_FLAG_NONE, stream_id or 0, increment
        ))
        self._flush()

    def receive_data(self, data: bytes) -> list:
        """The events of what the client sent; ``h2.exceptions.ProtocolError``
        on a connection error, with the GOAWAY queued (none for a bad preface)."""
        cdef const uint8_t[:] view = data
        cdef const uint8_t *p = &view[0] if len(view) else NULL
        cdef Py_ssize_t n = len(view)
        cdef Py_ssize_t at = 0
        cdef Py_ssize_t take
        cdef Py_ssize_t keep
        cdef list events
        if self._failed:
            raise _ProtocolError(self._failure)
        self._events = events = []
        self._receiving = True
        try:
            while at < n and not self._failed:
                if self._preface_left:
                    take = min(self._preface_left, n - at)
                    self._feed(p + at, take)
                    self._preface_left -= take
                    at += take
                elif self._frame_left == 0:  # a frame header, whole or in part
                    take = min(9 - self._head_length, n - at)
                    memcpy(self._head + self._head_length, p + at, take)
                    self._head_length += take
                    at += take
                    if self._head_length == 9:
                        self._head_length = 0
                        self._begin_frame()
                        if self._frame_left == 0:
                            self._end_frame()
                else:
                    take = min(self._frame_left, n - at)
                    if 0 <= self._payload_length < 5:
                        keep = min(take, 5 - self._payload_length)
                        memcpy(self._payload + self._payload_length, p + at, keep)
                        self._payload_length += keep
                    if not self._skipping:
                        self._feed(p + at, take)
                    self._frame_left -= take
                    at += take
                    if self._frame_left == 0:
                        self._end_frame()
        finally:
            self._receiving = False
            self._events = []
        if self._callback_error is not None:
            error, self._callback_error = self._callback_error, None
            raise error
        if self._failed:
            raise _ProtocolError(self._failure)
        return events

    def data_to_send(self, amount: int | None = None) -> bytes:
        out = bytes(self._out)
        del self._out[:]
        return out

    def send_headers(
        self, stream_id: int, headers: list, end_stream: bool = False, priority_weight=None,
        priority_depends_on=None, priority_exclusive=None,
    ) -> None:
        cdef Py_ssize_t count = len(headers)
        cdef nghttp2_nv *nva
        cdef Py_ssize_t i
        cdef bytes name
        cdef bytes value
        self._sendable(stream_id)
        nva = <nghttp2_nv *>malloc(max(count, 1) * sizeof(nghttp2_nv))
        if nva is NULL:
            raise MemoryError()
        try:
            for i in range(count):
                field = headers[i]
                name = field[0]
                value = field[1]
                nva[i].name = <uint8_t *>PyBytes_AS_STRING(name)
                nva[i].namelen = PyBytes_GET_SIZE(name)
                nva[i].value = <uint8_t *>PyBytes_AS_STRING(value)
                nva[i].valuelen = PyBytes_GET_SIZE(value)
                nva[i].flags = (
                    NGHTTP2_NV_FLAG_NO_INDEX if name in _NEVER_INDEXED else NGHTTP2_NV_FLAG_NONE
                )
            # nghttp2 copies the fields, so the bytes need only outlive this call.
            _check(nghttp2_submit_headers(
                self._session,
                NGHTTP2_FLAG_END_STREAM if end_stream else NGHTTP2_FLAG_NONE,
                stream_id, NULL, nva, count, NULL,
            ))
        finally:
            free(nva)
        self._flush()

    def send_data(
        self, stream_id: int, data: bytes, end_stream: bool = False, pad_length=None
    ) -> None:
        cdef nghttp2_data_provider provider
        cdef Py_ssize_t size = len(data)
        self._sendable(stream_id)
        if size > self._window(stream_id):
            raise _FlowControlError(f"Cannot send {size} bytes, flow control window is too small")
        if size > nghttp2_session_get_remote_settings(
            self._session, NGHTTP2_SETTINGS_MAX_FRAME_SIZE
        ):
            raise _FrameTooLargeError(f"Cannot send frame of {size} bytes")
        self._chunk = data if type(data) is bytes else bytes(data)
        self._chunk_at = 0
        provider.source.ptr = NULL
        provider.read_callback = _read_chunk
        try:
            _check(nghttp2_submit_data(
                self._session,
                NGHTTP2_FLAG_END_STREAM if end_stream else NGHTTP2_FLAG_NONE,
                stream_id, &provider,
            ))
            self._flush()
            if self._chunk_at != size:
                raise RuntimeError(f"nghttp2 held DATA on stream {stream_id}")
        finally:
            self._chunk = None

    def end_stream(self, stream_id: int) -> None:
        self.send_data(stream_id, b"", end_stream=True)

    def reset_stream(self, stream_id: int, error_code: int = 0) -> None:
        cdef nghttp2_stream *stream = nghttp2_session_find_stream(self._session, stream_id)
        if stream is NULL or stream_id == 0 or nghttp2_stream_get_state(stream) in (
            NGHTTP2_STREAM_STATE_IDLE, NGHTTP2_STREAM_STATE_CLOSED
        ):
            raise _StreamClosedError(stream_id)
        _check(nghttp2_submit_rst_stream(self._session, NGHTTP2_FLAG_NONE, stream_id, error_code))
        self._flush()

    def acknowledge_received_data(self, acknowledged_size: int, stream_id: int) -> None:
        """Credit back ``acknowledged_size`` octets of the stream's DATA, padding
        included (``DataReceived.flow_controlled_length``): nghttp2 credited the
        padding when it read it, so that part is not credited twice."""
        cdef Py_ssize_t size = acknowledged_size
        cdef Py_ssize_t owed
        if self._padding:
            owed = self._padding.pop(stream_id, 0)
            if owed > size:
                self._padding[stream_id] = owed - size
                owed = size
            size -= owed
        if size > 0:
            _check(nghttp2_session_consume(self._session, stream_id, size))
            self._flush()

    def local_flow_control_window(self, stream_id: int) -> int:
        """What may be sent on the stream now: the smaller of its window and the connection's."""
        self._sendable(stream_id)
        return self._window(stream_id)

    @property
    def max_outbound_frame_size(self) -> int:
        return nghttp2_session_get_remote_settings(self._session, NGHTTP2_SETTINGS_MAX_FRAME_SIZE)

    @property
    def highest_inbound_stream_id(self) -> int:
        return self._highest_inbound

    def close_connection(
        self, error_code: int = 0, additional_data: bytes | None = None,
        last_stream_id: int | None = None,
    ) -> None:
        """GOAWAY with ``error_code``; nothing is read or sent after it."""
        if self._failed:
            raise _ProtocolError("the connection is closed")
        _check(nghttp2_session_terminate_session2(
            self._session,
            self._highest_inbound if last_stream_id is None else last_stream_id,
            error_code,
        ))
        self._flush()
        self._failed = True
        self._failure = "the connection is closed"

    # -- reading ------------------------------------------------------------------------

    cdef int _begin_frame(self) except -1:
        """A frame's header is whole in ``_head``: pass it on (or not), and
        its payload after it."""
        cdef uint8_t *head = self._head
        cdef Py_ssize_t length = (head[0] << 16) | (head[1] << 8) | head[2]
        cdef uint8_t kind = head[3]
        cdef uint8_t flags = head[4]
        cdef int32_t stream_id = ((head[5] & 0x7F) << 24) | (head[6] << 16) | (head[7] << 8) | head[8]
        cdef nghttp2_stream *stream
        # A header block awaits its CONTINUATION: any other frame is nghttp2's
        # to refuse (PROTOCOL_ERROR, RFC 9113 §6.10), so it is passed on as it is.
        cdef bint in_block = (
            self._frame_kind == NGHTTP2_HEADERS or self._frame_kind == NGHTTP2_CONTINUATION
        ) and not self._block_ends
        self._frame_stream = stream_id
        self._frame_kind = kind
        self._frame_left = length
        self._skipping = False
        self._frame_length = length
        self._payload_length = (
            0 if kind == NGHTTP2_PRIORITY and length == 5
            or kind == NGHTTP2_WINDOW_UPDATE and length == 4
            or kind == NGHTTP2_DATA and flags & NGHTTP2_FLAG_PADDED else -1
        )
        if in_block or length > _MAX_FRAME_SIZE:
            pass  # nghttp2's to refuse, at its header
        elif kind == NGHTTP2_PUSH_PROMISE:  # RFC 9113 §8.4: at its header, as h2 refuses it
            self._terminate(
                NGHTTP2_PROTOCOL_ERROR, "Received frame with invalid header: a client's PUSH_PROMISE"
            )
            self._flush()
            return 0
        elif (stream_id == 0) == (
            kind == NGHTTP2_DATA or kind == NGHTTP2_HEADERS or kind == NGHTTP2_PRIORITY
            or kind == NGHTTP2_RST_STREAM or kind == NGHTTP2_CONTINUATION
        ) and kind <= NGHTTP2_CONTINUATION and kind != NGHTTP2_WINDOW_UPDATE:
            # A frame on a stream when it must not be, or the reverse (RFC 9113
            # §6): refused at its header, as h2 refuses it, not once read whole.
            self._terminate(
                NGHTTP2_PROTOCOL_ERROR, f"Received frame with invalid header: type {kind}, stream {stream_id}"
            )
            self._flush()
            return 0
        elif kind == NGHTTP2_SETTINGS and flags & NGHTTP2_FLAG_ACK and length == 0 and not stream_id:
            self._skipping = True  # nghttp2 had its acknowledgement (_end_frame)
            return 0
        elif (kind == NGHTTP2_HEADERS or kind == NGHTTP2_DATA) and stream_id:
            stream = nghttp2_session_find_stream(self._session, stream_id)
            if stream is NULL and stream_id & 1 and stream_id <= self._highest_inbound:
                self._closed_stream_frame(kind, stream_id)
            elif (
                stream is not NULL
                and nghttp2_stream_get_state(stream) == NGHTTP2_STREAM_STATE_HALF_CLOSED_REMOTE
            ):  # a stream error, STREAM_CLOSED: reset first, nghttp2 then ignores the frame
                _check(nghttp2_submit_rst_stream(
                    self._session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_STREAM_CLOSED
                ))
                self._holding = True  # its event comes when h2 would make it (_end_frame)
                self._flush()
                self._holding = False
        if kind == NGHTTP2_HEADERS or kind == NGHTTP2_CONTINUATION:
            self._block_ends = flags & NGHTTP2_FLAG_END_HEADERS
        self._feed(head, 9)
        return 0

    cdef int _closed_stream_frame(self, uint8_t kind, int32_t stream_id) except -1:
        """HEADERS or DATA on a stream of the client's that nghttp2 no longer
        knows (it keeps no closed streams), which nghttp2 would ignore: answered
        as ``h2`` answers it (RFC 9113 §5.1, §5.1.1), h2spec's "closed" cases.
        DATA, or HEADERS on a stream closed by a reset: a stream error,
        STREAM_CLOSED (the client may not have seen the reset yet). HEADERS on
        a stream closed at both ends: a connection error, STREAM_CLOSED; on a
        stream id the client skipped: PROTOCOL_ERROR; either at the end of the
        header block, which nghttp2 decodes meanwhile (HPACK's table). Only the
        latest resets and skips are remembered: an older one counts as a
        stream closed at both ends."""
        cdef Py_ssize_t i
        if kind == NGHTTP2_DATA or stream_id in self._reset_closed:
            _check(nghttp2_submit_rst_stream(
                self._session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_STREAM_CLOSED
            ))
            self._quiet = True
            try:
                self._flush()
            finally:
                self._quiet = False
            return 0
        self._block_error = NGHTTP2_STREAM_CLOSED
        for i in range(len(self._skipped)):
            first, last = self._skipped[i]
            if first <= stream_id <= last:
                self._block_error = NGHTTP2_PROTOCOL_ERROR
                break
        return 0

    cdef int _new_stream(self, int32_t stream_id) except -1:
        """The client opened ``stream_id``: the ids it skipped are remembered."""
        if stream_id > self._highest_inbound + 2:
            self._skipped.append((self._highest_inbound + 2 if self._highest_inbound else 1,
                                  stream_id - 2))
            if len(self._skipped) > _MAX_REMEMBERED:
                del self._skipped[0]
        if stream_id > self._highest_inbound:
            self._highest_inbound = stream_id
        return 0

    cdef int _remember_reset(self, int32_t stream_id) except -1:
        if stream_id and stream_id & 1:
            self._reset_closed[stream_id] = None
            if len(self._reset_closed) > _MAX_REMEMBERED:
                del self._reset_closed[next(iter(self._reset_closed))]
        return 0

    cdef int _end_frame(self) except -1:
        """A frame is read whole. nghttp2 does not read PRIORITY frames once it
        said SETTINGS_NO_RFC7540_PRIORITIES: they are ``h2``'s to check and
        report here (the front end counts them: PRIORITY floods). A
        WINDOW_UPDATE of 0 and a padded DATA frame without room for its
        padding end the connection, as ``h2`` ends it, on any stream: nghttp2
        ignores such frames on a closed stream unread."""
        cdef uint8_t *payload = self._payload
        cdef nghttp2_priority_spec spec
        cdef int32_t stream_id = self._frame_stream
        cdef uint8_t kind = self._frame_kind
        if self._held is not None and (
            kind == NGHTTP2_DATA
            or (kind == NGHTTP2_HEADERS or kind == NGHTTP2_CONTINUATION) and self._block_ends
        ):  # the frame (or header block) on an ended stream is whole: h2 resets it now
            if not self._failed:
                self._events.append(self._held)
            self._held = None
        if self._block_error and self._block_ends:
            if self._block_error == NGHTTP2_PROTOCOL_ERROR:
                self._terminate(self._block_error, f"Stream ID {stream_id} is too low")
            else:
                self._terminate(self._block_error, f"Stream {stream_id} is closed")
            self._block_error = 0
            self._flush()
        if not self._settings_applied:  # the client's first frame, its SETTINGS
            self._settings_applied = True
            self._feed(_SETTINGS_ACK, 9)
        if (
            kind == NGHTTP2_WINDOW_UPDATE and self._payload_length == 4 and not self._failed
            and not (payload[0] & 0x7F or payload[1] or payload[2] or payload[3])
        ):
            self._terminate(NGHTTP2_PROTOCOL_ERROR, "Received frame with non-compliant data")
            self._flush()
        elif kind == NGHTTP2_DATA and self._payload_length >= 0 and not self._failed:
            if self._frame_length == 0:  # §6.1: no Pad Length field
                self._terminate(NGHTTP2_PROTOCOL_ERROR, "Frame data missing or invalid")
            elif payload[0] >= self._frame_length:  # §6.1: PROTOCOL_ERROR
                self._terminate(NGHTTP2_PROTOCOL_ERROR, "Received frame with invalid padding.")
            self._flush()
        elif kind == NGHTTP2_PRIORITY and self._payload_length == 5 and not self._failed:
            spec.stream_id = (
                ((payload[0] & 0x7F) << 24) | (payload[1] << 16) | (payload[2] << 8) | payload[3]
            )
            spec.exclusive = payload[0] >> 7
            spec.weight = payload[4] + 1
            if stream_id == 0:
                self._terminate(NGHTTP2_PROTOCOL_ERROR, "PRIORITY on stream 0")
            elif spec.stream_id == stream_id:
                self._terminate(
                    NGHTTP2_PROTOCOL_ERROR, f"Stream {stream_id} may not depend on itself"
                )
            else:
                self._priority_event(stream_id, &spec)
            self._flush()
        self._payload_length = -1
        return 0

    cdef int _feed(self, const uint8_t *data, Py_ssize_t length) except -1:
        """Pass input to nghttp2, then take what it queued."""
        cdef ssize_t rv
        if self._failed:
            return 0
        rv = nghttp2_session_mem_recv(self._session, data, length)
        if rv < 0 and rv != NGHTTP2_ERR_PAUSE:
            if rv == NGHTTP2_ERR_CALLBACK_FAILURE and self._callback_error is not None:
                self._failed = True
                self._failure = "error in a callback"
                return 0
            if rv == NGHTTP2_ERR_BAD_CLIENT_MAGIC:
                self._fail("Invalid HTTP/2 preamble.")  # h2's words, and no GOAWAY
                return 0
            if rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS:
                self._terminate(NGHTTP2_PROTOCOL_ERROR, "Too many continuation frames received.")
            elif rv == NGHTTP2_ERR_FLOODED:
                self._terminate(NGHTTP2_ENHANCE_YOUR_CALM, "flooded")
            else:
                self._fail(nghttp2_strerror(<int>rv).decode())
                return 0
        self._flush()
        return 0

    cdef int _fail(self, str reason) except -1:
        if not self._failed:
            self._failed = True
            self._failure = reason
        return 0

    cdef int _terminate(self, uint32_t code, str reason) except -1:
        """A connection error of our own: GOAWAY with ``code``."""
        if not self._failed:
            nghttp2_session_terminate_session2(self._session, self._highest_inbound, code)
            self._fail(reason)
        return 0

    cdef int _flush(self) except -1:
        """Append what nghttp2 queued to ``_out``."""
        cdef const uint8_t *data
        cdef ssize_t length
        cdef Py_ssize_t size
        while True:
            length = nghttp2_session_mem_send(self._session, &data)
            if length <= 0:
                break
            size = PyByteArray_GET_SIZE(self._out)
            PyByteArray_Resize(self._out, size + length)
            memcpy(PyByteArray_AS_STRING(self._out) + size, data, length)
        if self._callback_error is not None and not self._receiving:
            error, self._callback_error = self._callback_error, None
            raise error
        if length < 0:
            raise _ProtocolError(nghttp2_strerror(<int>length).decode())
        return 0

    # -- sending ------------------------------------------------------------------------

    cdef int _sendable(self, int32_t stream_id) except -1:
        """Raise as ``h2`` does for a stream that cannot be sent on."""
        cdef nghttp2_stream *stream = NULL
        cdef nghttp2_stream_proto_state state
        if stream_id > 0:
            stream = nghttp2_session_find_stream(self._session, stream_id)
        if stream is NULL:
            raise _StreamClosedError(stream_id)
        state = nghttp2_stream_get_state(stream)
        if state == NGHTTP2_STREAM_STATE_CLOSED or state == NGHTTP2_STREAM_STATE_IDLE:
            raise _StreamClosedError(stream_id)
        if state == NGHTTP2_STREAM_STATE_HALF_CLOSED_LOCAL:
            raise _ProtocolError(f"Stream {stream_id} is half-closed (local)")
        return 0

    cdef Py_ssize_t _window(self, int32_t stream_id):
        cdef int32_t stream = nghttp2_session_get_stream_remote_window_size(self._session, stream_id)
        cdef int32_t connection = nghttp2_session_get_remote_window_size(self._session)
        return max(0, min(stream, connection))

    # -- callbacks (their C entry points are below) -------------------------------------

    cdef int _frame_received(self, const nghttp2_frame *frame) except -1:
        cdef uint8_t kind = frame.hd.type
        cdef uint8_t flags = frame.hd.flags
        cdef int32_t stream_id = frame.hd.stream_id
        cdef list events = self._events
        cdef bint ended = flags & NGHTTP2_FLAG_END_STREAM
        cdef Py_ssize_t padding
        cdef size_t i
        if self._failed:
            return 0
        if kind == NGHTTP2_DATA:
            data = self._data
            if data is None:
                data = b""
            elif type(data) is list:
                data = b"".join(data)
            self._data = None
            event = _new(_DataReceived)
            event.stream_id = stream_id
            event.data = data
            event.flow_controlled_length = frame.hd.length
            padding = frame.hd.length - len(data)
            if padding:
                self._padding[stream_id] = self._padding.get(stream_id, 0) + padding
            events.append(event)
            event.stream_ended = self._ended(stream_id) if ended else None
        elif kind == NGHTTP2_HEADERS:
            fields, self._fields = self._fields, []
            if frame.headers.cat == NGHTTP2_HCAT_REQUEST:
                self._new_stream(stream_id)
                if len(self._open) >= self._max_concurrent_streams:
                    # Past the limit: refused alone, its block decoded (HPACK's
                    # table, the header list's bound); StreamRefused is reported
                    # when the RST_STREAM goes (_frame_sent), as h2's refusal.
                    _check(nghttp2_submit_rst_stream(
                        self._session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_REFUSED_STREAM
                    ))
                    return 0
                self._open.add(stream_id)
                event = _new(_RequestReceived)
            else:
                if not ended:
                    self._terminate(NGHTTP2_PROTOCOL_ERROR, "Trailers must have END_STREAM set")
                    return 0
                event = _new(_TrailersReceived)
            event.stream_id = stream_id
            event.headers = fields
            event.priority_updated = None
            events.append(event)
            event.stream_ended = self._ended(stream_id) if ended else None
            if flags & NGHTTP2_FLAG_PRIORITY:
                event.priority_updated = self._priority_event(stream_id, &frame.headers.pri_spec)
        elif kind == NGHTTP2_WINDOW_UPDATE:
            event = _new(_WindowUpdated)
            event.stream_id = stream_id
            event.delta = frame.window_update.window_size_increment
            events.append(event)
        elif kind == NGHTTP2_RST_STREAM:
            if nghttp2_session_find_stream(self._session, stream_id) is not NULL:
                self._remember_reset(stream_id)
                event = _new(_StreamReset)
                event.stream_id = stream_id
                event.error_code = _error_code(frame.rst_stream.error_code)
                event.remote_reset = True
                events.append(event)
        elif kind == NGHTTP2_SETTINGS:
            if flags & NGHTTP2_FLAG_ACK:
                event = _new(_SettingsAcknowledged)
                event.changed_settings = {}
                events.append(event)
            else:
                changed = {}
                for i in range(frame.settings.niv):
                    changed[frame.settings.iv[i].settings_id] = frame.settings.iv[i].value
                try:  # h2's own checks of the values, beside nghttp2's
                    self._remote_settings.update(changed)
                except _ProtocolError as exc:
                    self._terminate(exc.error_code, str(exc))
                    return 0
                events.append(_RemoteSettingsChanged.from_settings(self._remote_settings, changed))
                self._remote_settings.acknowledge()
        elif kind == NGHTTP2_PING:
            event = _new(_PingAckReceived if flags & NGHTTP2_FLAG_ACK else _PingReceived)
            event.ping_data = PyBytes_FromStringAndSize(<char *>frame.ping.opaque_data, 8)
            events.append(event)
        elif kind == NGHTTP2_PRIORITY:
            self._priority_event(stream_id, &frame.priority.pri_spec)
        elif kind == NGHTTP2_GOAWAY:
            event = _new(_ConnectionTerminated)
            event.error_code = _error_code(frame.goaway.error_code)
            event.last_stream_id = frame.goaway.last_stream_id
            event.additional_data = (
                PyBytes_FromStringAndSize(
                    <char *>frame.goaway.opaque_data, frame.goaway.opaque_data_len
                )
                if frame.goaway.opaque_data_len else None
            )
            events.append(event)
        return 0

    cdef object _ended(self, int32_t stream_id):
        event = _new(_StreamEnded)
        event.stream_id = stream_id
        self._events.append(event)
        return event

    cdef object _priority_event(self, int32_t stream_id, const nghttp2_priority_spec *spec):
        event = _new(_PriorityUpdated)
        event.stream_id = stream_id
        event.weight = spec.weight
        event.depends_on = spec.stream_id
        event.exclusive = bool(spec.exclusive)
        self._events.append(event)
        return event

    cdef int _frame_sent(self, const nghttp2_frame *frame) except -1:
        """Frames nghttp2 sends of its own while reading: its stream errors
        become events (REFUSED_STREAM: :class:`StreamRefused`), its GOAWAY a
        connection error."""
        cdef uint8_t kind = frame.hd.type
        if self._quiet:  # a stream nghttp2 no longer knows: how it closed stays as it was
            return 0
        if kind == NGHTTP2_RST_STREAM:
            self._remember_reset(frame.hd.stream_id)
        if not self._receiving:
            return 0
        if kind == NGHTTP2_RST_STREAM:
            if frame.rst_stream.error_code == NGHTTP2_REFUSED_STREAM:
                event = _new(_StreamRefused)
                event.stream_id = frame.hd.stream_id
                if frame.hd.stream_id > self._highest_inbound:
                    self._highest_inbound = frame.hd.stream_id
            else:
                event = _new(_StreamReset)
                event.stream_id = frame.hd.stream_id
                event.error_code = _error_code(frame.rst_stream.error_code)
                event.remote_reset = False
            if self._holding:
                self._held = event
                return 0
            self._events.append(event)
        elif kind == NGHTTP2_GOAWAY:
            self._fail(self._reason or f"GOAWAY {_error_code(frame.goaway.error_code)!r}")
        return 0

    cdef int _header(self, const uint8_t *name, size_t namelen, const uint8_t *value, size_t valuelen) except -1:
        if self._failed:
            return 0
        self._field_bytes += 32 + namelen + valuelen
        if self._field_bytes > self._max_header_list_size:  # an HPACK bomb: h2's answer
            self._terminate(
                NGHTTP2_ENHANCE_YOUR_CALM,
                f"Oversized header block: A header list larger than "
                f"{self._max_header_list_size} has been received",
            )
            return NGHTTP2_ERR_PAUSE
        self._fields.append((
            PyBytes_FromStringAndSize(<char *>name, namelen),
            PyBytes_FromStringAndSize(<char *>value, valuelen),
        ))
        return 0

    cdef int _data_chunk(self, const uint8_t *data, size_t length) except -1:
        chunk = PyBytes_FromStringAndSize(<char *>data, length)
        if self._data is None:
            self._data = chunk
        elif type(self._data) is list:
            self._data.append(chunk)
        else:
            self._data = [self._data, chunk]
        return 0


cdef inline int _check(int rv) except -1:
    if rv != 0:
        raise _ProtocolError(nghttp2_strerror(rv).decode())
    return 0


# The C entry points: each hands over to its connection (``user_data``) and
# keeps an exception for receive_data or _flush to raise.

cdef int _on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept:
    conn = <NgHttp2Connection>user_data
    try:
        return conn._frame_received(frame)
    except BaseException as exc:
        conn._callback_error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef int _on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept:
    conn = <NgHttp2Connection>user_data
    try:
        return conn._frame_sent(frame)
    except BaseException as exc:
        conn._callback_error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef int _on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept:
    conn = <NgHttp2Connection>user_data
    conn._fields = []
    conn._field_bytes = 0
    return 0


cdef int _on_begin_frame(nghttp2_session *session, const nghttp2_frame_hd *hd, void *user_data) noexcept:
    if hd.type == NGHTTP2_DATA:
        (<NgHttp2Connection>user_data)._data = None
    return 0


cdef int _on_header(
    nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
    const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data,
) noexcept:
    conn = <NgHttp2Connection>user_data
    try:
        return conn._header(name, namelen, value, valuelen)
    except BaseException as exc:
        conn._callback_error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef int _on_data_chunk(
    nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data,
    size_t length, void *user_data,
) noexcept:
    conn = <NgHttp2Connection>user_data
    try:
        return conn._data_chunk(data, length)
    except BaseException as exc:
        conn._callback_error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE


cdef int _on_stream_close(
    nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data,
) noexcept:
    conn = <NgHttp2Connection>user_data
    conn._open.discard(stream_id)
    return 0


cdef int _on_error(
    nghttp2_session *session, int lib_error_code, const char *msg, size_t length, void *user_data,
) noexcept:
    conn = <NgHttp2Connection>user_data
    try:
        conn._reason = msg[:length].decode("utf-8", "replace")
    except BaseException:
        pass
    return 0


cdef ssize_t _read_chunk(
    nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
    uint32_t *data_flags, nghttp2_data_source *source, void *user_data,
) noexcept:
    """The data provider: the one chunk :meth:`NgHttp2Connection.send_data` was given."""
    conn = <NgHttp2Connection>user_data
    cdef bytes chunk = conn._chunk
    cdef Py_ssize_t left = PyBytes_GET_SIZE(chunk) - conn._chunk_at
    cdef Py_ssize_t take = min(<Py_ssize_t>length, left)
    memcpy(buf, PyBytes_AS_STRING(chunk) + conn._chunk_at, take)
    conn._chunk_at += take
    if take == left:
        data_flags[0] |= NGHTTP2_DATA_FLAG_EOF
    return take
