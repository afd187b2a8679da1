"""The edge's TLS server transport: Python's ``ssl`` on its socket BIO, driven by
the event loop's readiness callbacks.

Why our own transport (the brief: write your own only on the hot path, and say
why). Every client connection's handshake and every request pass through
here. With uvloop's ``SSLProtocol`` (memory BIOs, a copy of every byte in and
out, an exception at the end of every read, a close_notify exchange driven
through both) the edge used 760 µs of CPU per short connection in
``make bench-edge`` (full handshake, one request, close; one run); with this transport,
443 µs. Its listener (:class:`edge.listener.TlsListener`) takes up to 64 connections per wake-up and
runs each handshake at once (the ClientHello is usually in already), so more
work lands in one loop iteration and one tunnel write carries the frames of
several connections: the origin's CPU per stream fell from 191 µs to 71 µs and
Node's from 74 µs to 32 µs. Full handshakes went from 0.53x to 0.93x
HAProxy's rate; keep-alive requests cost the edge 47 µs instead of 50 µs, and
an idle WebSocket 21.5 KiB of RSS instead of 30.6 KiB.

How it works:

- OpenSSL reads and writes the socket itself (``SSLContext._wrap_socket``, the
  constructor behind ``SSLContext.wrap_socket`` without its ``socket``
  subclass), non-blocking; ``SSLWantReadError`` / ``SSLWantWriteError`` say
  which readiness to wait for.
- Reads stop after a record when OpenSSL holds nothing more (``pending()``): the
  loop's polling is level-triggered, so bytes still in the socket wake us again,
  and the usual final read that only fails with "want read" is skipped.
- Writes go straight to ``SSL_write``; what the socket cannot take is kept and
  retried on writability (OpenSSL allows the retry from a moved buffer), with
  ``pause_writing``/``resume_writing`` around :data:`WRITE_HIGH_WATER`.
- ``close()`` keeps the asyncio contract: everything written before the
  transport is done closing (also what the protocol writes from
  ``resume_writing``) is sent first. Then close_notify, retried on writability
  if the socket is full, and then the lingering close (nginx's): read and
  discard until the client closes or :data:`LINGER_S` passes, longer while the
  kernel still holds unacknowledged response bytes. Closing at once with
  unread client bytes would make the kernel answer with a reset that can
  destroy the response in flight.
- A client that stops reading cannot hold a connection forever: no write
  progress for ``send_timeout_s`` aborts it (nginx's ``send_timeout``).
- A connection that ends without a close_notify exchange (the client reset
  it, the edge aborted it) is marked shut down before it is freed, as nginx
  does, so OpenSSL keeps its session for TLS 1.2 resumption
  (:func:`edge.openssl.mark_shut_down`); a client closing without
  close_notify is an ordinary EOF (``OP_IGNORE_UNEXPECTED_EOF``, :mod:`edge.tls`).
- :attr:`bytes_sent` counts the plaintext OpenSSL handed to the kernel, which
  is what the access log reports: bytes still queued here when the
  connection dies never reached the client.
- The SNI callback gets this transport as its ``ssl_object``: it carries the
  attribute and the ``context`` setter :mod:`edge.tls` uses, and
  ``get_extra_info("ssl_object")`` returns it with the ``SSLObject`` methods
  the proxy reads (cipher, version, ALPN, resumption).

The protocol sees the asyncio contract: ``connection_made`` once the handshake
is done (a failed or timed-out handshake never reaches it), ``data_received``,
``eof_received`` (its false return closes), ``connection_lost`` once, from the
loop, after the socket is closed.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import logging
import socket
import ssl
import struct
from collections.abc import Callable
from typing import Any

from edge.openssl import mark_shut_down

log = logging.getLogger("geoedge.edge.tls")

#: Plaintext octets read per ``SSL_read`` (a TLS record holds at most 16 KiB).
READ_BYTES = 256 * 1024
#: Where every connection's ``SSL_read`` lands before the octets read are
#: copied out: one buffer per worker (reads are synchronous, and what the
#: protocol gets is a copy). Reading into a fresh ``READ_BYTES`` object
#: instead cost an allocation of 256 KiB per read, which glibc serves with
#: a mapping of its own (mmap, page faults, munmap) wherever its mmap
#: threshold is fixed at 128 KiB, as the cache fixes it
#: (edge/cache/allocator.py): perf put 5-10% of a cache hit's CPU there.
_READ_BUFFER = memoryview(bytearray(READ_BYTES))
#: Buffered plaintext above which the protocol is asked to pause writing.
WRITE_HIGH_WATER = 64 * 1024
WRITE_LOW_WATER = 16 * 1024
#: How long a closed connection waits for the client to close its side once the
#: kernel has sent everything (see :meth:`TlsServerTransport._linger_expired`).
LINGER_S = 5.0
#: Without write progress for this long, a connection is aborted.
SEND_TIMEOUT_S = 60.0

# States. _OPEN carries application data; once close() is called and the queue is
# empty, _SHUTDOWN sends close_notify (it may wait for writability), _LINGER
# discards what the client still sends, _CLOSED has released the socket.
_HANDSHAKE, _OPEN, _SHUTDOWN, _LINGER, _CLOSED = range(5)

_SIOCOUTQ = 0x5411  # Linux TIOCOUTQ: octets in the send queue not yet acknowledged


def _unacknowledged(sock: socket.socket) -> int:
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0]  # type: ignore[no-any-return]
    except OSError:
        return 0


class TlsServerTransport(asyncio.Transport):
    """One accepted TLS connection; see the module docstring."""

    __slots__ = (
        "__weakref__",
        "_buffered",
        "_closing",
        "_eof_seen",
        "_fd",
        "_flushed_callback",
        "_linger_s",
        "_lingered_s",
        "_loop",
        "_on_closed",
        "_on_failed",
        "_paused_writing",
        "_peer",
        "_protocol",
        "_reading",
        "_send_timeout_s",
        "_sent",
        "_sock",
        "_state",
        "_timer",
        "_tls",
        "_wbuf",
        "_write_progress",
        "_writer",
        "geoedge_acme_tls",
        "geoedge_server_name",
        "handshake_seconds",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        context: ssl.SSLContext,
        protocol: asyncio.Protocol,
        handshake_timeout_s: float,
        linger_s: float = LINGER_S,
        send_timeout_s: float = SEND_TIMEOUT_S,
        on_closed: Callable[[], None] | None = None,
        on_failed: Callable[[Any, str], None] | None = None,
    ) -> None:
        """``on_closed``: called once when the socket is closed, whatever the
        reason (a failed handshake too): admission counts are released there.
        ``on_failed(peername, reason)``: the handshake failed or timed out."""
        self._loop = loop
        self._on_closed = on_closed
        self._on_failed = on_failed
        self._linger_s = linger_s
        self._lingered_s = 0.0
        self._send_timeout_s = send_timeout_s
        self._sent = 0
        self.handshake_seconds = loop.time()  # the start, until the handshake's end
        self._flushed_callback: Callable[[], None] | None = None
        self._write_progress = 0.0
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol: asyncio.Protocol | None = protocol
        self._state = _HANDSHAKE
        self._closing = False
        self._eof_seen = False  # the client closed its side: nothing more to read
        self._reading = True
        self._writer = False
        self._paused_writing = False
        # A deque only while writes wait for the socket: an empty deque costs
        # 760 B, on every idle connection (WebSockets, keep-alive).
        self._wbuf: collections.deque[bytes] | tuple[()] = ()
        self._buffered = 0
        self._peer: Any = None
        self.geoedge_server_name: str | None = None
        self.geoedge_acme_tls = False  # the client offered acme-tls/1 (edge.tls_acme)
        self._tls = context._wrap_socket(sock, True, None, owner=self)  # type: ignore[attr-defined]
        self._timer: asyncio.TimerHandle | None = loop.call_later(
            handshake_timeout_s, self._timed_out
        )
        loop.add_reader(self._fd, self._on_readable)
        self._on_readable()  # the ClientHello is often in already

    # -- the ssl_object face (SNI callback, metadata) ------------------------------------

    @property
    def context(self) -> ssl.SSLContext:
        return self._tls.context  # type: ignore[no-any-return]

    @context.setter
    def context(self, value: ssl.SSLContext) -> None:
        self._tls.context = value

    def cipher(self) -> tuple[str, str, int] | None:
        return self._tls.cipher()  # type: ignore[no-any-return]

    def version(self) -> str | None:
        return self._tls.version()  # type: ignore[no-any-return]

    def selected_alpn_protocol(self) -> str | None:
        return self._tls.selected_alpn_protocol()  # type: ignore[no-any-return]

    @property
    def session_reused(self) -> bool:
        return bool(self._tls.session_reused)

    # -- readiness -------------------------------------------------------------------------

    def _on_readable(self) -> None:
        state = self._state
        if state == _OPEN:
            if self._wbuf and not self._writer:
                self._on_writable()  # a write that waited for the peer's bytes
                if self._state != _OPEN:
                    return
            self._read()
        elif state == _HANDSHAKE:
            self._handshake()
        elif state != _CLOSED:  # _SHUTDOWN, _LINGER: the client's bytes are discarded
            self._drain_lingering()

    def _handshake(self) -> None:
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLWantWriteError:
            self._want_write()
            return
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS handshake with %s failed: %s", self._peername(), exc)
            if self._on_failed is not None:
                self._on_failed(self._peername(), _handshake_error(exc))
            self._close_socket(None, notify=False)
            return
        self._state = _OPEN
        self._cancel_timer()
        self.handshake_seconds = self._loop.time() - self.handshake_seconds
        self._protocol.connection_made(self)  # type: ignore[union-attr]
        if self._state == _OPEN:
            self._read()

    def _read(self) -> None:
        tls = self._tls
        protocol: asyncio.Protocol = self._protocol  # type: ignore[assignment]  # set while open
        while self._reading and self._state == _OPEN:
            try:
                data = _READ_BUFFER[: tls.read(READ_BYTES, _READ_BUFFER)].tobytes()
            except ssl.SSLWantReadError:
                return
            except ssl.SSLWantWriteError:  # a post-handshake message to answer
                self._want_write()
                return
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                data = b""
            except (ssl.SSLError, OSError) as exc:
                self._close_socket(exc)
                return
            if not data:
                # TCP half-close (or close_notify): the response may still go out
                # if the protocol says so; stop watching a socket that stays readable.
                self._eof_seen = True
                self._loop.remove_reader(self._fd)
                if not protocol.eof_received():
                    self.close()
                return
            protocol.data_received(data)
            if not tls.pending():
                return  # level-triggered: more records in the socket wake us again

    def _want_write(self) -> None:
        if not self._writer:
            self._writer = True
            self._loop.add_writer(self._fd, self._on_writable)
        if self._state != _HANDSHAKE:
            self._arm_send_timer()

    def _arm_send_timer(self) -> None:
        """Data waits for the client (writability, or its bytes): time it."""
        if self._timer is None:
            self._write_progress = self._loop.time()
            self._timer = self._loop.call_later(self._send_timeout_s, self._send_stalled)

    def _on_writable(self) -> None:
        state = self._state
        if state == _HANDSHAKE:
            self._stop_writer()
            self._handshake()
            return
        if state == _SHUTDOWN:
            self._stop_writer()
            self._shutdown()
            return
        if not self._flush():
            return
        self._stop_writer()
        self._cancel_timer()
        callback = self._flushed_callback
        if callback is not None:
            self._flushed_callback = None
            callback()
            if self._state != _OPEN or self._wbuf:
                return
        if self._paused_writing:
            self._paused_writing = False
            self._protocol.resume_writing()  # type: ignore[union-attr]  # may write more, or close
            if self._state != _OPEN or self._wbuf:
                return  # what it wrote is queued and retried like the rest
        if self._closing:
            self._shutdown()
        elif self._reading:
            self._read()  # a read may have been waiting on this write

    def _flush(self) -> bool:
        """Write the queue; True once it is empty, False while it waits for
        readiness (armed) or when the connection failed."""
        tls, wbuf = self._tls, self._wbuf
        if isinstance(wbuf, tuple):
            return True
        while wbuf:
            try:
                tls.write(wbuf[0])
            except ssl.SSLWantWriteError:
                self._want_write()
                return False
            except ssl.SSLWantReadError:  # retried when the socket is readable
                self._stop_writer()
                self._arm_send_timer()
                return False
            except (ssl.SSLError, OSError) as exc:
                self._close_socket(exc)
                return False
            size = len(wbuf.popleft())
            self._buffered -= size
            self._sent += size
            self._write_progress = self._loop.time()
        self._wbuf = ()
        return True

    def _send_stalled(self) -> None:
        """The send timer: abort when nothing was written for ``send_timeout_s``."""
        self._timer = None
        idle = self._loop.time() - self._write_progress
        if idle < self._send_timeout_s:
            self._timer = self._loop.call_later(self._send_timeout_s - idle, self._send_stalled)
            return
        log.debug("no write progress to %s for %.0f s", self._peername(), idle)
        self._close_socket(TimeoutError("client stopped reading"))

    def _stop_writer(self) -> None:
        if self._writer:
            self._writer = False
            self._loop.remove_writer(self._fd)

    # -- asyncio.Transport -------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        # After close() too, as asyncio's transports: what is written before the
        # close_notify goes out is sent before it.
        if not data:
            return
        if self._state != _OPEN:
            if self._state != _CLOSED:
                log.debug("%d octets written after close_notify, dropped", len(data))
            return
        if not self._wbuf:
            try:
                self._tls.write(data)
                self._sent += len(data)
                return
            except ssl.SSLWantWriteError:
                self._want_write()
            except ssl.SSLWantReadError:  # retried when the socket is readable (_on_readable)
                self._arm_send_timer()
            except (ssl.SSLError, OSError) as exc:
                self._close_socket(exc)
                return
        chunk = bytes(data)
        if isinstance(self._wbuf, tuple):
            self._wbuf = collections.deque()
        self._wbuf.append(chunk)
        self._buffered += len(chunk)
        if not self._paused_writing and self._buffered > WRITE_HIGH_WATER:
            self._paused_writing = True
            self._protocol.pause_writing()  # type: ignore[union-attr]

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        """Send what is queued, then close_notify, then linger (module docstring)."""
        if self._closing:
            return
        self._closing = True
        if self._state == _HANDSHAKE:
            self._close_socket(None, notify=False)
        elif self._state == _OPEN and not self._wbuf:
            self._shutdown()
        # else: _on_writable shuts down once the queue is empty

    def abort(self) -> None:
        self._closing = True
        self._close_socket(None)

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            if self._state == _OPEN and not self._eof_seen:
                self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            if self._state == _OPEN and not self._eof_seen:
                self._loop.add_reader(self._fd, self._on_readable)
                if self._tls.pending():
                    self._loop.call_soon(self._on_readable)

    def is_reading(self) -> bool:
        return self._reading and self._state == _OPEN

    def get_write_buffer_size(self) -> int:
        return self._buffered if self._state != _CLOSED else 0

    def call_when_flushed(self, callback: Callable[[], None]) -> None:
        """``callback()`` once everything written so far is in the kernel: at once
        if it is already; never if the connection dies first (``connection_lost``
        comes instead). One callback at a time: a second replaces the first."""
        if not self._wbuf:
            callback()
        else:
            self._flushed_callback = callback

    @property
    def bytes_sent(self) -> int:
        """Plaintext octets handed to the kernel so far (what the client was sent)."""
        return self._sent

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return WRITE_LOW_WATER, WRITE_HIGH_WATER

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Fixed limits (:data:`WRITE_HIGH_WATER`); the edge never changes them."""

    def can_write_eof(self) -> bool:
        return False  # TLS has no half-close

    def write_eof(self) -> None:
        raise NotImplementedError("TLS connections cannot half-close")

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol  # type: ignore[return-value]  # None once connection_lost ran

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self
        if name == "peername":
            return self._peername()
        if name == "sockname":
            try:
                return self._sock.getsockname()
            except OSError:
                return default
        if name == "socket":
            return self._sock
        if name == "sslcontext":
            return self.context
        return default

    # -- closing -----------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Send close_notify (the queue is empty), then linger.

        No TCP half-close before the client's answer: a FIN right behind the
        close_notify made uvloop's own TLS client drop the tail of a large
        response it had not read yet (it passed the FIN on before the buffered
        plaintext); uvloop's server never sent one early either."""
        if self._state == _OPEN:
            self._state = _SHUTDOWN
            if not self._reading or self._eof_seen:  # from now on client bytes are discarded
                self._loop.add_reader(self._fd, self._on_readable)
        try:
            self._tls.shutdown()
        except ssl.SSLWantWriteError:  # the socket is full: retried on writability
            self._want_write()
            return
        except ssl.SSLWantReadError:
            pass  # close_notify is out; the client's is not awaited
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            self._close_socket(None)  # the client has closed already
            return
        except (ssl.SSLError, OSError, ValueError) as exc:
            self._close_socket(exc if isinstance(exc, OSError) else None)
            return
        self._stop_writer()
        self._cancel_timer()
        self._state = _LINGER
        self._timer = self._loop.call_later(self._linger_s, self._linger_expired)

    def _drain_lingering(self) -> None:
        try:
            data = self._sock.recv(16384)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close_socket(None)

    def _linger_expired(self) -> None:
        """Close, unless the kernel still holds response bytes the client has not
        acknowledged: a slow link may need longer than ``linger_s`` to take what
        was written, and a reset caused by a late client byte would destroy it.
        Bounded by the send timeout."""
        self._timer = None
        self._lingered_s += self._linger_s
        if self._lingered_s < self._send_timeout_s and _unacknowledged(self._sock) > 0:
            self._timer = self._loop.call_later(self._linger_s, self._linger_expired)
            return
        self._close_socket(None)

    def _timed_out(self) -> None:
        self._timer = None
        log.debug("TLS handshake with %s timed out", self._peername())
        if self._on_failed is not None:
            self._on_failed(self._peername(), "TLS handshake timeout")
        self._close_socket(None, notify=False)

    def _close_socket(self, exc: Exception | None, *, notify: bool = True) -> None:
        if self._state == _CLOSED:
            return
        was_open = self._state != _HANDSHAKE
        if self._state in (_OPEN, _SHUTDOWN):
            # Ending without a close_notify exchange (a reset, an abort, a
            # failed write): keep the session resumable (edge.openssl).
            mark_shut_down(self._tls)
        self._state = _CLOSED
        self._closing = True
        self._cancel_timer()
        self._loop.remove_reader(self._fd)
        self._stop_writer()
        self._wbuf = ()
        self._buffered = 0
        self._flushed_callback = None
        self._sock.close()
        on_closed, self._on_closed = self._on_closed, None
        if on_closed is not None:
            on_closed()
        if notify and was_open:
            self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: Exception | None) -> None:
        # The protocol holds this transport: letting go of it once it has heard
        # the end (as asyncio's transports do) leaves no cycle, so reference
        # counting frees both the moment the loop drops the last callback.
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.connection_lost(exc)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _peername(self) -> Any:
        if self._peer is None:
            try:
                self._peer = self._sock.getpeername()
            except OSError:
                return None
        return self._peer


def _handshake_error(exc: BaseException) -> str:
    """A short reason for the log: OpenSSL's own words, without the file and line."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return f"TLS handshake failed: {exc.reason}"
    if isinstance(exc, ssl.SSLEOFError | ConnectionError) or not str(exc):
        return "TLS handshake failed: closed by the client"
    return f"TLS handshake failed: {exc}"
