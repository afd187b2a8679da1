"""Prefork worker processes for both daemons (DESIGN.md principle 9: one process per
core, shared nothing).

The parent binds the listening sockets and builds the TLS contexts *before* it
forks, so every worker accepts on the same sockets and shares the same TLS
session-ticket keys (Python has no API to set them). It then runs an event
loop of its own for the admin listener and the daemon's control plane, and a
:class:`Supervisor` that:

- forks ``workers`` processes (0 means one per CPU) and watches each through a
  pidfd (no SIGCHLD handler, and no reaping of processes it did not start);
- restarts a worker that dies, after a backoff with full jitter
  (:class:`tunnel.policy.Backoff`) that grows while the worker keeps dying
  young (within ``stable_after_s`` of its start) and resets after it lived;
- on SIGTERM/SIGINT (or :meth:`Supervisor.stop`) stops restarting, forwards
  SIGTERM to the workers (they drain), waits, and after ``stop_timeout_s``
  SIGKILLs the stragglers; :meth:`Supervisor.run` returns when all are gone;
- on SIGHUP calls the daemon's ``on_reload``, then forwards SIGHUP to the
  workers unless it returned False (both daemons do: they re-execute
  themselves, :mod:`geoedge.reload`, and the workers have nothing to do);
- forwards SIGUSR1 (reopen logs) and SIGUSR2 (log a memory report,
  :mod:`geoedge.memory`) to the workers; a worker ignores both until it
  takes them;
- keeps two pipes to each worker (:mod:`geoedge.worker_pipes`): the control
  pipe (:meth:`Supervisor.broadcast`, JSON lines; EOF tells a worker its
  parent is gone) and the reply pipe, on which a worker answers requests
  (:meth:`Supervisor.request` sends one to every worker and gathers their
  answers, :mod:`geoedge.worker_requests`; the origin's admin asks its
  workers to send a tunnel CONTROL message this way) and says it is ready.

Generations (a reload). A supervisor that re-executed itself is given the
workers of the one before (``adopted``, :class:`AdoptedWorker`): they keep
serving while it forks a new worker for every slot. Each new worker gets
``takeover=True`` (someone else serves: it readies itself, for the edge its
tunnels up and warm, before it accepts a client) and reports ready; once every
slot's worker has, the older generation is *retired*: SIGTERM (they stop
accepting and drain), SIGKILL after ``stop_timeout_s``, never restarted.
Until then the older workers serve, however long that takes: a new generation
that cannot get ready (a crash loop, no tunnel) replaces nothing.
:meth:`Supervisor.handover` is what the next re-exec passes on.

A worker is a function ``worker_main(WorkerContext) -> exit status`` run in the
child right after the fork. It must start its own event loop (the parent's is
unusable there); the child ends with ``os._exit`` so nothing of the parent's
(atexit handlers, the parent loop's cleanup) runs twice.

Why fork from inside the parent's running loop: restarts happen while the admin
listener runs. In the child, :func:`geoedge.worker_fds.reset_after_fork`
forgets the parent's running loop (Python 3.12 does this itself at fork; 3.11
does not), restores default signal dispositions and closes the parent's
descriptors it was told about (``parent_fds``) and the other workers' pipes
and pidfds. The parent's threads (the DNS resolver's) do not exist in the
child, which touches nothing of theirs.

What a worker inherits: stdin/stdout/stderr, its own two pipes, and the
descriptors that were open when :meth:`Supervisor.run` started (minus
``parent_fds``): the listening sockets, the TLS material, the log streams,
prometheus_client's mmap files -- open what the workers need before ``run``.
Anything the parent opened since (an accepted admin connection, a health
check's socket, a DNS query's) is released in a worker forked later
(:mod:`geoedge.worker_fds` says how and why).

``workers = 1`` still forks one worker: the parent is the same in production
and in tests. Daemons offer an in-process mode of their own for fine-grained
tests (the origin's :class:`origin.daemon.OriginDaemon` with ``in_process=True``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from geoedge.worker_fds import (
    PARENT_SIGNALS,
    FdIdentity,
    fds_opened_since,
    open_fds,
    release_fds,
    reset_after_fork,
)
from geoedge.worker_generations import OlderWorkers
from geoedge.worker_pipes import ControlWriter, listen_control, report_ready
from geoedge.worker_requests import PendingRequests, ReplyReader, WorkerAnswer
from geoedge.worker_slot import AdoptedWorker, WorkerSlot
from tunnel.policy import Backoff

__all__ = [
    "AdoptedWorker",
    "Supervisor",
    "SupervisorStatistics",
    "WorkerContext",
    "listen_control",
    "report_ready",
    "resolve_worker_count",
    "worker_share",
]

log = logging.getLogger("geoedge.workers")


def worker_share(per_host: int, workers: int) -> int:
    """A worker's share of a cap the config states per host: rounded up, so
    every worker gets at least 1 of a positive cap (0, "no cap", stays 0)."""
    return -(-per_host // workers) if per_host > 0 else per_host


def resolve_worker_count(workers: int) -> int:
    """``0`` means one worker per CPU this process may run on."""
    if workers > 0:
        return workers
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class WorkerContext:
    """What a worker learns from its parent."""

    index: int
    """0-based slot; a restarted worker keeps its slot's index."""
    control_fd: int
    """Read end of the control pipe (JSON lines); see :func:`listen_control`."""
    parent_pid: int
    reply_fd: int = -1
    """Write end of the reply pipe (:mod:`geoedge.worker_requests`,
    :func:`report_ready`); -1: none."""
    takeover: bool = False
    """Another worker serves clients now (an older generation during a reload,
    or a sibling while this one restarts): get ready before accepting any."""


WorkerMain = Callable[[WorkerContext], int]


@dataclass(frozen=True, slots=True)
class SupervisorStatistics:
    target: int
    running: int
    """Workers of the current generation alive."""
    restarts: int
    stopping: bool
    pids: tuple[int, ...]
    """The current generation's."""
    ready: int = 0
    """Of the current generation, those that reported ready."""
    previous: tuple[int, ...] = ()
    """An older generation still serving (until every current worker is ready)."""
    retiring: tuple[int, ...] = ()
    """Older workers draining."""


class Supervisor:
    """Forks and keeps ``workers`` processes running; see the module docstring.

    A worker inherits the descriptors open when :meth:`run` started, except the
    ``parent_fds``; what the parent opened since is released in the child."""

    def __init__(
        self,
        worker_main: WorkerMain,
        *,
        workers: int,
        stop_timeout_s: float = 35.0,
        restart_backoff: Backoff | None = None,
        stable_after_s: float = 10.0,
        on_reload: Callable[[], bool | None] | None = None,
        on_worker_exit: Callable[[int, int], None] | None = None,
        parent_fds: Callable[[], Iterable[int]] = tuple,
        on_stopping: Callable[[], None] | None = None,
        on_generation_ready: Callable[[], None] | None = None,
        adopted: Sequence[AdoptedWorker] = (),
        rng: random.Random | None = None,
    ) -> None:
        """``on_generation_ready``: every current worker has reported ready (an
        older generation, if any, is retired at that moment)."""
        self._worker_main = worker_main
        self.target = resolve_worker_count(workers)
        self._stop_timeout_s = stop_timeout_s
        self._backoff = restart_backoff or Backoff(base_s=0.5, cap_s=30.0)
        self._stable_after_s = stable_after_s
        self._on_reload = on_reload
        self._on_worker_exit = on_worker_exit
        self._parent_fds = parent_fds
        self._on_stopping = on_stopping
        self._on_generation_ready = on_generation_ready
        self._adopted = tuple(adopted)
        self._rng = rng or random.Random()
        self._slots = [WorkerSlot(i) for i in range(self.target)]
        #: An older generation (a reload): made by run(), which has the loop.
        self._older: OlderWorkers | None = None
        self._restarts = 0
        self._stopping = False
        self._generation_ready = False
        self._done: asyncio.Future[None] | None = None
        self._kill_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inherited_fds: dict[int, FdIdentity] | None = None
        self._requests = PendingRequests()

    # -- parent API -----------------------------------------------------------------

    async def run(self) -> None:
        """Fork the workers and supervise them until :meth:`stop` (or SIGTERM/SIGINT)
        and the last worker has exited. The descriptors open now are the ones
        every worker, restarted ones too, inherits."""
        self._loop = loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        loop.add_signal_handler(signal.SIGTERM, self.stop)
        loop.add_signal_handler(signal.SIGINT, self.stop)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)
        loop.add_signal_handler(signal.SIGUSR1, self._forward, signal.SIGUSR1)
        loop.add_signal_handler(signal.SIGUSR2, self._forward, signal.SIGUSR2)
        older = self._older = OlderWorkers(
            loop, stop_timeout_s=self._stop_timeout_s, on_exit=self._reap
        )
        for adopted in self._adopted:
            older.adopt(adopted)
        self._inherited_fds = open_fds()
        try:
            for slot in self._slots:
                if not self._stopping:
                    self._spawn(slot)
            if self._stopping:
                older.stop()
                self._check_done()
            await self._done
        finally:
            for sig in PARENT_SIGNALS[:-1]:  # all but SIGCHLD, never handled here
                loop.remove_signal_handler(sig)
            if self._kill_timer is not None:
                self._kill_timer.cancel()
            older.close()

    def stop(self) -> None:
        """Stop restarting, SIGTERM every worker, SIGKILL them after
        ``stop_timeout_s``. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        log.info("stopping %d worker(s)", self.running + len(self._older_slots))
        if self._on_stopping is not None:
            self._on_stopping()  # e.g. STOPPING=1 to systemd, before the drain
        for slot in self._slots:
            if slot.restart is not None:
                slot.restart.cancel()
                slot.restart = None
            slot.signal(signal.SIGTERM)
        if self._older is not None:
            self._older.stop()
        if self._loop is not None:
            self._kill_timer = self._loop.call_later(self._stop_timeout_s, self._kill_all)
            self._check_done()

    def broadcast(self, message: Mapping[str, Any]) -> None:
        """Send ``message`` (JSON-serializable) to every running worker, older
        generations included (an origin's pool change reaches streams they hold)."""
        line = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        for slot in self._all_slots:
            if slot.control is not None and not slot.control.send(line):
                log.error(
                    "worker %d (pid %d) is not reading its control pipe", slot.index, slot.pid
                )
                slot.signal(signal.SIGKILL)

    async def request(self, message: Mapping[str, Any], timeout_s: float) -> list[WorkerAnswer]:
        """Send ``message`` as a request to every running worker of the current
        generation and wait up to ``timeout_s`` for their answers: one per
        worker asked, in slot order (:mod:`geoedge.worker_requests`). Raises
        ``TooManyRequests`` when too many wait already."""
        asked = {slot.index: slot.pid for slot in self._slots if slot.control is not None}
        request_id = self._requests.open(asked)
        line = (json.dumps({**message, "request_id": request_id}) + "\n").encode()
        for slot in self._slots:
            if slot.control is not None and not slot.control.send(line):
                log.error(
                    "worker %d (pid %d) is not reading its control pipe", slot.index, slot.pid
                )
                slot.signal(signal.SIGKILL)
        return await self._requests.wait(request_id, timeout_s)

    def handover(self) -> list[AdoptedWorker]:
        """Every live worker, for the supervisor this process is about to
        become (an exec): their pipes are made inheritable, and nothing here
        touches them from now on (the loop stops watching them)."""
        assert self._loop is not None
        return [
            slot.handed_over(self._loop) for slot in [*self._older_slots, *self._slots] if slot.pid
        ]

    @property
    def running(self) -> int:
        return sum(1 for slot in self._slots if slot.pid)

    @property
    def all_running(self) -> bool:
        return self.running == self.target and not self._stopping

    @property
    def generation_ready(self) -> bool:
        """Every current worker has reported ready (since the last one started)."""
        return self._generation_ready

    def statistics(self) -> SupervisorStatistics:
        older = self._older
        return SupervisorStatistics(
            target=self.target,
            running=self.running,
            restarts=self._restarts,
            stopping=self._stopping,
            pids=tuple(slot.pid for slot in self._slots if slot.pid),
            ready=sum(1 for slot in self._slots if slot.pid and slot.ready),
            previous=tuple(older.serving) if older is not None else (),
            retiring=tuple(older.retiring) if older is not None else (),
        )

    @property
    def _older_slots(self) -> list[WorkerSlot]:
        return self._older.slots if self._older is not None else []

    @property
    def _all_slots(self) -> list[WorkerSlot]:
        return [*self._slots, *self._older_slots]

    # -- forking -----------------------------------------------------------------------

    def _serving_elsewhere(self, slot: WorkerSlot) -> bool:
        """Whether a worker other than ``slot``'s serves clients now."""
        return bool(self._older is not None and self._older.serving) or any(
            s is not slot and s.pid and s.ready for s in self._slots
        )

    def _spawn(self, slot: WorkerSlot) -> None:
        assert self._loop is not None
        slot.restart = None
        if self._stopping:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        takeover = self._serving_elsewhere(slot)
        pipes: list[int] = []
        try:
            pipes.extend(os.pipe())
            pipes.extend(os.pipe())
            pid = os.fork()
        except OSError as exc:  # EAGAIN, ENOMEM, EMFILE: try again later
            for fd in pipes:
                os.close(fd)
            slot.attempt += 1
            delay = self._backoff.delay(slot.attempt, self._rng)
            log.error("cannot fork worker %d (%s); retrying in %.2fs", slot.index, exc, delay)
            slot.restart = self._loop.call_later(delay, self._spawn, slot)
            return
        control_r, control_w, reply_r, reply_w = pipes
        if pid == 0:  # the child: never returns
            os.close(control_w)
            os.close(reply_r)
            self._run_child(slot.index, control_r, reply_w, takeover)
        os.close(control_r)
        os.close(reply_w)
        slot.pid = pid
        slot.ready = False
        self._generation_ready = False
        slot.started_at = time.monotonic()
        slot.control = ControlWriter(self._loop, control_w)
        slot.replies = ReplyReader(self._loop, reply_r, lambda m: self._from_worker(slot, pid, m))
        slot.pidfd = os.pidfd_open(pid)
        self._loop.add_reader(slot.pidfd, self._reap, slot)
        log.info("worker %d started (pid %d)%s", slot.index, pid, " to take over" * takeover)

    def _run_child(self, index: int, control_fd: int, reply_fd: int, takeover: bool) -> None:
        code = 1
        try:
            own = {control_fd, reply_fd}
            inherited = [fd for fd in self._parent_fds() if fd not in own]
            for slot in self._all_slots:
                inherited.extend(slot.fds())
            reset_after_fork(inherited)
            if self._inherited_fds is not None and (now := open_fds()) is not None:
                release_fds(fds_opened_since(self._inherited_fds, now, keep=own))
            context = WorkerContext(index, control_fd, os.getppid(), reply_fd, takeover)
            code = self._worker_main(context)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    # -- readiness and takeover ---------------------------------------------------------

    def _from_worker(self, slot: WorkerSlot, pid: int, message: Mapping[str, Any]) -> None:
        """A line on ``slot``'s reply pipe: an answer, or its ready report."""
        if message.get("op") != "ready":
            self._requests.answer(slot.index, pid, message)
            return
        if slot.pid != pid or slot.ready:
            return
        slot.ready = True
        log.info("worker %d (pid %d) ready", slot.index, pid)
        self._check_generation_ready()

    def _check_generation_ready(self) -> None:
        if self._generation_ready or self._stopping:
            return
        if not all(slot.pid and slot.ready for slot in self._slots):
            return
        self._generation_ready = True
        if self._older is not None:
            self._older.retire()
        if self._on_generation_ready is not None:
            self._on_generation_ready()

    # -- reaping and restarting ------------------------------------------------------------

    def _reap(self, slot: WorkerSlot) -> None:
        assert self._loop is not None
        try:
            pid, status = os.waitpid(slot.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = slot.pid, 0
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        dead_pid, slot.pid = slot.pid, 0
        self._requests.worker_gone(slot.index, dead_pid)
        lived_s = time.monotonic() - slot.started_at
        if self._older is not None and slot in self._older.slots:
            self._older.forget(slot)
            log.info("worker pid %d of the previous generation exited with %s", dead_pid, code)
        else:
            slot.release(self._loop)
        if self._on_worker_exit is not None:
            self._on_worker_exit(dead_pid, code)
        if self._stopping or slot not in self._slots:
            if slot in self._slots:
                log.info("worker %d (pid %d) exited with %s", slot.index, dead_pid, code)
            self._check_done()
            return
        slot.attempt = slot.attempt + 1 if lived_s < self._stable_after_s else 0
        delay = self._backoff.delay(max(0, slot.attempt - 1), self._rng) if slot.attempt else 0.0
        log.error(
            "worker %d (pid %d) died with %s after %.1fs; restarting in %.2fs",
            slot.index,
            dead_pid,
            code,
            lived_s,
            delay,
        )
        self._restarts += 1
        slot.restart = self._loop.call_later(delay, self._spawn, slot)

    def _check_done(self) -> None:
        if (
            self._stopping
            and self.running == 0
            and not self._older_slots
            and self._done
            and not self._done.done()
        ):
            self._done.set_result(None)

    def _kill_all(self) -> None:
        for slot in self._all_slots:
            if slot.pid:
                log.warning(
                    "worker %d (pid %d) did not stop in time: killing", slot.index, slot.pid
                )
                slot.signal(signal.SIGKILL)

    def _on_hup(self) -> None:
        if self._on_reload is not None:
            try:
                if self._on_reload() is False:
                    return
            except Exception:
                log.exception("reload failed")
        self._forward(signal.SIGHUP)

    def _forward(self, sig: int) -> None:
        for slot in self._all_slots:
            slot.signal(sig)
