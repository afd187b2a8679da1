"""When each packet of one directed link may leave the router (pure: time is a parameter).

A directed link is modelled the way a real long-haul path behaves, in this order:

1. **Loss**: with probability ``loss`` the packet is dropped (independent draws;
   the caller supplies the uniform draw so tests are deterministic).
2. **Serialisation** (only with ``bandwidth_mbit``): the link sends one packet at
   a time at the configured rate, first in first out, so a packet of ``n`` bytes
   occupies it for ``8 n / rate`` seconds after the previous one finished. This is
   a token bucket one packet deep: there is no burst allowance, because a real
   bottleneck link has none. Packets waiting to be serialised form a drop-tail
   queue holding at most ``queue_ms`` of transmission time (a router's buffer,
   sized in time so that it means the same bufferbloat at any rate), so a
   sender that overruns the rate sees loss instead of an unbounded delay. A
   packet that finds the queue empty is always admitted.
3. **Propagation**: the one-way ``delay_ms`` is added after serialisation.

Release times of one link never go backwards: when a link's delay is lowered at
run time the packets already in flight keep their order (a real path does not
reorder either), so every link is a FIFO and the scheduler only ever looks at
the head of each queue. That makes picking the next packet O(number of links)
(twelve) instead of a heap push per packet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from loadtests.wan.topology import LinkParams

__all__ = ["DEFAULT_QUEUE_MS", "DelayScheduler", "DirectedLink", "LinkCounters"]

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

#: The bottleneck's buffer in milliseconds of transmission: a typical access
#: link's, and well below the path's 265 ms so that bufferbloat does not
#: dominate latency measurements (at 50 Mbit/s: 625 KB, ~400 packets).
DEFAULT_QUEUE_MS = 100.0


@dataclass(slots=True)
class LinkCounters:
    """Running totals of one directed link (mutable: updated per packet)."""

    packets: int = 0
    bytes: int = 0
    dropped_loss: int = 0
    dropped_queue: int = 0
    max_in_flight: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "packets": self.packets,
            "bytes": self.bytes,
            "dropped_loss": self.dropped_loss,
            "dropped_queue": self.dropped_queue,
            "max_in_flight": self.max_in_flight,
        }


class DirectedLink(Generic[T]):
    """One direction of one host pair: decides release times and holds its packets."""

    __slots__ = (
        "_bytes_per_s",
        "_delay_s",
        "_free_at",
        "_last_release",
        "_loss",
        "_queue_s",
        "counters",
        "params",
        "queue",
        "queue_ms",
    )

    def __init__(self, params: LinkParams, queue_ms: float = DEFAULT_QUEUE_MS) -> None:
        if not queue_ms > 0:
            raise ValueError(f"queue_ms must be > 0, got {queue_ms}")
        self.queue_ms = queue_ms
        self._queue_s = queue_ms / 1000.0
        self.queue: deque[tuple[float, T]] = deque()
        self.counters = LinkCounters()
        self._free_at = 0.0
        self._last_release = 0.0
        self.set_params(params)

    def set_params(self, params: LinkParams) -> None:
        """Apply new parameters to packets admitted from now on."""
        self.params = params
        self._delay_s = params.delay_ms / 1000.0
        self._loss = params.loss
        bw = params.bandwidth_mbit
        self._bytes_per_s = None if bw is None else bw * 1e6 / 8.0

    def admit(self, now: float, size: int, draw: float) -> float | None:
        """Release time of a packet of ``size`` bytes arriving at ``now``, or None to drop it.

        ``draw`` is a uniform random number in [0, 1) deciding loss.
        """
        counters = self.counters
        if draw < self._loss:
            counters.dropped_loss += 1
            return None
        release = now + self._delay_s
        rate = self._bytes_per_s
        if rate is not None:
            busy = self._free_at > now
            start = self._free_at if busy else now
            finish = start + size / rate
            if busy and finish - now > self._queue_s:
                counters.dropped_queue += 1
                return None
            self._free_at = finish
            release = self._free_at + self._delay_s
        if release < self._last_release:
            release = self._last_release
        self._last_release = release
        counters.packets += 1
        counters.bytes += size
        return release


class DelayScheduler(Generic[K, T]):
    """Per-link FIFO queues of delayed packets and the time the next one is due."""

    __slots__ = ("links",)

    def __init__(self, links: dict[K, DirectedLink[T]]) -> None:
        self.links = links

    def push(self, link: DirectedLink[T], release: float, item: T) -> None:
        """Hold ``item`` until ``release`` (as returned by ``link.admit``)."""
        queue = link.queue
        queue.append((release, item))
        if len(queue) > link.counters.max_in_flight:
            link.counters.max_in_flight = len(queue)

    def next_deadline(self) -> float | None:
        """The earliest release time of any held packet, or None when none is held."""
        best: float | None = None
        for link in self.links.values():
            if link.queue:
                head = link.queue[0][0]
                if best is None or head < best:
                    best = head
        return best

    def pop_due(self, now: float) -> Iterator[tuple[float, T]]:
        """Yield ``(release, item)`` for every held packet due at or before ``now``."""
        for link in self.links.values():
            queue = link.queue
            while queue and queue[0][0] <= now:
                yield queue.popleft()

    def held(self) -> int:
        """How many packets are held right now."""
        return sum(len(link.queue) for link in self.links.values())
