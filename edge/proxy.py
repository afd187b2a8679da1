"""One client connection at the edge, carried over tunnel streams.

The client side is an ``asyncio.Protocol`` on the (TLS) client transport; the
upstream side is a :class:`tunnel.aio.stream.TunnelStream`, which is itself a
transport, with an :class:`edge.upstream.Upstream` protocol that hands every
event back here. Between them sit the sans-I/O HTTP/1.1 readers of :mod:`edge.http1`:
requests are validated and their heads rewritten (forwarding headers, request
id) before they go up; responses are forwarded as they come and parsed only to
know where they end, whether a WebSocket upgrade was accepted, and for the
access log.

Streams: a client connection uses one stream at a time, opened 0-RTT when its
first request head is complete. Node.js closes idle keep-alive sockets after
5 s; when the backend ends its side after a *complete* response, the client
connection stays open and its next request goes on a fresh stream, so the
client never pays a TLS handshake for Node's timeout. A bodiless idempotent
request that meets a backend closing at that moment (not one byte of response
yet) is replayed once on a fresh stream; anything else gets a real 502.

Backpressure both ways: a full client socket pauses the stream's reading
(its credit stops flowing, so the origin stops sending); a stream above its
high-water mark pauses reading from the client.

Faults are decided per request, by what the client has been sent of it: a
stream that breaks before any of its response went out gets a replay (a
bodiless idempotent request, once) or a real 502/503; after that the only
honest signal is closing the connection, and the access log says it was the
upstream's doing (``outcome``). A request that finds no usable tunnel waits
for one that is connecting, up to ``http.tunnel_wait_s``, with the client's
reading paused, then gets a 503.

The access log counts what the client was sent: a request is logged once its
last octet is in the kernel (:meth:`TlsServerTransport.call_when_flushed`), or
when the connection dies, with the octets that got out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edge.deadlines import Missed, Phase
from edge.http1 import (
    BackendClosed,
    ClientClosed,
    ClientContext,
    RequestBodyReceived,
    RequestHeadReceived,
    RequestReader,
    RequestRejected,
    ResponseBodyReceived,
    ResponseCompleted,
    ResponseHeadReceived,
    ResponseInvalid,
    TunnelBytes,
    WebSocketAccepted,
    WebSocketRefused,
    closing_head,
    error_response,
    https_location,
    redirect_response,
    with_field,
)
from edge.upstream import PendingRequest, Upstream, peer_address, stream_metadata
from tunnel.aio.stream import StreamResetError
from tunnel.mux import ErrorCode, StreamMetadata
from tunnel.mux.errors import MuxError
from tunnel.mux.metadata import encode_request_fields
from tunnel.runtime.logs import LogThrottle

if TYPE_CHECKING:
    from edge.config import RedirectListenerConfig
    from edge.worker import EdgeWorker

log = logging.getLogger("geoedge.edge")
throttled = LogThrottle(log)


class ClientConnection(asyncio.Protocol):
    """One client connection (after TLS and PROXY protocol)."""

    def __init__(
        self,
        worker: EdgeWorker,
        *,
        trusted: bool,
        client_address: tuple[str, int] | None = None,
        scheme: str = "https",
        redirect: RedirectListenerConfig | None = None,
    ) -> None:
        self.worker = worker
        self._redirect = redirect
        self._trusted = trusted
        self._client_address = client_address
        self._scheme = scheme
        self._hsts = worker.hsts_field if scheme == "https" else None  # [tls] hsts_max_age_s
        self.transport: asyncio.Transport | None = None
        self.reader: RequestReader | None = None
        self.upstream: Upstream | None = None
        self.pending: deque[PendingRequest] = deque()
        self.metadata: StreamMetadata | None = None
        self._encoded_metadata: bytes | None = None
        now = time.monotonic()
        # The clock the deadlines read (edge.deadlines.Clock).
        self.phase = Phase.IDLE
        self.phase_since = now
        self.client_active_at = now
        self.upstream_active_at = now
        self.response_paused = False
        self._client_paused = False
        self._closing = False
        self._reject_after: PendingRequest | None = None  # answered after the rest
        self._client_eof = False
        self._batch: list[bytes] | None = None
        self._queued = 0  # octets written to the client transport, ever
        self._unflushed: deque[PendingRequest] = deque()  # complete, not yet in the kernel
        self._held_events: list[Any] | None = None  # waiting for a tunnel (from a head on)
        self._tunnel_wait: asyncio.TimerHandle | None = None
        self._release: Callable[[], None] | None = None  # admission, plain HTTP only
        self._client_ip = ""

    # -- client side ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        worker = self.worker
        peer = self._client_address or peer_address(transport.get_extra_info("peername"))
        local = peer_address(transport.get_extra_info("sockname"))
        self.metadata = stream_metadata(transport, peer, local, worker.edge_id)
        context = ClientContext(
            client_ip=peer[0] if peer else "0.0.0.0",
            client_port=peer[1] if peer else 0,
            trusted_proxy=self._trusted,
            scheme=self._scheme,
            server_port=local[1] if local else 443,
        )
        self.reader = RequestReader(worker.http_limits, context, worker.new_request_id)
        self._client_ip = context.client_ip
        if self._redirect is not None:  # plain HTTP: admitted here, TLS in its listener
            self._release = worker.admit(context.client_ip)
            if self._release is None:
                self._closing = True
                transport.abort()
                return
        worker.connection_opened(self)

    def data_received(self, data: bytes) -> None:
        self.client_active_at = time.monotonic()
        self._dispatch_requests(self.reader.feed(data))  # type: ignore[union-attr]
        self._update_state()

    def eof_received(self) -> bool:
        """The client closed its sending side (a TCP FIN, with or without a
        close_notify): keep ours open while responses are on their way, as
        HAProxy does without ``abortonclose``; ``_on_client_closed`` closes
        when there is nothing left to send."""
        self._dispatch_requests(self.reader.feed_eof())  # type: ignore[union-attr]
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()
        self._closing = True
        self._stop_waiting_for_tunnel()
        upstream, self.upstream = self.upstream, None
        if upstream is not None and upstream.stream is not None:
            upstream.stream.abort(self._stream_end_code(upstream))
        self._settle(final=True)
        for request in self.pending:  # the client left before its response was sent
            request.outcome = "client_closed"
            self.worker.log_request(self, request, sent=self._sent_for(request))
        self.pending.clear()
        self.worker.connection_closed(self)

    def pause_writing(self) -> None:
        self.response_paused = True
        upstream = self.upstream
        if upstream is not None and upstream.stream is not None:
            upstream.stream.pause_reading()

    def resume_writing(self) -> None:
        self.response_paused = False
        self.upstream_active_at = time.monotonic()  # the wait was the client's
        upstream = self.upstream
        if upstream is not None and upstream.stream is not None:
            upstream.stream.resume_reading()

    def _pause_client_reading(self) -> None:
        if not self._client_paused and self.transport is not None:
            self._client_paused = True
            self.transport.pause_reading()

    def _resume_client_reading(self) -> None:
        if self._client_paused and self.transport is not None:
            self._client_paused = False
            self.transport.resume_reading()

    def _dispatch_requests(self, events: list) -> None:
        if self._held_events is not None:  # waiting for a tunnel: keep the order
            self._held_events.extend(events)
            return
        for index, event in enumerate(events):
            if self._held_events is not None:
                self._held_events.extend(events[index:])
                return
            kind = type(event)
            if kind is RequestBodyReceived or kind is TunnelBytes:
                self._send_up(event.data)
            elif kind is RequestHeadReceived:
                self._on_request_head(event)
            elif kind is RequestRejected:
                self._reject(event.status, event.reason, event.mid_request)
            elif kind is ClientClosed:
                self._on_client_closed()

    def _on_request_head(self, head: RequestHeadReceived) -> None:
        worker = self.worker
        if worker.draining:
            self._reject(503, "edge is draining")
            return
        if not worker.request_rate.allow(self._client_ip, self.client_active_at):
            self._reject(429, "request rate limit")
            return
        path = head.target.decode("latin-1")
        if self._redirect is not None and not path.startswith(self._redirect.pass_through_prefixes):
            self._redirect_to_https(head.host, path)
            return
        ws = head.websocket_upgrade
        request = PendingRequest(
            method=head.method.decode("latin-1"),
            path=path,
            host=head.host,
            request_id=head.request_id,
            started=time.monotonic(),
            replay=head.head if head.replayable else None,
            websocket_key=ws.key if ws is not None else None,
            keep_alive=head.keep_alive,
        )
        if self.upstream is None and not self._open_stream(head.host, head.request_id):
            self._wait_for_tunnel(head)
            return
        self.pending.append(request)
        self.upstream.reader.expect(head.method, request.websocket_key)  # type: ignore[union-attr]
        self._send_up(head.head)

    def _redirect_to_https(self, host: str | None, path: str) -> None:
        assert self._redirect is not None
        location = https_location(host, path, self._redirect.https_port)
        if location is None:
            self._reject(400, "cannot redirect without Host and an origin-form target")
            return
        request = self._edge_request(301, "redirected to HTTPS", "redirected", head_host=host)
        request.path = path
        self._answer_with(request, redirect_response(location))

    def _open_stream(self, host: str | None, request_id: str) -> bool:
        assert self.metadata is not None
        if self._encoded_metadata is None:  # once per connection: addresses, TLS facts
            self._encoded_metadata = self.metadata.encode()
        metadata = self._encoded_metadata + encode_request_fields(host, request_id)
        upstream = Upstream(self, self.worker.http_limits)
        try:
            self.worker.open_stream(metadata, lambda: upstream)
        except (ConnectionError, MuxError) as exc:
            log.debug("no tunnel for %s: %s", _peer_text(self.metadata), exc)
            return False
        self.upstream = upstream
        return True

    # -- waiting for a tunnel ------------------------------------------------------

    def _wait_for_tunnel(self, head: RequestHeadReceived) -> None:
        """No usable tunnel: hold this request and everything after it, stop
        reading the client, and retry when a tunnel comes up (or 503 at the
        bound). The head is re-dispatched as it came."""
        worker = self.worker
        self._held_events = [head]
        self._pause_client_reading()
        if self._tunnel_wait is None:  # the bound runs from the first wait
            if worker.draining or not worker.wait_for_tunnel(self):
                self._no_tunnel(head)
                return
            self._tunnel_wait = asyncio.get_running_loop().call_later(
                worker.config.http.tunnel_wait_s, self._tunnel_wait_expired
            )
        elif not worker.wait_for_tunnel(self):
            self._no_tunnel(head)

    def tunnel_ready(self) -> None:
        """Called by the worker when a tunnel connection became usable."""
        events, self._held_events = self._held_events, None
        if events is None or self._closing:
            return
        self._dispatch_requests(events)
        if self._held_events is None:  # every held event went up (or was answered)
            self._stop_waiting_for_tunnel()
            self._resume_client_reading()
        self._update_state()

    def _tunnel_wait_expired(self) -> None:
        self._tunnel_wait = None
        events = self._held_events
        if events:
            self.worker.stop_waiting_for_tunnel(self)
            self._no_tunnel(events[0])

    def _no_tunnel(self, head: RequestHeadReceived) -> None:
        self._held_events = None
        self.worker.count_error("no_tunnel")
        throttled.warning("no tunnel to any origin for %s", _peer_text(self.metadata))
        request = PendingRequest(
            method=head.method.decode("latin-1"),
            path=head.target.decode("latin-1"),
            host=head.host,
            request_id=head.request_id,
            started=time.monotonic(),
            replay=None,
            websocket_key=None,
            outcome="no_tunnel",
        )
        self._answer_and_close(request, 503, "no tunnel to the origin")

    def _stop_waiting_for_tunnel(self) -> None:
        if self._tunnel_wait is not None:
            self._tunnel_wait.cancel()
            self._tunnel_wait = None
            self.worker.stop_waiting_for_tunnel(self)

    def _send_up(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is None or upstream.stream is None or not data:
            return
        if self.pending:
            self.pending[-1].bytes_in += len(data)
        upstream.stream.write(data)

    def _on_client_closed(self) -> None:
        self._client_eof = True
        if self.phase is Phase.TUNNEL:
            upstream = self.upstream
            if upstream is not None and upstream.stream is not None:
                upstream.stream.write_eof()  # half-close travels through the tunnel
        elif not self.pending:
            self._close()
        # else: close once the outstanding responses are written (_response_done)

    def _reject(self, status: int, reason: str, mid_request: bool = False) -> None:
        self.worker.count_error(f"http_{status}")
        if mid_request:
            self._reject_mid_request(status, reason)
            return
        request = self._edge_request(status, reason, "rejected")
        if self.pending:  # answer after the responses already on their way
            self._reject_after = request
            self._pause_client_reading()
            return
        self._answer_with(request, error_response(status))

    def _edge_request(
        self, status: int, reason: str, outcome: str, head_host: str | None = None
    ) -> PendingRequest:
        """The record of something the edge answers itself (no head went up)."""
        return PendingRequest(
            method="",
            path="",
            host=head_host,
            request_id="",
            started=time.monotonic(),
            replay=None,
            websocket_key=None,
            status=status,
            outcome=outcome,
            reason=reason,
        )

    def _answer_with(self, request: PendingRequest, data: bytes) -> None:
        """Write the edge's own answer to ``request``, log it once sent, close."""
        data = self._own(data)
        request.out_start = self._queued
        request.bytes_out = len(data)
        self._write(data)
        self._request_done(request)
        self._close()

    def _reject_mid_request(self, status: int, reason: str) -> None:
        """The request whose head went up broke the rules in its body (or behind
        its WebSocket handshake): reset its stream at once, so the backend
        connection is not reused and nobody waits for a response that cannot
        come, and answer now, or close when responses to earlier pipelined
        requests were still on that stream (they are lost with it)."""
        request = self.pending.pop() if self.pending else None
        upstream, self.upstream = self.upstream, None
        if upstream is not None and upstream.stream is not None:
            upstream.stream.abort(ErrorCode.CANCEL)
        if request is None:
            self._answer_with(
                self._edge_request(status, reason, "rejected"), error_response(status)
            )
            return
        request.outcome = "rejected"
        request.reason = reason
        if self.pending or request.answered:
            request.status = request.status or status
            self.pending.append(request)
            self._abort_client("request rejected mid-body", "rejected")
        else:
            self._answer_and_close(request, status, None)

    def _answer_and_close(self, request: PendingRequest, status: int, reason: str | None) -> None:
        """The edge answers ``request`` itself (nothing of another response went
        out for it) and closes once that answer is sent."""
        body = None if reason is None else f"{status} {reason}\n"
        request.status = status
        self._answer_with(
            request, error_response(status, body=body, request_id=request.request_id or None)
        )

    # -- upstream side -------------------------------------------------------------

    def _upstream_data(self, upstream: Upstream, data: bytes) -> None:
        if upstream is not self.upstream:
            return
        self.upstream_active_at = time.monotonic()
        # Everything one upstream read produces (a response head and its body,
        # several pipelined responses) goes to the client in one write: one TLS
        # record and one send instead of one per event (the client's transport
        # write was 23% of a keep-alive request before).
        self._batch = []
        try:
            for event in upstream.reader.feed(data):
                self._on_response_event(upstream, event)
        finally:
            self._flush_batch()
        self._update_state()

    def _on_response_event(self, upstream: Upstream, event: object) -> None:
        kind = type(event)
        if kind is ResponseBodyReceived or kind is TunnelBytes:
            self._write_response_bytes(event.data)  # type: ignore[attr-defined]
        elif kind is ResponseHeadReceived:
            self._on_response_head(event)  # type: ignore[arg-type]
        elif kind is ResponseCompleted:
            self._response_done(close=event.close_after)  # type: ignore[attr-defined]
        elif kind is WebSocketAccepted:
            held = self.reader.upgrade_accepted()  # type: ignore[union-attr]
            self.phase = Phase.TUNNEL
            if self.pending:
                self.pending[0].status = 101
                self._request_done(self.pending.popleft())
            if held:
                self._send_up(held)
        elif kind is WebSocketRefused:
            self._fail_upstream(
                502, "backend answered the upgrade with a bad handshake", "upstream_invalid"
            )
        elif kind is ResponseInvalid:
            reason = f"invalid response from backend: {event.reason}"  # type: ignore[attr-defined]
            self._fail_upstream(502, reason, "upstream_invalid")
        elif kind is BackendClosed:
            self._on_backend_closed(upstream, event)  # type: ignore[arg-type]

    def _own(self, response: bytes) -> bytes:
        """A response head with the fields the edge adds to every final HTTPS one."""
        return response if self._hsts is None else with_field(response, self._hsts)

    def _on_response_head(self, head: ResponseHeadReceived) -> None:
        data = head.head if head.status < 200 else self._own(head.head)
        if self.pending:
            request = self.pending[0]
            if not request.first_byte:
                request.first_byte = time.monotonic()
            if not head.informational:
                request.status = head.status
            if request.websocket_key is not None and head.status != 101 and head.status >= 200:
                self._dispatch_requests(self.reader.upgrade_refused())  # type: ignore[union-attr]
            if not request.keep_alive and head.status >= 200 and head.status != 101:
                self._write_response_bytes(closing_head(data))
                return
        self._write_response_bytes(data)

    def _write_response_bytes(self, data: bytes) -> None:
        if self.pending:
            request = self.pending[0]
            if request.out_start < 0:
                request.out_start = self._queued
            request.bytes_out += len(data)
        self._write(data)

    def _response_done(self, *, close: bool) -> None:
        request = self.pending.popleft() if self.pending else None
        if request is not None:
            self._request_done(request)
        if close and self.upstream is not None:
            self._finish_stream()
        if self.pending:
            return
        if self._reject_after is not None:
            rejected, self._reject_after = self._reject_after, None
            self._answer_with(rejected, error_response(rejected.status))
        elif (
            (request is not None and not request.keep_alive)
            or self._client_eof
            or self.worker.draining
        ):
            self._close()

    def _on_backend_closed(self, upstream: Upstream, event: BackendClosed) -> None:
        if event.mid_response:
            self._abort_client("backend closed mid-response", "upstream_closed")
        elif event.before_response:
            self._replay_or_fail(502, "backend closed before responding", "upstream_closed")
        else:
            self._finish_stream()  # Node's keep-alive timeout: next request, new stream

    def _upstream_eof(self, upstream: Upstream) -> None:
        if upstream is not self.upstream:
            return
        if self.phase is Phase.TUNNEL:
            if self.transport is not None and self.transport.can_write_eof():
                self.transport.write_eof()
            self._close()
            return
        for event in upstream.reader.feed_eof():
            self._on_response_event(upstream, event)
        self._update_state()

    def _upstream_lost(self, upstream: Upstream, exc: Exception | None) -> None:
        if upstream is not self.upstream:
            return
        self.upstream = None
        if exc is None or self._closing:
            if self.phase is Phase.TUNNEL or self.pending:
                self._close()
            return
        code = exc.code if isinstance(exc, StreamResetError) else ErrorCode.INTERNAL_ERROR
        reason = f"stream reset: {ErrorCode.name_of(code)}"
        if self.phase is Phase.TUNNEL:
            self._abort_client(f"upgraded {reason}", "upstream_reset")
        elif not self.pending:
            return  # between requests: the next request takes a fresh stream
        elif not self.pending[0].answered:
            # Nothing of the response went out: replay an idempotent request (RFC
            # 9110 §9.2.2: the origin or its tunnel failed, not the request), or
            # answer. NO_BACKEND is the origin's considered answer: not replayed.
            status = 503 if code == ErrorCode.NO_BACKEND else 502
            if code == ErrorCode.NO_BACKEND:
                self._fail_upstream(status, reason, "no_backend")
            else:
                self._replay_or_fail(status, reason, "upstream_reset")
        else:
            self._abort_client(f"{reason} mid-response", "upstream_reset")

    def _replay_or_fail(self, status: int, reason: str, outcome: str) -> bool:
        """Replay the outstanding requests on a fresh stream if every one of them
        is replayable and none was replayed yet; else answer ``status``."""
        requests = list(self.pending)
        if requests and all(r.replay is not None and not r.retried for r in requests):
            old = self.upstream
            self.upstream = None
            if old is not None and old.stream is not None:
                old.stream.abort(ErrorCode.CANCEL)
            if self._open_stream(requests[0].host, requests[0].request_id):
                self.worker.count_error("replayed")
                for request in requests:
                    request.retried = True
                    self.upstream.reader.expect(request.method.encode(), None)  # type: ignore[union-attr]
                    self.upstream.stream.write(request.replay)  # type: ignore[union-attr, arg-type]
                return True
        self._fail_upstream(status, reason, outcome)
        return False

    def _fail_upstream(self, status: int, reason: str, outcome: str) -> None:
        self.worker.count_error("upstream")
        throttled.warning("upstream failure for %s: %s", _peer_text(self.metadata), reason)
        request = self.pending[0] if self.pending else None
        if request is not None and not request.answered:
            self.pending.popleft()
            request.outcome = outcome
            request.reason = reason
            for later in self.pending:  # pipelined behind it: never sent an answer
                later.outcome = "not_sent"
                self._request_done(later)
            self.pending.clear()
            self._answer_and_close(request, status, "bad gateway" if status == 502 else reason)
        else:
            self._abort_client(reason, outcome)

    def _finish_stream(self) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is not None and upstream.stream is not None:
            upstream.stream.close()
        if self.pending:  # pipelined requests the backend will not answer
            self.upstream = upstream
            self._replay_or_fail(502, "backend closed with requests outstanding", "upstream_closed")

    # -- shared ----------------------------------------------------------------------

    def _update_state(self) -> None:
        """The phase the deadlines apply to (edge.deadlines)."""
        reader = self.reader
        if self.phase is Phase.TUNNEL or reader is None:
            return
        if self.pending or self._held_events is not None:
            phase = Phase.SENDING if reader.in_body else Phase.WAITING
        elif reader.in_head:
            phase = Phase.HEAD
        else:
            phase = Phase.IDLE
        if phase is not self.phase:
            now = time.monotonic()
            if phase is Phase.WAITING and self.phase is not Phase.WAITING:
                self.upstream_active_at = now  # the wait for a response starts
            self.phase = phase
            self.phase_since = now

    @property
    def awaited_path(self) -> str:
        return self.pending[0].path if self.pending else ""

    def _write(self, data: bytes) -> None:
        if self._closing:
            return
        self._queued += len(data)
        if self._batch is not None:
            self._batch.append(data)
        elif self.transport is not None:
            self.transport.write(data)

    def _flush_batch(self) -> None:
        batch, self._batch = self._batch, None
        if batch and self.transport is not None and not self._closing:
            self.transport.write(batch[0] if len(batch) == 1 else b"".join(batch))
        if self._unflushed:
            self._when_flushed()

    # -- the access log: what the client was sent ---------------------------------------

    def _sent(self) -> int:
        """Octets of this connection's output that reached the kernel."""
        transport = self.transport
        if transport is None:
            return 0
        sent = getattr(transport, "bytes_sent", None)
        if sent is None:  # a plain socket transport: what it no longer holds
            sent = self._queued - transport.get_write_buffer_size()
        return sent  # type: ignore[no-any-return]

    def _sent_for(self, request: PendingRequest) -> int:
        if not request.answered:
            return 0
        return max(0, min(self._sent() - request.out_start, request.bytes_out))

    def _request_done(self, request: PendingRequest) -> None:
        """Its response is complete here; log it once it is out of our hands."""
        self._unflushed.append(request)
        if self._batch is None:
            self._when_flushed()

    def _when_flushed(self) -> None:
        transport = self.transport
        when_flushed = getattr(transport, "call_when_flushed", None)
        if when_flushed is None:
            self._settle(final=True)
        else:
            when_flushed(self._settle)

    def _settle(self, *, final: bool = False) -> None:
        """Log the complete requests whose every octet reached the kernel; with
        ``final`` (the connection is gone, or cannot tell) all of them, with
        what got out."""
        unflushed = self._unflushed
        if not unflushed:
            return
        sent = self._sent()
        while unflushed:
            request = unflushed[0]
            end = request.out_start + request.bytes_out if request.answered else 0
            if sent < end and not final:
                break
            unflushed.popleft()
            got_out = self._sent_for(request)
            if got_out < request.bytes_out and request.outcome == "ok":
                request.outcome = "client_closed"
            self.worker.log_request(self, request, sent=got_out)

    def _abort_client(self, reason: str, outcome: str) -> None:
        """A response cannot be completed (its start already went out): close the
        connection without close_notify, so the client sees it was cut."""
        throttled.info("closing %s: %s", _peer_text(self.metadata), reason)
        for request in self.pending:
            if request.outcome == "ok":
                request.outcome = outcome if request.answered else "not_sent"
                request.reason = request.reason or reason
            if not request.answered and not request.status:
                request.status = 502
        self._unflushed.extend(self.pending)
        self.pending.clear()
        self._closing = True
        if self.transport is not None:
            self.transport.abort()

    def _close(self) -> None:
        if self._closing:
            return
        self._flush_batch()
        self._closing = True
        upstream, self.upstream = self.upstream, None
        if upstream is not None and upstream.stream is not None:
            if self.phase is Phase.TUNNEL:
                upstream.stream.close()
            else:
                upstream.stream.abort(self._stream_end_code(upstream))
        if self.transport is not None:
            self.transport.close()

    def _stream_end_code(self, upstream: Upstream) -> ErrorCode:
        """IDLE when the stream stops between exchanges, so that the origin may keep
        the backend connection for another stream (PROTOCOL.md §6.5.1): every
        request went up whole and was answered in full, the backend kept the
        connection alive (its response said so), and nothing is still queued on
        the stream. Otherwise CANCEL (always for an upgraded stream: its reader
        is not between requests)."""
        if (
            not self.pending
            and self.reader is not None
            and self.reader.between_requests
            and upstream.reader.at_boundary
            and upstream.stream.get_write_buffer_size() == 0  # type: ignore[union-attr]
        ):
            return ErrorCode.IDLE
        return ErrorCode.CANCEL

    def close_idle(self, reason: str) -> None:
        """Close between exchanges (drain, and its deadline for the rest)."""
        log.debug("closing %s: %s", _peer_text(self.metadata), reason)
        self._close()

    def time_out(self, missed: Missed) -> None:
        """The sweep found a missed deadline (edge.deadlines)."""
        self.worker.count_error(missed.name.lower() + "_timeout")
        if missed is Missed.HEADER:
            self._reject(408, missed.value)
        elif missed is Missed.BODY:
            self._reject(408, missed.value, mid_request=True)
        elif missed is Missed.RESPONSE:
            throttled.warning("%s for %s", missed.value, _peer_text(self.metadata))
            request = self.pending[0] if self.pending else None
            if request is not None and not request.answered:
                upstream, self.upstream = self.upstream, None
                if upstream is not None and upstream.stream is not None:
                    upstream.stream.abort(ErrorCode.CANCEL)
                self._fail_upstream(504, missed.value, "upstream_timeout")
            else:
                self._abort_client(missed.value, "upstream_timeout")
        else:
            log.debug("closing %s: %s", _peer_text(self.metadata), missed.value)
            self._close()


def _peer_text(metadata: StreamMetadata | None) -> str:
    if metadata is None or metadata.client_address is None:
        return "?"
    host, port = metadata.client_address
    return f"{host}:{port}"
