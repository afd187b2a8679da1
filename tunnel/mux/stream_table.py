"""The streams of one session by id, and the ids this end allocates
(PROTOCOL.md §6.3)."""

from __future__ import annotations

from tunnel.mux import frames
from tunnel.mux.events import Event, StreamReset
from tunnel.mux.outbound import Outbound
from tunnel.mux.receive_credit import ReceiveCredit
from tunnel.mux.stream import Stream, StreamState
from tunnel.mux.window import ReceiveWindow

_CLOSED = StreamState.CLOSED  # not read off the class per stream (tunnel.mux.stream)


class StreamTable:
    """Owns ``streams`` (id → :class:`Stream`, the open ones), ``next_local_id``
    (odd for the side that dialed, even for the listener), the counts of open
    streams by side (``local_open``, ``peer_open``) and ``opened_total``.

    Invariants: ``local_open + peer_open == len(streams)``; ``next_local_id``
    only grows, so an id is never reused; a stream leaves the table once, by
    :meth:`forget` (or all at once by :meth:`clear` when the session ends), and
    leaving settles its accounts with the connection: it is CLOSED, its stall is
    dropped from ``out`` and its unconsumed octets go back to the connection
    receive window (§7.2), so a stream that ends unread never leaks credit.
    """

    __slots__ = (
        "_credit",
        "_out",
        "local_open",
        "next_local_id",
        "opened_total",
        "peer_open",
        "streams",
    )

    def __init__(self, *, client: bool, out: Outbound, credit: ReceiveCredit) -> None:
        self._out = out
        self._credit = credit
        self.streams: dict[int, Stream] = {}
        self.next_local_id = 1 if client else 2
        self.local_open = 0
        self.peer_open = 0
        self.opened_total = 0

    def open_local(self, send_window: int, recv_window: ReceiveWindow) -> Stream:
        """A stream of ours, with the next local id (checked by the caller
        against MAX_STREAM_ID)."""
        stream_id = self.next_local_id
        self.next_local_id = stream_id + 2
        stream = Stream(stream_id, local=True, send_window=send_window, recv_window=recv_window)
        self.streams[stream_id] = stream
        self.local_open += 1
        self.opened_total += 1
        return stream

    def accept(self, stream_id: int, send_window: int, recv_window: ReceiveWindow) -> Stream:
        """A stream the peer opened (its id checked by the caller)."""
        stream = Stream(stream_id, local=False, send_window=send_window, recv_window=recv_window)
        self.streams[stream_id] = stream
        self.peer_open += 1
        self.opened_total += 1
        return stream

    def forget(self, stream: Stream, now: float) -> None:
        """Drop a stream and settle its accounts (see the class invariants).
        Forgetting a stream that is already gone is a no-op."""
        stream_id = stream.stream_id
        if self.streams.pop(stream_id, None) is None:
            return
        stream.state = _CLOSED
        if stream.local:
            self.local_open -= 1
        else:
            self.peer_open -= 1
        if stream.stall_since is not None:
            self._out.unstall(stream, now)
        window = stream.recv_window
        unconsumed = window.received - window.consumed  # .unconsumed, without its call
        if unconsumed:
            self._credit.return_credit(unconsumed, now)

    def reset(
        self, stream_id: int, code: int, events: list[Event], now: float, *, remote: bool
    ) -> None:
        """Reset a stream for a fault the peer caused: RESET goes out through the
        bounded control queue (§8.2) even when the stream is already gone;
        :class:`StreamReset` is reported when it was still open."""
        self._out.queue_control(frames.encode_reset(stream_id, code))
        stream = self.streams.get(stream_id)
        if stream is not None:
            self.forget(stream, now)
            events.append(StreamReset(stream_id, code, remote=remote))

    def clear(self) -> None:
        """The session ended: every stream is gone, with nothing to settle."""
        self.streams.clear()
        self.local_open = self.peer_open = 0
