"""Events of the HTTP/1.1 readers, named in the past tense (STYLE.md §5).

Slotted dataclasses, immutable by convention rather than ``frozen=True``:
a frozen dataclass sets each field through ``object.__setattr__``, 1.04 us for
a 14-field event against 0.17 us (timeit, this machine), and these are made
several times per request on the edge's hot path (~2 us per keep-alive
request in ``make bench-edge``). Nothing mutates an event after creation.

Header names in ``headers`` tuples are lowercased (as in h11); the ``head``
bytes keep the sender's spelling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

Headers = tuple[tuple[bytes, bytes], ...]


@dataclass(slots=True)
class WebSocketUpgrade:
    """A valid RFC 6455 opening handshake: what the response check needs."""

    method: bytes
    key: bytes


# Request side (client → edge) -------------------------------------------------------


class ForwardedHeadMaker(Protocol):
    """Makes a request's forwarded head (:mod:`edge.http1.request_head`)."""

    def forwarded(self, request: RequestHeadReceived) -> tuple[bytes, Headers]:
        """``(head, headers)``: the head to send up and its fields, lowercase."""
        ...


class RequestHeadReceived:
    """A request head arrived, was validated and rewritten.

    ``head`` is what to forward: request line, rewritten headers, CRLFCRLF;
    ``headers`` its fields. ``client_fields`` are the client's own fields that
    go on (lowercase names, after the hop-by-hop rules), without the ones the
    edge sets (framing, forwarding, request id, trace context): what a cache
    hit needs, which never goes up. ``head`` and ``headers`` are made on first
    use, once: a hit answered at the edge skips the rewrite (15% of a hit's
    instructions, ``make bench-edge-logic``'s ``h1_hit``). ``trace_id`` is the W3C
    trace id the request carries up (kept or started by the edge).

    ``replayable`` is true when ``head`` alone is the whole request (no body)
    and the method is idempotent, so the edge may resend it once on a fresh
    stream if the backend closes before any response byte (RFC 9110 §9.2.2).

    Invariant: ``headers`` is ``client_fields`` followed by the fields the
    edge set, in the order of ``head``.
    """

    __slots__ = (
        "_forwarded",
        "_head",
        "_headers",
        "chunked",
        "client_fields",
        "content_length",
        "expects_body",
        "host",
        "http_version",
        "idempotent",
        "keep_alive",
        "method",
        "replayable",
        "request_id",
        "target",
        "trace_id",
        "websocket_upgrade",
    )

    def __init__(
        self,
        *,
        method: bytes,
        target: bytes,
        http_version: bytes,
        client_fields: Headers,
        forwarded: ForwardedHeadMaker,
        host: str | None,
        request_id: str,
        trace_id: str,
        keep_alive: bool,
        websocket_upgrade: WebSocketUpgrade | None,
        idempotent: bool,
        expects_body: bool,
        replayable: bool,
        content_length: int | None,
        chunked: bool,
    ) -> None:
        self.method = method
        self.target = target
        self.http_version = http_version
        self.client_fields = client_fields
        self.host = host
        self.request_id = request_id
        self.trace_id = trace_id
        self.keep_alive = keep_alive
        self.websocket_upgrade = websocket_upgrade
        self.idempotent = idempotent
        self.expects_body = expects_body
        self.replayable = replayable
        self.content_length = content_length
        self.chunked = chunked
        self._forwarded: ForwardedHeadMaker | None = forwarded
        self._head = b""
        self._headers: Headers = ()

    # (Each property makes the head itself: one Python call fewer per request.)
    @property
    def head(self) -> bytes:
        maker = self._forwarded
        if maker is not None:
            self._head, self._headers = maker.forwarded(self)
            self._forwarded = None
        return self._head

    @property
    def headers(self) -> Headers:
        maker = self._forwarded
        if maker is not None:
            self._head, self._headers = maker.forwarded(self)
            self._forwarded = None
        return self._headers

    def _fields(self) -> tuple[object, ...]:
        return (
            self.method, self.target, self.http_version, self.headers, self.head,
            self.client_fields, self.host, self.request_id, self.trace_id, self.keep_alive,
            self.websocket_upgrade, self.idempotent, self.expects_body, self.replayable,
            self.content_length, self.chunked,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if type(other) is not RequestHeadReceived:
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # as a dataclass with eq: unhashable

    def __repr__(self) -> str:
        return (
            f"RequestHeadReceived(method={self.method!r}, target={self.target!r}, "
            f"http_version={self.http_version!r}, head={self.head!r})"
        )


@dataclass(slots=True)
class RequestBodyReceived:
    """Body bytes to forward exactly as they must appear on the wire to the backend."""

    data: bytes


@dataclass(slots=True)
class RequestCompleted:
    """The current request (head and body) has been fully received."""


@dataclass(slots=True)
class RequestRejected:
    """The client broke HTTP/1.1; the edge answers ``status`` and closes.

    ``reason`` is for logs only: never send it to anyone. The reader is dead
    afterwards: ``feed`` ignores everything. ``mid_request``: the head of the
    request at fault already went up (its body, or the bytes held behind a
    WebSocket handshake, broke the rules), so its stream must be reset and no
    response to it be awaited.
    """

    status: int
    reason: str
    mid_request: bool = False


@dataclass(slots=True)
class ClientClosed:
    """The client closed its sending side between requests (or inside a tunnel)."""


@dataclass(slots=True)
class TunnelBytes:
    """After a WebSocket upgrade: raw bytes to pass through untouched."""

    data: bytes


RequestEvent = (
    RequestHeadReceived
    | RequestBodyReceived
    | RequestCompleted
    | RequestRejected
    | ClientClosed
    | TunnelBytes
)


# Response side (backend → edge) ----------------------------------------------------


class ResponseHeadReceived:
    """A response head arrived; forward ``head`` as it is (raw bytes).

    ``status < 200`` marks an interim response (100, 103...): forward it and
    keep waiting for the final one. ``content_length``/``chunked`` describe
    the headers; a HEAD, 204 or 304 response has no body whatever they say.
    ``close_delimited``: the body runs until the backend closes, so a client
    can only see where it ends if its own connection closes there too.
    ``nominated``: the fields the backend's ``Connection`` names (lowercase),
    but for its own options and the body's framing: about the backend
    connection, not forwarded (:func:`edge.http1.response.nominated_fields`).

    Built like a dataclass (keyword or positional fields in this order,
    equality by fields, unhashable) but written out, as
    :class:`RequestHeadReceived` is: one per response on the hot path, a
    typed class in the compiled build.
    """

    __slots__ = (
        "chunked",
        "close_delimited",
        "content_length",
        "head",
        "headers",
        "http_version",
        "keep_alive",
        "nominated",
        "reason",
        "status",
    )

    def __init__(
        self,
        status: int,
        reason: bytes,
        http_version: bytes,
        headers: Headers,
        head: bytes,
        keep_alive: bool,
        content_length: int | None,
        chunked: bool,
        close_delimited: bool = False,
        nominated: frozenset[bytes] = frozenset(),
    ) -> None:
        self.status = status
        self.reason = reason
        self.http_version = http_version
        self.headers = headers
        self.head = head
        self.keep_alive = keep_alive
        self.content_length = content_length
        self.chunked = chunked
        self.close_delimited = close_delimited
        self.nominated = nominated

    def _fields(self) -> tuple[object, ...]:
        return (
            self.status, self.reason, self.http_version, self.headers, self.head,
            self.keep_alive, self.content_length, self.chunked, self.close_delimited,
            self.nominated,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if type(other) is not ResponseHeadReceived:
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # as a dataclass with eq: unhashable

    def __repr__(self) -> str:
        return (
            f"ResponseHeadReceived(status={self.status!r}, reason={self.reason!r}, "
            f"keep_alive={self.keep_alive!r}, content_length={self.content_length!r}, "
            f"chunked={self.chunked!r}, close_delimited={self.close_delimited!r}, "
            f"head={self.head!r})"
        )

    @property
    def informational(self) -> bool:
        return self.status < 200

    @property
    def forwards_request_id(self) -> bool:
        """The head carries an ``X-Request-Id`` that reaches the client (not
        one its ``Connection`` names): the edge adds its own otherwise."""
        if b"x-request-id" in self.nominated:
            return False
        for name, _ in self.headers:  # noqa: SIM110  (any() of a generator: a call per field)
            if name == b"x-request-id":
                return True
        return False


@dataclass(slots=True)
class ResponseBodyReceived:
    """Raw response body bytes (chunk framing included): forward as they are."""

    data: bytes


@dataclass(slots=True)
class ResponseCompleted:
    """The final response ended. ``close_after``: the connection must close now
    (the response said so, or its body was delimited by the backend's EOF).
    ``trailers``: a decoded chunked body's trailer fields (lowercase names);
    empty otherwise, and always when the body passes through raw."""

    close_after: bool
    trailers: Headers = ()


@dataclass(slots=True)
class WebSocketAccepted:
    """A valid 101 answered a WebSocket upgrade: from now on, raw tunnel bytes."""


@dataclass(slots=True)
class WebSocketRefused:
    """A 101 whose handshake answer is wrong (missing/wrong ``Sec-WebSocket-Accept``,
    no ``Upgrade: websocket``). Nothing was forwarded: the edge must send 502 and
    close. The reader is dead afterwards."""

    status: int


@dataclass(slots=True)
class ResponseInvalid:
    """The backend broke HTTP/1.1. If a head was already forwarded the edge can
    only close; otherwise it sends 502 and closes. The reader is dead afterwards."""

    reason: str


@dataclass(slots=True)
class BackendClosed:
    """The backend closed its side.

    ``before_response``: a request was outstanding and not one byte of its
    response had arrived (an idempotent bodiless request may be replayed).
    ``mid_response``: a response had started and was not complete. Both false:
    a clean close after complete responses (Node.js closes idle keep-alive
    sockets after 5 s).
    """

    before_response: bool
    mid_response: bool


ResponseEvent = (
    ResponseHeadReceived
    | ResponseBodyReceived
    | ResponseCompleted
    | WebSocketAccepted
    | WebSocketRefused
    | ResponseInvalid
    | BackendClosed
    | TunnelBytes
)
