"""Responses the cache writes: response heads built from fields, and a stored
response served to one request (pure, but for the client calls at the end).

A front end takes a :class:`edge.http1.ResponseHeadReceived` whatever its
origin: the HTTP/1.1 one writes its raw ``head``, the HTTP/2 one its
``headers``. :func:`make_head` builds both from one list of fields, framed
as the caller says (a length, chunked, or until the connection closes).

:func:`stored_reply` decides what one request gets from a stored response
(RFC 9111 §4): a 304 when the client's own condition holds (§4.3.2), a 206
or a 416 for a range of it (§3.4), else the whole response — compressed
when the client accepts a coding and the response may be (its compressed
body made once and kept: :mod:`edge.cache.compress`), with ``Age``
(§5.1) and ``Cache-Status`` (RFC 9211). :func:`serve` hands it to the
exchange's client.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from edge.cache.compress import encoded_fields
from edge.cache.conditions import UNSATISFIABLE, byte_range, not_modified
from edge.cache.entry import PlainHead
from edge.http1 import ResponseHeadReceived

if TYPE_CHECKING:
    from edge.cache.entry import StoredResponse

__all__ = [
    "PlainHit",
    "Reply",
    "make_head",
    "plain_head",
    "plain_hit",
    "serve",
    "stored_reply",
    "with_vary",
]

Fields = Sequence[tuple[bytes, bytes]]

#: RFC 9110 §15.4.5: what a 304 carries of the stored response.
_304_FIELDS = frozenset(
    {b"cache-control", b"content-location", b"date", b"etag", b"expires", b"vary", b"last-modified"}
)
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


def make_head(
    status: int,
    reason: bytes,
    fields: Fields,
    *,
    length: int | None,
    chunked: bool = False,
) -> ResponseHeadReceived:
    """A final response head with ``fields`` (lowercase names, no framing
    fields among them) framed by ``length``, else ``chunked``, else by the
    connection's close."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason or b"-")]
    out = [(name, value) for name, value in fields if name not in _FRAMING]
    if length is not None and status != 304 and status >= 200 and status != 204:
        out.append((b"content-length", b"%d" % length))
    elif chunked:
        out.append((b"transfer-encoding", b"chunked"))
    lines += [name + b": " + value + b"\r\n" for name, value in out]
    lines.append(b"\r\n")
    return ResponseHeadReceived(
        status=status,
        reason=reason,
        http_version=b"1.1",
        headers=tuple(out),
        head=b"".join(lines),
        keep_alive=True,
        content_length=length,
        chunked=chunked and length is None,
        close_delimited=length is None and not chunked and status not in (204, 304),
    )


def with_vary(fields: list[tuple[bytes, bytes]], name: bytes) -> list[tuple[bytes, bytes]]:
    """``fields`` with ``name`` listed in ``Vary`` (added once)."""
    for index, (field, value) in enumerate(fields):
        if field == b"vary":
            members = [m.strip().lower() for m in value.split(b",")]
            if name.lower() in members or b"*" in members:
                return fields
            fields[index] = (b"vary", value + b", " + name)
            return fields
    fields.append((b"vary", name))
    return fields


@dataclass(frozen=True, slots=True)
class Reply:
    """What one request gets from a stored response."""

    head: ResponseHeadReceived
    body: bytes


def stored_reply(
    entry: StoredResponse,
    request_fields: Fields,
    *,
    head_only: bool,
    now: float,
    cache_status: bytes,
    coding: str | None,
    encoded: bytes | None,
    extra: Fields = (),
    hidden: frozenset[bytes] = frozenset(),
) -> Reply:
    """The reply to a request answered from ``entry`` (see the module docstring).
    ``coding``/``encoded``: the body compressed for this client, if it is to
    be; ``extra``: fields for this one client (a 304's ``Set-Cookie``);
    ``hidden``: stored fields the client does not see (the purge tags)."""
    age = b"%d" % max(0, int(entry.age(now)))
    ranges = None
    conditional = False
    for name, value in request_fields:
        if name == b"range":
            ranges = value
        elif name[:3] == b"if-":
            conditional = True
    if ranges is None and not conditional and not extra:
        plain_coding = coding if coding is not None and encoded is not None else ""
        # (a HEAD gets the identity head: it has no coded body)
        return _plain_reply(plain_hit(entry, head_only, age, cache_status, hidden, plain_coding))
    fields = [(n, v) for n, v in entry.headers if n not in hidden]
    status, body = entry.status, entry.body
    if conditional and not_modified(entry, request_fields):
        kept = [(n, v) for n, v in fields if n in _304_FIELDS]
        kept += [(b"age", age), (b"cache-status", cache_status), *extra]
        return Reply(make_head(304, b"Not Modified", kept, length=None), b"")
    if ranges is not None:
        if_range = next((v for n, v in request_fields if n == b"if-range"), None)
        span = byte_range(ranges, if_range, entry)
        if span == UNSATISFIABLE:
            fields = [(n, v) for n, v in fields if n != b"content-encoding"]
            fields += [(b"content-range", b"bytes */%d" % len(body))]
            fields += [(b"age", age), (b"cache-status", cache_status)]
            return Reply(make_head(416, b"Range Not Satisfiable", fields, length=0), b"")
        if span is not None:
            first, last = span
            part = body[first : last + 1]
            fields.append((b"content-range", b"bytes %d-%d/%d" % (first, last, len(body))))
            fields += [(b"age", age), (b"cache-status", cache_status), *extra]
            head = make_head(206, b"Partial Content", fields, length=len(part))
            return Reply(head, b"" if head_only else part)
    if coding is not None and encoded is not None:
        fields = encoded_fields(fields, coding)
        body = encoded
    fields += [(b"age", age), (b"cache-status", cache_status), *extra]
    head = make_head(status, entry.reason, fields, length=len(body))
    return Reply(head, b"" if head_only else body)


def plain_head(entry: StoredResponse, hidden: frozenset[bytes], coding: str = "") -> PlainHead:
    """The fixed part of the head of ``entry``'s whole reply, its body
    compressed with ``coding`` (kept in ``entry.encoded``) or not (""), built
    once and kept with the entry (:attr:`StoredResponse.plain_heads`)."""
    plain = entry.plain_heads.get(coding)
    if plain is None:
        fields: Fields = [(n, v) for n, v in entry.headers if n not in hidden]
        body = entry.body
        if coding:
            fields, body = encoded_fields(fields, coding), entry.encoded[coding]
        kept = tuple((n, v) for n, v in fields if n not in _FRAMING)
        status_line = b"HTTP/1.1 %d %s\r\n" % (entry.status, entry.reason or b"-")
        lines = b"".join(n + b": " + v + b"\r\n" for n, v in kept)
        if entry.status != 204:  # RFC 9110 §8.6: never on a 204
            length = b"%d" % len(body)
            kept += ((b"content-length", length),)
            lines += b"content-length: " + length + b"\r\n"
        plain = entry.plain_heads[coding] = PlainHead(status_line, lines, kept)
    return plain


def plain_hit(
    entry: StoredResponse,
    head_only: bool,
    age: bytes,
    cache_status: bytes,
    hidden: frozenset[bytes],
    coding: str = "",
) -> PlainHit:
    """The whole stored response, its body compressed with ``coding`` (kept in
    ``entry.encoded``) or not (""), in parts, for a front end that writes it
    itself (:meth:`edge.cache.cache.EdgeCache.plain_hit`): what
    :func:`_plain_reply` answers."""
    whole = entry.encoded[coding] if coding else entry.body
    head = plain_head(entry, hidden, coding)
    body = b"" if head_only else whole
    return PlainHit(entry.status, entry.reason, head, age, cache_status, body, len(whole))


def _plain_reply(hit: PlainHit) -> Reply:
    """``hit`` as the exchange's clients take a reply (most hits that do not
    take the front ends' plain path are such: its head's fixed part is kept
    with the entry, :func:`plain_head`)."""
    response = ResponseHeadReceived(
        status=hit.status,
        reason=hit.reason,
        http_version=b"1.1",
        headers=hit.fields,
        head=hit.raw_head(),
        keep_alive=True,
        content_length=hit.length,
        chunked=False,
    )
    return Reply(response, hit.body)


class PlainHit(NamedTuple):
    """A stored response's whole reply, in parts (:func:`plain_hit`): its head's
    fixed part, then ``Age`` and ``Cache-Status``. None of its fields is
    ``X-Request-Id`` (never stored: edge.cache.entry.NOT_STORED): the front
    end adds its own, as it does to any response."""

    status: int
    reason: bytes
    head: PlainHead
    age: bytes
    cache_status: bytes
    body: bytes
    """Empty for a HEAD."""
    length: int
    """The whole body's (what its ``Content-Length`` says)."""

    def raw_head(self, added: bytes = b"") -> bytes:
        """The HTTP/1.1 head, with the field lines ``added`` (each ending in
        CRLF) right after the status line (edge.http1.response.with_field)."""
        head = self.head
        return b"".join(
            (
                head.status_line,
                added,
                head.lines,
                b"age: ",
                self.age,
                b"\r\ncache-status: ",
                self.cache_status,
                b"\r\n\r\n",
            )
        )

    @property
    def fields(self) -> tuple[tuple[bytes, bytes], ...]:
        """The head's fields (lowercase names), for HTTP/2."""
        return (*self.head.fields, (b"age", self.age), (b"cache-status", self.cache_status))


def serve(exchange: Any, client: Any, reply: Reply, *, finish: bool = True) -> None:
    """Write ``reply`` to ``client`` (an :class:`edge.exchange.ExchangeClient`)
    as ``exchange``'s whole response. ``finish``: end the exchange too (not
    when its upstream will)."""
    record = exchange.record
    record.status = reply.head.status
    if not record.first_byte:
        record.first_byte = time.monotonic()
    exchange.request_whole = True  # a GET or HEAD without a body: it is all here
    client.writes_begin()
    try:
        client.response_head(exchange, reply.head)
        if reply.body:
            client.response_data(exchange, reply.body)
        client.response_complete(exchange, False)
    finally:
        client.writes_end()
    if finish:
        exchange.finish()
