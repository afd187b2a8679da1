"""A request's wait for a tunnel connection: the part of an exchange that
exists only while no tunnel is up.

An exchange (:mod:`edge.exchange`) whose stream cannot open because no tunnel
connection is usable does not fail at once: it joins the worker's waiters
(:meth:`edge.origins.OriginSet.wait_for_tunnel`) for at most
``tunnel_wait_s``, and what the client sends meanwhile is kept to go up
after the request head. The exchange hands this part two of its own steps,
so the part needs nothing else of it: opening the stream and giving up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["TunnelWait", "TunnelWaiters"]


class TunnelWaiters(Protocol):
    """Where requests wait for a tunnel (the worker: edge.worker.EdgeWorker)."""

    def wait_for_tunnel(self, waiter: TunnelWait) -> bool:
        """Call ``waiter.tunnel_ready()`` when a tunnel connection becomes
        usable; False when too many wait already."""

    def stop_waiting_for_tunnel(self, waiter: TunnelWait) -> None: ...


class TunnelWait:
    """One request's wait for a usable tunnel connection.

    Owns its place among the worker's waiters, its deadline, and
    :attr:`queued`, the request octets that came while it waits.

    Invariants: from :meth:`begin` to its end its deadline is armed and it
    is among the worker's waiters (save inside the worker's
    :meth:`tunnel_ready` call, which joins again if the stream still cannot
    open). It ends once, whichever comes first: a stream opened
    (``open_stream`` returned True, having taken :attr:`queued` to send after
    the head, and called :meth:`stop`), the deadline passed or the worker had
    no room for it (``no_tunnel``), or the exchange ended (:meth:`stop`).
    After its end it calls neither step again.
    """

    __slots__ = ("_no_tunnel", "_open_stream", "_timer", "_waiters", "queued")

    def __init__(
        self,
        waiters: TunnelWaiters,
        open_stream: Callable[[], bool],
        no_tunnel: Callable[[], None],
    ) -> None:
        self._waiters = waiters
        self._open_stream = open_stream
        self._no_tunnel = no_tunnel
        self._timer: asyncio.TimerHandle | None = None
        self.queued: list[bytes] = []

    def begin(self, wait_s: float) -> bool:
        """Join the waiters for at most ``wait_s``; False (not waiting) when they are full."""
        if not self._waiters.wait_for_tunnel(self):
            return False
        self._timer = asyncio.get_running_loop().call_later(wait_s, self._expired)
        return True

    def tunnel_ready(self) -> None:
        """A tunnel connection became usable (edge.origins.OriginSet): open the
        stream now, or wait on if another request took it first."""
        if self._timer is None:
            return
        if not self._open_stream() and not self._waiters.wait_for_tunnel(self):
            self._no_tunnel()

    def stop(self) -> None:
        """End the wait (idempotent): leave the waiters, disarm the deadline."""
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._timer = None
            self._waiters.stop_waiting_for_tunnel(self)

    def _expired(self) -> None:
        self._timer = None
        self._waiters.stop_waiting_for_tunnel(self)
        self._no_tunnel()
