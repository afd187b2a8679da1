"""One stream's state: the transition table of PROTOCOL.md §6.4 and its buffers.

The table is data (h11's ``_state.py`` style): ``TRANSITIONS[(state, input)]``
gives the next state; a pair missing from the table is an error, raised by the
caller with the right scope (local misuse → :class:`StreamClosedError`; peer
misuse → a stream-scoped STREAM_CLOSED reset).
"""

from __future__ import annotations

import enum
from collections import deque

from tunnel.mux.window import ReceiveWindow


class StreamState(enum.Enum):
    # Members are singletons compared by identity, so they hash by identity:
    # ``Enum.__hash__`` is Python code (``hash(self._name_)``), run twice for
    # every lookup in :data:`TRANSITIONS`, a few times per stream.
    __hash__ = object.__hash__

    OPEN = "open"
    HALF_CLOSED_LOCAL = "half-closed (local)"
    HALF_CLOSED_REMOTE = "half-closed (remote)"
    CLOSED = "closed"


class StreamInput(enum.Enum):
    __hash__ = object.__hash__

    SEND_DATA = "send DATA"
    SEND_END = "send END_STREAM"
    RECV_DATA = "receive DATA"
    RECV_END = "receive END_STREAM"


_S = StreamState
_I = StreamInput
# Members as module names: a member read off its class goes through
# ``EnumType.__getattr__``'s slot (~1,000 instructions in 3.11), and streams
# read their state a few times a request.
_OPEN = StreamState.OPEN
_HALF_CLOSED_LOCAL = StreamState.HALF_CLOSED_LOCAL
_HALF_CLOSED_REMOTE = StreamState.HALF_CLOSED_REMOTE
_CLOSED = StreamState.CLOSED

#: PROTOCOL.md §6.4. RESET (either way) closes from any state and is not listed.
TRANSITIONS: dict[tuple[StreamState, StreamInput], StreamState] = {
    (_S.OPEN, _I.SEND_DATA): _S.OPEN,
    (_S.OPEN, _I.SEND_END): _S.HALF_CLOSED_LOCAL,
    (_S.OPEN, _I.RECV_DATA): _S.OPEN,
    (_S.OPEN, _I.RECV_END): _S.HALF_CLOSED_REMOTE,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_DATA): _S.HALF_CLOSED_LOCAL,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_END): _S.CLOSED,
    (_S.HALF_CLOSED_REMOTE, _I.SEND_DATA): _S.HALF_CLOSED_REMOTE,
    (_S.HALF_CLOSED_REMOTE, _I.SEND_END): _S.CLOSED,
}


class Stream:
    """Book-keeping of one open stream inside a :class:`Session`."""

    __slots__ = (
        "end_sent",
        "local",
        "received_any",
        "recv_window",
        "send_buffered",
        "send_queue",
        "send_window",
        "stall_since",
        "state",
        "stream_id",
    )

    def __init__(
        self, stream_id: int, *, local: bool, send_window: int, recv_window: ReceiveWindow
    ) -> None:
        self.stream_id = stream_id
        self.local = local
        self.state = _OPEN
        # A deque only while data waits (queue_data, take): an empty deque is
        # 760 B, held by every idle stream (a WebSocket's, for hours).
        self.send_queue: deque[bytes | memoryview] | tuple[()] = ()
        self.send_buffered = 0
        self.send_window = send_window
        self.recv_window = recv_window
        self.end_sent = False
        self.received_any = False
        self.stall_since: float | None = None

    def transition(self, event: StreamInput) -> bool:
        """Apply ``event``; False (state unchanged) when the table forbids it."""
        new = TRANSITIONS.get((self.state, event))
        if new is None:
            return False
        self.state = new
        return True

    @property
    def end_queued(self) -> bool:
        """The application has ended its side (the END_STREAM may still be queued)."""
        state = self.state
        return state is _HALF_CLOSED_LOCAL or state is _CLOSED

    @property
    def peer_ended(self) -> bool:
        state = self.state
        return state is _HALF_CLOSED_REMOTE or state is _CLOSED

    @property
    def finished(self) -> bool:
        """Both sides ended and our END_STREAM is on its way: forget the stream."""
        return self.state is _CLOSED and self.end_sent

    def queue_data(self, data: bytes) -> None:
        """Queue ``data`` (not copied) for :meth:`take`."""
        queue = self.send_queue
        if isinstance(queue, tuple):
            queue = self.send_queue = deque()
        queue.append(data)
        self.send_buffered += len(data)

    def take(self, n: int) -> list[bytes | memoryview]:
        """Remove up to ``n`` queued octets, as chunks, without copying."""
        chunks: list[bytes | memoryview] = []
        queue = self.send_queue
        if isinstance(queue, tuple):
            return chunks
        left = n
        while left and queue:
            chunk = queue[0]
            size = len(chunk)
            if size <= left:
                queue.popleft()
                chunks.append(chunk)
                left -= size
            else:
                view = chunk if isinstance(chunk, memoryview) else memoryview(chunk)
                chunks.append(view[:left])
                queue[0] = view[left:]
                left = 0
        self.send_buffered -= n - left
        if not queue:
            self.send_queue = ()
        return chunks
