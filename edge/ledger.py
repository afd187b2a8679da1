"""What a client was actually sent: the access log's ``bytes_out``.

A front end writes to its client transport and the transport may keep some of
it queued (a slow reader, a long link). Bytes handed to the transport are not
bytes the client was sent: when the connection dies, what is still queued
never leaves. So a front end counts every octet it writes (:attr:`queued`),
records where each request's response starts and ends in that count, and a
request is logged only once the transport has handed its last octet to the
kernel (:meth:`edge.tls_transport.TlsServerTransport.call_when_flushed`), or
when the connection is gone, with the part that got out.

On an HTTP/2 connection responses interleave, so a response cut short by a
dying connection is credited with the octets sent after its start, at most
its own: exact for HTTP/1.1, an upper bound for HTTP/2.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Logged(Protocol):
    """What the ledger needs of a request record (edge.exchange.RequestRecord)."""

    out_start: int
    out_end: int
    bytes_out: int
    outcome: str


R = TypeVar("R", bound=Logged)


class OutputLedger(Generic[R]):
    """One client connection's output count and the requests awaiting their log
    line (records of type ``R``, the front end's: what ``log`` is given back)."""

    __slots__ = ("_log", "_transport", "_unflushed", "queued")

    def __init__(self, log: Callable[[R, int], None]) -> None:
        # (record, octets of its response the client was sent). ``log`` is the
        # front end's bound method and the front end holds this ledger: held
        # weakly, or every connection would be a reference cycle (and outlive
        # its close until a full collection, which the daemons almost never run).
        # The front end settles the ledger when its connection ends, so nothing
        # is left to log once it is gone.
        self._log = weakref.WeakMethod(log)
        self._transport: asyncio.Transport | None = None
        # A list, not a deque: it holds a few records at most, and an empty
        # deque costs 760 B on every idle connection (704 more than a list).
        self._unflushed: list[R] = []
        self.queued = 0

    def attach(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def sent(self) -> int:
        """Octets of this connection's output that reached the kernel."""
        transport = self._transport
        if transport is None:
            return 0
        sent = getattr(transport, "bytes_sent", None)
        if sent is None:  # a plain socket transport: what it no longer holds
            sent = self.queued - transport.get_write_buffer_size()
        return sent

    def sent_for(self, record: Logged) -> int:
        if record.out_start < 0:
            return 0
        sent = self.sent()
        if sent >= record.out_end:
            return record.bytes_out
        return max(0, min(sent - record.out_start, record.bytes_out))

    def done(self, record: R, *, flush_now: bool = True) -> None:
        """``record``'s response is complete here (``out_end`` set): log it once
        it is out of our hands. ``flush_now`` False: the caller has writes still
        batched and calls :meth:`check` after writing them."""
        self._unflushed.append(record)
        if flush_now:
            self.check()

    def check(self) -> None:
        """Log what is flushed now, and ask to be called when the rest is."""
        if not self._unflushed:
            return
        when_flushed = getattr(self._transport, "call_when_flushed", None)
        if when_flushed is None:
            self.settle(final=True)
        else:
            when_flushed(self.settle)

    def settle(self, *, final: bool = False) -> None:
        """Log the complete requests whose every octet reached the kernel; with
        ``final`` (the connection is gone, or cannot tell) all of them, with
        what got out."""
        unflushed = self._unflushed
        if not unflushed:
            return
        sent = self.sent()
        while unflushed:
            record = unflushed[0]
            if record.out_start >= 0 and sent < record.out_end and not final:
                break
            del unflushed[0]
            got_out = self.sent_for(record)
            if got_out < record.bytes_out and record.outcome == "ok":
                record.outcome = "client_closed"
            log = self._log()
            if log is not None:
                log(record, got_out)
