"""One worker process as the supervisor (:mod:`geoedge.workers`) keeps it: its
pid and pidfd, its two pipes (:mod:`geoedge.worker_pipes`), its restart and
kill timers, and whether it said it is ready or drains as an older
generation's worker (:mod:`geoedge.worker_generations`)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from geoedge.worker_pipes import ControlWriter
from geoedge.worker_requests import ReplyReader

__all__ = ["AdoptedWorker", "WorkerSlot"]


@dataclass(frozen=True, slots=True)
class AdoptedWorker:
    """A worker forked by the supervisor before it re-executed itself: the same
    process (its parent is still this pid), with its pipes' descriptors."""

    pid: int
    index: int
    control_fd: int
    reply_fd: int
    retiring: bool
    """Already told to drain (by a takeover before the re-exec)."""
    kill_at: float = 0.0
    """When a retiring one is killed (``CLOCK_MONOTONIC`` seconds, which an exec keeps)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AdoptedWorker:
        return cls(
            pid=int(data["pid"]),
            index=int(data["index"]),
            control_fd=int(data["control_fd"]),
            reply_fd=int(data["reply_fd"]),
            retiring=bool(data["retiring"]),
            kill_at=float(data.get("kill_at", 0.0)),
        )


@dataclass(slots=True, eq=False)
class WorkerSlot:
    """Invariant: ``pid`` is 0 exactly when no process is held; ``pidfd`` and
    the pipes are open while one is (the reaping closes them)."""

    index: int
    pid: int = 0
    pidfd: int = -1
    control: ControlWriter | None = None
    replies: ReplyReader | None = None
    started_at: float = 0.0
    attempt: int = 0
    restart: asyncio.TimerHandle | None = None
    ready: bool = False
    retiring: bool = False
    kill_at: float = 0.0
    kill: asyncio.TimerHandle | None = None

    def fds(self) -> list[int]:
        """The descriptors it holds (a worker forked later closes them)."""
        fds = [self.pidfd] if self.pidfd >= 0 else []
        for pipe in (self.control, self.replies):
            if pipe is not None and pipe.fd >= 0:
                fds.append(pipe.fd)
        return fds

    def signal(self, sig: int) -> None:
        """Through the pidfd: never a pid reused by someone else."""
        if self.pid and self.pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.pidfd, sig)
            except ProcessLookupError:
                pass

    def release(self, loop: asyncio.AbstractEventLoop) -> None:
        """The process was reaped: close what watched and spoke to it."""
        if self.pidfd >= 0:
            loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1
        for pipe in (self.control, self.replies):
            if pipe is not None:
                pipe.close()
        self.control = self.replies = None
        if self.kill is not None:
            self.kill.cancel()
            self.kill = None

    def handed_over(self, loop: asyncio.AbstractEventLoop) -> AdoptedWorker:
        """What the next image of the supervisor adopts: the pipes made
        inheritable, and nothing here watches them any more."""
        control = self.control.fd if self.control is not None else -1
        replies = self.replies.fd if self.replies is not None else -1
        for fd in (control, replies):
            if fd >= 0:
                os.set_inheritable(fd, True)
        if self.pidfd >= 0:
            loop.remove_reader(self.pidfd)
        if replies >= 0:
            loop.remove_reader(replies)
        return AdoptedWorker(self.pid, self.index, control, replies, self.retiring, self.kill_at)
