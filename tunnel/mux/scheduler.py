"""Fair round-robin over streams that have something to send.

Each turn a ready stream sends one frame of at most MAX_FRAME_BYTES and goes to
the back of the line (deficit-free round robin: frames are bounded, so it is
fair to within one frame). A small response therefore waits behind at most one
frame per other busy stream, never behind a whole bulk transfer
(DESIGN.md principle 5).
"""

from __future__ import annotations

from collections import deque


class RoundRobin:
    __slots__ = ("_members", "_queue")

    def __init__(self) -> None:
        self._queue: deque[int] = deque()
        self._members: set[int] = set()

    def push(self, stream_id: int) -> None:
        """Make ``stream_id`` ready (no-op when it already is)."""
        if stream_id not in self._members:
            self._members.add(stream_id)
            self._queue.append(stream_id)

    def pop(self) -> int | None:
        """The next ready stream, removed from the line; None when idle."""
        if not self._queue:
            return None
        stream_id = self._queue.popleft()
        self._members.discard(stream_id)
        return stream_id

    def discard(self, stream_id: int) -> None:
        if stream_id in self._members:
            self._members.discard(stream_id)
            self._queue.remove(stream_id)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, stream_id: int) -> bool:
        return stream_id in self._members
