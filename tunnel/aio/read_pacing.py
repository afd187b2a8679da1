"""When a tunnel connection's transport reads: its two reasons to pause.

- A read burst: libuv reads a busy socket up to 32 times per loop turn (up to
  ~8 MiB of bulk data here), and every callback queued meanwhile (a coroutine
  waiting on a small response, a flush) waits for all of it: ~10 ms per small
  request under bulk in ``make bench-tunnel``. Pausing after
  :data:`READ_BURST_BYTES` and resuming on the next turn lets that work run in
  between.
- A control backlog: our *control* replies back up while writing is paused (a
  peer flooding PINGs while not reading its PONGs). Pausing on data
  backpressure instead could deadlock two peers that both send bulk data; DATA
  needs no such guard because credit windows already bound it.
"""

from __future__ import annotations

import asyncio

__all__ = ["READ_BURST_BYTES", "ReadPacer"]

#: Octets read before yielding to the rest of the loop (see the module docstring).
READ_BURST_BYTES = 256 * 1024


class ReadPacer:
    """Pauses and resumes one connection's reading, for a burst or a backlog.

    Owns the transport's reading state. ``received`` is told every read (by the
    connection's ``data_received``); the connection's writer says when control
    replies back up (``pause_for_backlog``) and when writing resumes
    (``resume_after_backlog``).

    Invariants: the transport holds reading paused exactly while a burst is
    yielding or a backlog is pending, and is resumed only when neither is; the
    transport is held only while attached (the connection's ``connection_made``
    to its ``connection_lost``), and nothing is paused or resumed otherwise.
    """

    __slots__ = ("_backlogged", "_burst", "_loop", "_transport", "_yielding")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._burst = 0
        self._yielding = False
        self._backlogged = False

    def attach(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def detach(self) -> None:
        self._transport = None

    def received(self, n: int) -> None:
        """``n`` octets were just read: yield the rest of this loop turn once
        a burst's worth came in."""
        self._burst += n
        if self._burst >= READ_BURST_BYTES and not self._yielding:
            transport = self._transport
            if transport is not None:
                self._yielding = True
                transport.pause_reading()
                self._loop.call_soon(self._end_burst)

    def _end_burst(self) -> None:
        self._yielding = False
        self._burst = 0
        if self._transport is not None and not self._backlogged:
            self._transport.resume_reading()

    def pause_for_backlog(self) -> None:
        """Control replies are backing up: stop reading what provokes them."""
        if not self._backlogged and self._transport is not None:
            self._backlogged = True
            self._transport.pause_reading()

    def resume_after_backlog(self) -> None:
        """Writing resumed: read again (unless a burst is still yielding)."""
        if self._backlogged and self._transport is not None:
            self._backlogged = False
            if not self._yielding:
                self._transport.resume_reading()
