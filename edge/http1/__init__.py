"""The edge's sans-I/O HTTP/1.1 layer, on httptools (llhttp).

Client bytes go into a :class:`RequestReader`, which validates each request,
rewrites its head (forwarding fields, hop-by-hop fields, normalised framing)
and streams its body; backend bytes go into a :class:`ResponseReader`, which
finds where each response ends and checks WebSocket switches, forwarding the
bytes untouched. Both return frozen event objects and never raise on bad
input. Nothing here performs I/O or imports asyncio, socket or ssl
(``tests/unit/test_http1_request.py`` enforces it).

Modules: :mod:`.limits` (configuration), :mod:`.events`, :mod:`.errors`,
:mod:`.syntax` (hand-rolled number and list parsing), :mod:`.head` (one head
through llhttp, bounded), :mod:`.chunked` (chunked framing),
:mod:`.request_head` (the request rewrite rules), :mod:`.request`,
:mod:`.response`, :mod:`.websocket`, :mod:`.canned` (responses the edge writes).
"""

from edge.http1.canned import (
    error_response,
    https_location,
    readiness_response,
    redirect_response,
    text_response,
)
from edge.http1.errors import Http1Error, Http1UsageError
from edge.http1.events import (
    BackendClosed,
    ClientClosed,
    RequestBodyReceived,
    RequestCompleted,
    RequestEvent,
    RequestHeadReceived,
    RequestRejected,
    ResponseBodyReceived,
    ResponseCompleted,
    ResponseEvent,
    ResponseHeadReceived,
    ResponseInvalid,
    TunnelBytes,
    WebSocketAccepted,
    WebSocketRefused,
    WebSocketUpgrade,
)
from edge.http1.limits import ClientContext, HttpLimits
from edge.http1.request import RequestReader
from edge.http1.response import (
    ResponseReader,
    client_head,
    closing_head,
    reusable_head,
    with_field,
    with_fields,
)
from edge.http1.websocket import websocket_accept

__all__ = [
    "BackendClosed",
    "ClientClosed",
    "ClientContext",
    "Http1Error",
    "Http1UsageError",
    "HttpLimits",
    "RequestBodyReceived",
    "RequestCompleted",
    "RequestEvent",
    "RequestHeadReceived",
    "RequestReader",
    "RequestRejected",
    "ResponseBodyReceived",
    "ResponseCompleted",
    "ResponseEvent",
    "ResponseHeadReceived",
    "ResponseInvalid",
    "ResponseReader",
    "TunnelBytes",
    "WebSocketAccepted",
    "WebSocketRefused",
    "WebSocketUpgrade",
    "client_head",
    "closing_head",
    "error_response",
    "https_location",
    "readiness_response",
    "redirect_response",
    "reusable_head",
    "text_response",
    "websocket_accept",
    "with_field",
    "with_fields",
]
