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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

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
)
from edge.upstream import PendingRequest, Upstream, peer_address, stream_metadata
from tunnel.aio.stream import StreamResetError
from tunnel.mux import ErrorCode, StreamMetadata
from tunnel.mux.errors import MuxError
from tunnel.mux.metadata import encode_request_fields

if TYPE_CHECKING:
    from edge.config import RedirectListenerConfig
    from edge.worker import EdgeWorker

log = logging.getLogger("geoedge.edge")

#: Stream resets that mean "nothing reached a backend": safe to replay.
_NOT_PROCESSED = frozenset({ErrorCode.REFUSED_STREAM, ErrorCode.CONNECT_FAILED})

_HEAD, _IDLE, _BUSY, _TUNNEL = "head", "idle", "busy", "tunnel"


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
        self.transport: asyncio.Transport | None = None
        self.reader: RequestReader | None = None
        self.upstream: Upstream | None = None
        self.pending: deque[PendingRequest] = deque()
        self.metadata: StreamMetadata | None = None
        self._encoded_metadata: bytes | None = None
        self.state = _IDLE
        self.last_activity = time.monotonic()
        self._client_paused = False
        self._closing = False
        self._reject_after: bytes | None = None
        self._client_eof = False
        self._batch: list[bytes] | None = None

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
        worker.connection_opened(self)

    def data_received(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        self._dispatch_requests(self.reader.feed(data))  # type: ignore[union-attr]
        self._update_state()

    def eof_received(self) -> bool | None:
        self._dispatch_requests(self.reader.feed_eof())  # type: ignore[union-attr]
        # Plain TCP: keep our side open, responses may still be on their way.
        # TLS has no half-close (asyncio warns if we ask for it).
        if self.transport is not None and self.transport.get_extra_info("ssl_object") is None:
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        upstream, self.upstream = self.upstream, None
        if upstream is not None and upstream.stream is not None:
            upstream.stream.abort(self._stream_end_code(upstream))
        self.worker.connection_closed(self)

    def pause_writing(self) -> None:
        upstream = self.upstream
        if upstream is not None and upstream.stream is not None:
            upstream.stream.pause_reading()

    def resume_writing(self) -> None:
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
        for event in events:
            kind = type(event)
            if kind is RequestBodyReceived or kind is TunnelBytes:
                self._send_up(event.data)
            elif kind is RequestHeadReceived:
                self._on_request_head(event)
            elif kind is RequestRejected:
                self._reject(event.status, event.reason)
            elif kind is ClientClosed:
                self._on_client_closed()

    def _on_request_head(self, head: RequestHeadReceived) -> None:
        worker = self.worker
        if worker.draining:
            self._reject(503, "edge is draining")
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
            self._answer_and_close(request, 503 if worker.draining else 502, "no usable tunnel")
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
        self._write(redirect_response(location))
        self.worker.log_rejected(self, 301)
        self._close()

    def _open_stream(self, host: str | None, request_id: str) -> bool:
        assert self.metadata is not None
        if self._encoded_metadata is None:  # once per connection: addresses, TLS facts
            self._encoded_metadata = self.metadata.encode()
        metadata = self._encoded_metadata + encode_request_fields(host, request_id)
        upstream = Upstream(self, self.worker.http_limits)
        try:
            self.worker.open_stream(metadata, lambda: upstream)
        except (ConnectionError, MuxError) as exc:
            log.warning("no tunnel for %s: %s", _peer_text(self.metadata), exc)
            self.worker.count_error("no_tunnel")
            return False
        self.upstream = upstream
        return True

    def _send_up(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is None or upstream.stream is None or not data:
            return
        if self.pending:
            self.pending[-1].bytes_in += len(data)
        upstream.stream.write(data)

    def _on_client_closed(self) -> None:
        self._client_eof = True
        if self.state == _TUNNEL:
            upstream = self.upstream
            if upstream is not None and upstream.stream is not None:
                upstream.stream.write_eof()  # half-close travels through the tunnel
        elif not self.pending:
            self._close()
        # else: close once the outstanding responses are written (_response_done)

    def _reject(self, status: int, reason: str) -> None:
        log.info("rejected request from %s: %d %s", _peer_text(self.metadata), status, reason)
        self.worker.count_error(f"http_{status}")
        if self.pending:  # answer after the responses already on their way
            self._reject_after = error_response(status)
            self._pause_client_reading()
            return
        self._write(error_response(status))
        self.worker.log_rejected(self, status)
        self._close()

    def _answer_and_close(self, request: PendingRequest, status: int, reason: str) -> None:
        body = f"{status} {reason}\n"
        self._write(error_response(status, body=body, request_id=request.request_id))
        request.status = status
        self.worker.log_request(self, request, status_source="edge")
        self._close()

    # -- upstream side -------------------------------------------------------------

    def _upstream_data(self, upstream: Upstream, data: bytes) -> None:
        if upstream is not self.upstream:
            return
        self.last_activity = time.monotonic()
        upstream.responded = True
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
            self.state = _TUNNEL
            if self.pending:
                self.pending[0].status = 101
                self.worker.log_request(self, self.pending.popleft())
            if held:
                self._send_up(held)
        elif kind is WebSocketRefused:
            self._fail_upstream(502, "backend answered the upgrade with a bad handshake")
        elif kind is ResponseInvalid:
            self._fail_upstream(502, f"invalid response from backend: {event.reason}")  # type: ignore[attr-defined]
        elif kind is BackendClosed:
            self._on_backend_closed(upstream, event)  # type: ignore[arg-type]

    def _on_response_head(self, head: ResponseHeadReceived) -> None:
        if self.pending:
            request = self.pending[0]
            if not request.first_byte:
                request.first_byte = time.monotonic()
            if not head.informational:
                request.status = head.status
            if request.websocket_key is not None and head.status != 101 and head.status >= 200:
                self._dispatch_requests(self.reader.upgrade_refused())  # type: ignore[union-attr]
            if not request.keep_alive and head.status >= 200 and head.status != 101:
                self._write_response_bytes(closing_head(head.head))
                return
        self._write_response_bytes(head.head)

    def _write_response_bytes(self, data: bytes) -> None:
        if self.pending:
            self.pending[0].bytes_out += len(data)
        self._write(data)

    def _response_done(self, *, close: bool) -> None:
        request = self.pending.popleft() if self.pending else None
        if request is not None:
            self.worker.log_request(self, request)
        if close and self.upstream is not None:
            self._finish_stream()
        if self.pending:
            return
        if self._reject_after is not None:
            self._write(self._reject_after)
            self._close()
        elif (
            (request is not None and not request.keep_alive)
            or self._client_eof
            or self.worker.draining
        ):
            self._close()

    def _on_backend_closed(self, upstream: Upstream, event: BackendClosed) -> None:
        if event.mid_response:
            self._abort_client("backend closed mid-response")
        elif event.before_response:
            self._replay_or_fail(502, "backend closed before responding")
        else:
            self._finish_stream()  # Node's keep-alive timeout: next request, new stream

    def _upstream_eof(self, upstream: Upstream) -> None:
        if upstream is not self.upstream:
            return
        if self.state == _TUNNEL:
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
            if self.state == _TUNNEL or self.pending:
                self._close()
            return
        code = exc.code if isinstance(exc, StreamResetError) else ErrorCode.INTERNAL_ERROR
        if not upstream.responded and self.pending:
            if code in _NOT_PROCESSED and self._replay_or_fail(None, ""):
                return
            status = 503 if code == ErrorCode.NO_BACKEND else 502
            self._fail_upstream(status, f"stream reset: {ErrorCode.name_of(code)}")
        else:
            self._abort_client(f"stream reset mid-response: {ErrorCode.name_of(code)}")

    def _replay_or_fail(self, status: int | None, reason: str) -> bool:
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
        if status is not None:
            self._fail_upstream(status, reason)
        return False

    def _fail_upstream(self, status: int, reason: str) -> None:
        log.warning("upstream failure for %s: %s", _peer_text(self.metadata), reason)
        self.worker.count_error("upstream")
        request = self.pending[0] if self.pending else None
        if request is not None and request.status == 0 and request.bytes_out == 0:
            self._answer_and_close(request, status, "bad gateway" if status == 502 else reason)
        else:
            self._abort_client(reason)

    def _finish_stream(self) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is not None and upstream.stream is not None:
            upstream.stream.close()
        if self.pending:  # pipelined requests the backend will not answer
            self.upstream = upstream
            self._replay_or_fail(502, "backend closed with requests outstanding")

    # -- shared ----------------------------------------------------------------------

    def _update_state(self) -> None:
        reader = self.reader
        if self.state == _TUNNEL or reader is None:
            return
        if self.pending:
            self.state = _BUSY
        elif reader.in_head:
            if self.state != _HEAD:
                self.state = _HEAD
                self.last_activity = time.monotonic()
        else:
            self.state = _IDLE

    def _write(self, data: bytes) -> None:
        if self._batch is not None:
            self._batch.append(data)
        elif self.transport is not None and not self._closing:
            self.transport.write(data)

    def _flush_batch(self) -> None:
        batch, self._batch = self._batch, None
        if batch and self.transport is not None and not self._closing:
            self.transport.write(batch[0] if len(batch) == 1 else b"".join(batch))

    def _abort_client(self, reason: str) -> None:
        log.info("closing %s: %s", _peer_text(self.metadata), reason)
        for request in self.pending:
            self.worker.log_request(self, request, status_source="aborted")
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
            if self.state == _TUNNEL:
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
        """Called by the worker's sweeper (timeouts) and on drain."""
        if self.state == _HEAD and reason == "header timeout":
            self._write(error_response(408))
        log.debug("closing %s: %s", _peer_text(self.metadata), reason)
        self._close()


def _peer_text(metadata: StreamMetadata | None) -> str:
    if metadata is None or metadata.client_address is None:
        return "?"
    host, port = metadata.client_address
    return f"{host}:{port}"
