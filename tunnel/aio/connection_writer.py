"""The write side of one tunnel connection: what goes out on its transport, and when.

Sending is *pulled*: DATA frames are taken from the session only while the
transport is below its high-water mark, and the kernel's unsent queue is kept
short with ``TCP_NOTSENT_LOWAT`` (:func:`tunnel.aio.connection.tune_socket`),
so the choice of which stream goes next is made by the session's fair
scheduler at the last moment, not fixed early in a deep socket buffer
(DESIGN.md principle 5). Control frames are always written.

The adapter contract's output step is here too: after every flush the one
session timer is re-armed for :meth:`~tunnel.mux.Session.next_deadline`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from tunnel.aio.read_pacing import ReadPacer
from tunnel.aio.stream import TunnelStream
from tunnel.mux import Event, Session
from tunnel.mux.errors import StreamClosedError

__all__ = [
    "CONTROL_BACKLOG_BYTES",
    "FLUSH_DATA_BYTES",
    "WRITE_HIGH_WATER",
    "WRITE_LOW_WATER",
    "ConnectionWriter",
    "coalesce",
    "session_clock",
]

#: The session's clock. Not ``loop.time()``: uvloop caches it per iteration at
#: millisecond resolution, which reads a loopback RTT as 0 and makes a window
#: consumed within one tick look infinitely fast to the auto-tuner. It is the
#: same CLOCK_MONOTONIC, so session deadlines can be passed to ``call_at``.
session_clock = time.monotonic

#: How many octets of DATA one flush takes from the scheduler before yielding.
FLUSH_DATA_BYTES = 256 * 1024
#: Transport write buffer limits: above ``high`` we stop pulling DATA.
WRITE_HIGH_WATER = 256 * 1024
WRITE_LOW_WATER = 64 * 1024
#: Backed-up control replies beyond the high-water mark that pause our reading.
CONTROL_BACKLOG_BYTES = 1024 * 1024
#: Pieces shorter than this are joined before writing (see :func:`coalesce`).
COALESCE_BYTES = 16 * 1024


def coalesce(chunks: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """Join runs of small pieces (frame headers, control frames, small
    payloads) into one buffer each; large payloads pass through uncopied.

    Why: uvloop's TLS transport encrypts every ``writelines`` item as its own
    TLS record. Unjoined, each small frame cost two or three records (one for
    its 10-octet header) and as many decrypt calls at the peer: TLS record
    handling was a quarter of both ends' CPU in the stream-open benchmark.
    """
    if len(chunks) == 1:
        return chunks
    result: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = []
    run_bytes = 0
    for chunk in chunks:
        size = len(chunk)
        if size >= COALESCE_BYTES:
            if run:
                result.append(b"".join(run))
                run, run_bytes = [], 0
            result.append(chunk)
            continue
        run.append(chunk)
        run_bytes += size
        if run_bytes >= COALESCE_BYTES:
            result.append(b"".join(run))
            run, run_bytes = [], 0
    if run:
        result.append(run[0] if len(run) == 1 else b"".join(run))
    return result


class ConnectionWriter:
    """Writes one connection's session to its transport; the part each
    :class:`~tunnel.aio.stream.TunnelStream` calls to send.

    Owns:

    - ``transport`` while attached (from the connection's authorised
      ``connection_made`` to its ``connection_lost``; None otherwise);
    - flushing: what :meth:`~tunnel.mux.Session.data_to_send` returns goes out
      in one ``writelines``, DATA only while ``writing_paused`` is False (the
      transport's ``pause_writing``/``resume_writing``) and at most
      :data:`FLUSH_DATA_BYTES` of it per flush; more is a scheduled flush;
    - telling the :class:`ReadPacer` when control replies back up past
      :data:`CONTROL_BACKLOG_BYTES` while writing is paused, and when writing
      resumes;
    - the stream commands, each the session command of the same name followed
      by a scheduled flush, and the streams whose writing is paused: after each
      flush they are asked whether they may resume;
    - the session's one timer: re-armed after each flush for
      :meth:`~tunnel.mux.Session.next_deadline`; when it fires,
      ``handle_timer``'s events go to the connection's dispatch, then a flush.

    Invariants: nothing is written, and no timer armed, unless attached; at
    most one flush is scheduled at a time; ``_timer_at`` is the deadline the
    timer is armed for (infinity when none). The connection's dispatch is held
    only while attached, as the transport holds the connection: no reference
    cycle outlives the connection.
    """

    __slots__ = (
        "_dispatch",
        "_flush_scheduled",
        "_loop",
        "_reading",
        "_timer",
        "_timer_at",
        "_write_watch",
        "session",
        "transport",
        "writing_paused",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, session: Session, reading: ReadPacer
    ) -> None:
        self._loop = loop
        self.session = session
        self._reading = reading
        self.transport: asyncio.Transport | None = None
        self._dispatch: Callable[[list[Event]], None] | None = None
        self.writing_paused = False
        self._flush_scheduled = False
        self._write_watch: set[TunnelStream] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")

    def attach(self, transport: asyncio.Transport, dispatch: Callable[[list[Event]], None]) -> None:
        """Start writing to ``transport``; the timer's events go to ``dispatch``."""
        self.transport = transport
        self._dispatch = dispatch
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.flush()

    def detach(self) -> None:
        """The transport is gone: write nothing more, cancel the timer, and
        forget the streams waiting to write (none will be told it can)."""
        self.transport = None
        self._dispatch = None
        self._write_watch.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = float("inf")

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._reading.resume_after_backlog()
        self.flush()

    # -- flushing -------------------------------------------------------------

    def flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is None:
            return
        session = self.session
        budget = 0 if self.writing_paused else FLUSH_DATA_BYTES
        out = session.data_to_send(budget)
        if out:
            transport.writelines(coalesce(out))
        if self._write_watch:
            self._write_watch = {s for s in self._write_watch if not s._on_writable()}
        if self.writing_paused:
            backlog = transport.get_write_buffer_size() - WRITE_HIGH_WATER
            if backlog > CONTROL_BACKLOG_BYTES:
                self._reading.pause_for_backlog()
        elif session.wants_to_send:
            self.schedule_flush()
        deadline = session.next_deadline()
        if deadline < self._timer_at:
            self._arm_timer(deadline)

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def _arm_timer(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        dispatch = self._dispatch
        if dispatch is None:
            return
        dispatch(self.session.handle_timer(session_clock()))
        self.flush()

    # -- stream commands (called by TunnelStream) ---------------------------------

    def send_data(self, stream_id: int, data: bytes) -> int:
        """Queue ``data``; the octets now buffered for the stream (0 if it was
        reset meanwhile: its StreamReset event is on its way)."""
        try:
            self.session.send_data(stream_id, data)
        except StreamClosedError:
            return 0
        self.schedule_flush()
        return self.session.send_buffered(stream_id)

    def end_stream(self, stream_id: int) -> None:
        try:
            self.session.end_stream(stream_id)
        except StreamClosedError:
            return
        self.schedule_flush()

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        self.session.reset_stream(stream_id, error_code)
        self.schedule_flush()

    def acknowledge_received_data(self, stream_id: int, n: int) -> None:
        self.session.acknowledge_received_data(stream_id, n, session_clock())
        # Credit returned outside a receive callback (a reader resuming) must go
        # out now, not with the next timer tick; inside one, the flush at the
        # end of data_received sends it and this costs a flag test.
        self.schedule_flush()

    def send_buffered(self, stream_id: int) -> int:
        return self.session.send_buffered(stream_id)

    def watch_write_pause(self, stream: TunnelStream) -> None:
        """``stream`` paused its protocol's writing: ask it after each flush."""
        self._write_watch.add(stream)
