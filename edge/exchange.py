"""One request and its tunnel stream: the path the HTTP/1.1 and HTTP/2 front ends share.

A front end (:mod:`edge.front_h1`, :mod:`edge.front_h2`) turns a client's
request into a validated, rewritten HTTP/1.1 head (:mod:`edge.http1`) and
hands it to an :class:`Exchange`, which owns everything between that head and
the response: the tunnel stream it opens (PROTOCOL.md §6.7: a stream is one
request), the wait for a tunnel that is coming up, the response's framing
(:class:`edge.http1.ResponseReader`), what a fault means
(:mod:`edge.exchange_rules`), the replay of a request that never reached a
backend, and how the stream ends (RESET IDLE for a reusable backend
connection, §6.5.1). The front end keeps only what is its own: the client's
framing, ordering and flow control, and the writing of bytes.

The exchange is composed of small parts, each owning one responsibility for
as long as it lasts:

- :class:`edge.exchange_upstream.Upstream`: one open stream and the response
  read from it (a replay gets a new one);
- :class:`edge.exchange_wait.TunnelWait`: the wait for a tunnel, while none is up;
- :class:`edge.exchange_websocket.WebSocketClose`: the edge's Close of a
  WebSocket (a drain);
- :mod:`edge.exchange_rules`: the pure decisions (what a fault means, how a
  stream ends).

The exchange talks back through the :class:`ExchangeClient` interface; it
calls the front end, never the reverse while a call is in progress, and
:meth:`ExchangeClient.exchange_finished` is called exactly once, last.

Backpressure: the stream above its high-water mark asks the front end to stop
reading the client (:meth:`ExchangeClient.pause_request`); a front end whose
client is slow calls :meth:`Exchange.pause_response`, which stops reading the
stream, so its credit stops flowing and the origin stops sending (§7.3).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from edge.deadlines import Deadlines
from edge.exchange_rules import MAX_RESENDS, Fault, Step, on_fault
from edge.exchange_upstream import Upstream
from edge.exchange_wait import TunnelWait, TunnelWaiters
from edge.exchange_websocket import WebSocketClose, relay
from edge.http1 import HttpLimits, RequestHeadReceived, ResponseHeadReceived, ResponseReader
from edge.http1.events import Headers
from edge.request_record import RequestRecord
from edge.ws_frames import CLOSE_GOING_AWAY, CLOSE_SERVICE_RESTART, FrameTracker
from tunnel.aio.errors import TunnelError
from tunnel.mux import ErrorCode
from tunnel.mux.metadata import encode_request_fields

if TYPE_CHECKING:
    from edge.cache.cache import EdgeCache
    from tunnel.aio.stream import TunnelStream

__all__ = ["Exchange", "ExchangeClient", "ExchangeServices", "RequestRecord"]


class ExchangeServices(TunnelWaiters, Protocol):
    """What an exchange needs of its worker (edge.worker.EdgeWorker), a place
    to wait for a tunnel (:class:`edge.exchange_wait.TunnelWaiters`) included."""

    http_limits: HttpLimits
    tunnel_wait_s: float
    draining: bool
    deadlines: Deadlines
    cache: EdgeCache | None
    """The worker's cache and compressor (None: neither is on)."""

    def open_stream(
        self, metadata: bytes, factory: Callable[[], asyncio.BaseProtocol]
    ) -> tuple[str, TunnelStream]: ...  # raises tunnel.aio.errors.TunnelError
    def count_error(self, reason: str) -> None: ...
    def warn(self, message: str, *args: object) -> None: ...


class ExchangeClient(Protocol):
    """What a front end does for its exchanges."""

    def writes_begin(self) -> None:
        """What follows, up to :meth:`writes_end`, came from one read of the
        stream: the front end may gather it into one write (one TLS record)."""

    def writes_end(self) -> None: ...

    def response_head(self, exchange: Exchange, head: ResponseHeadReceived) -> None: ...
    def response_data(self, exchange: Exchange, data: bytes) -> None: ...
    def response_complete(
        self, exchange: Exchange, close: bool, trailers: Headers = ()
    ) -> None: ...
    def upgraded(self, exchange: Exchange) -> None: ...
    def upstream_ended(self, exchange: Exchange) -> None:
        """An upgraded stream's backend side ended (a half-close)."""

    def answer(self, exchange: Exchange, status: int) -> None:
        """Write the edge's own error response (nothing of one went out)."""

    def cut(self, exchange: Exchange) -> None:
        """End the response where the client can tell it was cut short."""

    def pause_request(self, exchange: Exchange) -> None: ...
    def resume_request(self, exchange: Exchange) -> None: ...
    def exchange_finished(self, exchange: Exchange) -> None: ...


class Exchange:
    """One request between a front end and a tunnel stream; see the module docstring.

    Owns the request's way up (its head, the client's WebSocket frames), the
    record, what a fault means and the one replay, and its parts, each there
    only while its responsibility lasts: :attr:`upstream` while a stream is
    open (:class:`edge.exchange_upstream.Upstream`: the response read from
    it), :attr:`_wait` while no tunnel is up
    (:class:`edge.exchange_wait.TunnelWait`), :attr:`ws_closing` once the edge
    closes its WebSocket (:class:`edge.exchange_websocket.WebSocketClose`).

    Invariants: :attr:`upstream` and :attr:`_wait` are never both set, and
    neither once it is :attr:`finished`; request octets go up in order (held
    by the wait until a stream opens); the front end hears
    :meth:`ExchangeClient.exchange_finished` once, last.
    """

    __slots__ = (
        "__weakref__",
        "_connection_metadata",
        "_head",
        "_method",
        "_wait",
        "client",
        "connection_metadata",
        "decode_chunked",
        "finished",
        "frame_h1",
        "record",
        "request",
        "request_whole",
        "response_paused",
        "services",
        "upgraded",
        "upstream",
        "upstream_active_at",
        "websocket_key",
        "ws_closing",
        "ws_up",
    )

    def __init__(
        self,
        services: ExchangeServices,
        client: ExchangeClient,
        head: RequestHeadReceived,
        connection_metadata: bytes,
        record: RequestRecord,
        *,
        decode_chunked: bool = False,
    ) -> None:
        self.services = services
        self.client = client
        self.record = record
        self.request = head
        self.connection_metadata = connection_metadata
        self._head = head.head
        if head.replayable:  # what a replay sends (edge.exchange_rules.on_fault)
            record.replay = self._head
        self._method = head.method
        self.websocket_key = head.websocket_upgrade.key if head.websocket_upgrade else None
        # The request's own items first: the origin decodes the connection's,
        # which follow, once per client connection (StreamMetadata.decode).
        self._connection_metadata = (
            encode_request_fields(
                head.host,
                head.request_id,
                record.method,
                record.path,
                long_poll=services.deadlines.is_long_poll(record.path),
            )
            + connection_metadata
        )
        self.decode_chunked = decode_chunked
        self.frame_h1 = not decode_chunked  # the client's body framing is HTTP/1.1's
        self.upstream: Upstream | None = None  # while a stream is open
        self._wait: TunnelWait | None = None  # while no tunnel is up
        self.request_whole = False
        self.response_paused = False
        self.upgraded = False
        self.finished = False
        self.upstream_active_at = time.monotonic()
        # The client's WebSocket frames (edge.ws_frames): how it ended, and where a
        # Close of our own may go; they may precede the 101 (the backend's: Upstream).
        self.ws_up = FrameTracker() if self.websocket_key is not None else None
        self.ws_closing: WebSocketClose | None = None  # the edge closes it (a drain)

    # -- the front end's calls -------------------------------------------------------

    def start(self) -> None:
        """Answer from the edge's cache (edge.cache), or :meth:`forward`."""
        cache = self.services.cache
        if cache is not None and cache.admit(self):
            return
        self.forward()

    def forward(self) -> None:
        """Open the stream and send the head, or wait for a tunnel."""
        if not self._open() and not self._wait_for_tunnel():
            self._no_tunnel()

    def _wait_for_tunnel(self) -> bool:
        """Wait up to ``tunnel_wait_s`` for a tunnel, the client's reading
        paused; False when the edge drains or nothing is connecting."""
        services = self.services
        wait = TunnelWait(services, self._open, self._no_tunnel)
        if services.draining or not wait.begin(services.tunnel_wait_s):
            return False
        self._wait = wait
        self.client.pause_request(self)
        return True

    def send_body(self, data: bytes) -> None:
        """Request body octets, as they must reach the backend."""
        self.record.bytes_in += len(data)
        self._send_up(data)

    def send_tunnel(self, data: bytes) -> None:
        """Client octets of an upgraded connection (or held behind the handshake)."""
        record = self.record
        record.bytes_in += len(data)
        frames = self.ws_up
        if frames is not None:
            data = relay(frames, self.ws_closing, data, record, to_backend=True)
        self._send_up(data)

    def request_complete(self) -> None:
        """The request (head and body) has been received whole from the client:
        the first-byte deadline counts from here (a slow upload is not the
        backend's fault; the body deadline covered it)."""
        self.request_whole = True
        self.upstream_active_at = time.monotonic()

    def client_half_closed(self) -> None:
        """The client closed its sending side of an upgraded connection."""
        upstream = self.upstream
        if upstream is not None and self.upgraded:
            upstream.stream.write_eof()

    def close_websocket(self, code: int = CLOSE_GOING_AWAY) -> None:
        """End an accepted WebSocket from the edge (a drain): a Close with
        ``code`` to the client and, masked as a client's, to the backend, each at
        its direction's next frame boundary. Then the Close replies end it as
        any close does (the backend ends the stream, the edge the connection)."""
        upstream = self.upstream
        if not self.upgraded or self.ws_closing is not None or upstream is None:
            return  # (upgraded and not finished: the upstream is there)
        closing = self.ws_closing = WebSocketClose(code)
        record = self.record
        if record.ws_closed_by is None:
            record.ws_close_code, record.ws_closed_by = code, "edge"
        to_client = closing.until_close(upstream.ws_down, b"", to_backend=False)  # type: ignore[arg-type]
        if to_client:
            self.client.response_data(self, to_client)
        self._send_up(closing.until_close(self.ws_up, b"", to_backend=True))  # type: ignore[arg-type]

    def websocket_opened(self) -> None:
        """The backend accepted the upgrade. If the worker drains already, or the
        tunnel connection was told to go away before this answer came, the
        closing of the others has passed this one by, and a deadline would cut
        it without a Close: it is closed now instead (1001, or 1012 for the
        origin going away), and its client reconnects."""
        upstream = self.upstream
        if self.services.draining:
            code = CLOSE_GOING_AWAY
        elif upstream is not None and getattr(
            upstream.stream.get_extra_info("tunnel"), "goaway_received", False
        ):
            code = CLOSE_SERVICE_RESTART
        else:
            return
        asyncio.get_running_loop().call_soon(self.close_websocket, code)

    def cancel(self, outcome: str = "client_closed", reason: str = "") -> None:
        """The client is gone (or the front end gives up): stop, quietly."""
        if self.finished:
            return
        if self.record.outcome == "ok" and not self.upgraded:  # a WebSocket may end so
            self.record.outcome = outcome
            self.record.reason = reason
        self._drop_stream()
        self.finish()

    def reject(self, status: int, reason: str) -> None:
        """The client broke the rules mid-request: reset the stream at once (the
        backend connection is not reused) and answer, or cut if a response started."""
        if self.finished:
            return
        record = self.record
        record.outcome, record.reason = "rejected", reason
        self._drop_stream()
        if record.answered:
            self.client.cut(self)
        else:
            record.status = status
            self.client.answer(self, status)
        self.finish()

    def time_out(self) -> None:
        """The front end's response deadline passed (edge.deadlines)."""
        self.fail(Fault.TIMEOUT, reason="response timeout")

    def pause_response(self) -> None:
        self.response_paused = True
        upstream = self.upstream
        if upstream is not None:
            upstream.stream.pause_reading()

    def resume_response(self) -> None:
        self.response_paused = False
        self.upstream_active_at = time.monotonic()  # the wait was the client's
        upstream = self.upstream
        if upstream is not None:
            upstream.stream.resume_reading()

    # -- the cache's calls (edge.cache) -------------------------------------------------

    def replace_head(self, head: bytes) -> None:
        """Send ``head`` up instead (the same request, conditional on what the
        cache holds); before :meth:`forward`."""
        self._head = head
        if self.record.replay is not None:
            self.record.replay = head

    def sibling(self, client: ExchangeClient) -> Exchange:
        """An exchange for the same request, answering ``client`` (a cache's
        background revalidation); it starts with :meth:`forward`."""
        record = RequestRecord(
            method=self.record.method,
            path=self.record.path,
            host=self.record.host,
            request_id=self.record.request_id,
            started=time.monotonic(),
        )
        return Exchange(
            self.services,
            client,
            self.request,
            self.connection_metadata,
            record,
            decode_chunked=True,
        )

    # -- its parts' calls ----------------------------------------------------------------

    def fail(self, fault: Fault, *, code: int | None = None, reason: str) -> None:
        """What ``fault`` means (edge.exchange_rules.on_fault): replay the
        request once on a fresh stream, else answer or cut, and finish."""
        record = self.record
        replayable = record.replay is not None and not record.retried
        resendable = record.replay is not None and record.resent < MAX_RESENDS
        action = on_fault(
            fault,
            code=code,
            answered=record.answered,
            replayable=replayable,
            resendable=resendable,
        )
        if action.step is Step.RESEND:
            self._resend()
            return
        if action.step is Step.REPLAY and self._replay():
            return
        self.services.count_error(action.outcome)
        self.services.warn("%s for %s %s: %s", action.outcome, record.method, record.path, reason)
        record.outcome, record.reason = action.outcome, reason
        self._drop_stream()
        if action.step is Step.CLOSE:
            self.client.cut(self)
        else:
            record.status = action.status
            self.client.answer(self, action.status)
        self.finish()

    def finish(self) -> None:
        """The exchange is over: the front end hears it, once."""
        if self.finished:
            return
        self.finished = True
        self.client.exchange_finished(self)

    # -- the stream ------------------------------------------------------------------

    def _open(self) -> bool:
        """Open a stream and send the request up; False when no tunnel is usable.
        After a wait for a tunnel, what the client sent meanwhile follows the
        head, the wait ends and the client is read again."""
        reader = ResponseReader(self.services.http_limits, decode_chunked=self.decode_chunked)
        reader.expect(self._method, self.websocket_key)
        upstream = Upstream(self, reader)
        try:
            origin, stream = self.services.open_stream(self._connection_metadata, lambda: upstream)
        except TunnelError:
            return False
        self.upstream = upstream
        self.record.origin = origin
        if self.response_paused:
            stream.pause_reading()
        wait = self._wait
        if wait is None:
            stream.write(self._head)
            return True
        self._wait = None
        stream.write(b"".join([self._head, *wait.queued]) if wait.queued else self._head)
        wait.stop()
        self.client.resume_request(self)
        return True

    def _send_up(self, data: bytes) -> None:
        if self.finished or not data:
            return
        upstream = self.upstream
        if upstream is not None:
            upstream.stream.write(data)
        elif self._wait is not None:
            self._wait.queued.append(data)

    def _no_tunnel(self) -> None:
        self.fail(Fault.NO_TUNNEL, reason="no tunnel to any origin")

    def _resend(self) -> None:
        """The origin refused the stream unprocessed (it is going away): the same
        request on another connection, or after a wait for one (:meth:`forward`:
        not the cache again, which passed it on already)."""
        record = self.record
        self._drop_stream()
        record.resent += 1
        self._head = record.replay  # type: ignore[assignment]
        self.services.count_error("resent")
        self.forward()

    def _replay(self) -> bool:
        """Send the request again on a fresh stream (nothing of it was answered)."""
        record = self.record
        self._drop_stream()
        record.retried = True
        self._head = record.replay  # type: ignore[assignment]
        # The tunnel it broke on may have been the last one up (an origin
        # restarting refuses what it got after its GOAWAY): then the replay
        # waits for the next tunnel, as a new request would.
        if not self._open() and not self._wait_for_tunnel():
            return False
        self.services.count_error("replayed")
        return True

    def _drop_stream(self) -> None:
        """Let go of the stream, reset CANCEL (its backend connection is not
        reused), or of the wait for one."""
        wait, self._wait = self._wait, None
        if wait is not None:
            wait.stop()
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.stream.abort(ErrorCode.CANCEL)
