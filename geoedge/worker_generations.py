"""The workers of an older generation (a reload, :mod:`geoedge.reload`): those
a re-executed supervisor adopted from its previous image. They serve until the
supervisor's new workers are all ready, then they are *retired*: SIGTERM (they
stop accepting and drain), SIGKILL if still there ``stop_timeout_s`` later.
They are never restarted; the supervisor (:mod:`geoedge.workers`) reaps them
through their pidfds like its own.

A retiring worker handed over again (a reload during a drain) keeps its kill
deadline: it is ``CLOCK_MONOTONIC`` time, which an exec does not reset.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable

from geoedge.worker_pipes import ControlWriter
from geoedge.worker_requests import ReplyReader
from geoedge.worker_slot import AdoptedWorker, WorkerSlot

__all__ = ["OlderWorkers"]

log = logging.getLogger("geoedge.workers")


class OlderWorkers:
    """An older generation's workers; see the module docstring."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        stop_timeout_s: float,
        on_exit: Callable[[WorkerSlot], None],
    ) -> None:
        """``on_exit(slot)``: the worker's pidfd is readable (the supervisor reaps it)."""
        self._loop = loop
        self._stop_timeout_s = stop_timeout_s
        self._on_exit = on_exit
        self.slots: list[WorkerSlot] = []

    def adopt(self, adopted: AdoptedWorker) -> None:
        """Watch a worker of the supervisor's previous image (still our child)."""
        slot = WorkerSlot(adopted.index, pid=adopted.pid, ready=True, retiring=adopted.retiring)
        try:
            slot.pidfd = os.pidfd_open(adopted.pid)
        except ProcessLookupError:  # cannot be while it is our unreaped child
            log.error("adopted worker pid %d is gone", adopted.pid)
            return
        for fd in (adopted.control_fd, adopted.reply_fd):
            if fd >= 0:
                os.set_inheritable(fd, False)
        if adopted.control_fd >= 0:
            slot.control = ControlWriter(self._loop, adopted.control_fd)
        if adopted.reply_fd >= 0:
            slot.replies = ReplyReader(self._loop, adopted.reply_fd, lambda message: None)
        slot.started_at = time.monotonic()
        self.slots.append(slot)
        self._loop.add_reader(slot.pidfd, self._on_exit, slot)
        if slot.retiring:
            self._arm_kill(slot, adopted.kill_at)
        log.info(
            "worker pid %d of the previous supervisor %s",
            adopted.pid,
            "drains" if slot.retiring else "serves until the new workers are ready",
        )

    @property
    def serving(self) -> list[int]:
        return [slot.pid for slot in self.slots if slot.pid and not slot.retiring]

    @property
    def retiring(self) -> list[int]:
        return [slot.pid for slot in self.slots if slot.pid and slot.retiring]

    def retire(self) -> None:
        """The new generation serves: each older worker stops accepting and drains."""
        for slot in self.slots:
            if slot.pid and not slot.retiring:
                slot.retiring = True
                log.info("retiring worker pid %d of the previous generation", slot.pid)
                slot.signal(signal.SIGTERM)
                self._arm_kill(slot, time.monotonic() + self._stop_timeout_s)

    def stop(self) -> None:
        """The service stops: those still serving drain too (SIGTERM)."""
        for slot in self.slots:
            if not slot.retiring:
                slot.signal(signal.SIGTERM)

    def forget(self, slot: WorkerSlot) -> None:
        """``slot``'s process was reaped."""
        self.slots.remove(slot)
        slot.release(self._loop)

    def close(self) -> None:
        for slot in self.slots:
            if slot.kill is not None:
                slot.kill.cancel()
                slot.kill = None

    def _arm_kill(self, slot: WorkerSlot, at: float) -> None:
        slot.kill_at = at
        delay = max(0.0, at - time.monotonic())
        slot.kill = self._loop.call_later(delay, self._kill, slot)

    @staticmethod
    def _kill(slot: WorkerSlot) -> None:
        if slot.pid:
            log.warning("worker pid %d did not stop in time: killing", slot.pid)
            slot.signal(signal.SIGKILL)
