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
- on SIGHUP calls the daemon's ``on_reload`` in the parent, then forwards SIGHUP
  to the workers (a worker must handle or ignore it: its default is to die),
  unless ``on_reload`` returned False (the parent found the new files bad and
  said so once: the workers keep what they have);
- forwards SIGUSR1 (reopen logs) and SIGUSR2 (log a memory report,
  :mod:`geoedge.memory`) to the workers; a worker ignores both until it
  takes them;
- keeps a *control pipe* to each worker: :meth:`Supervisor.broadcast` sends a
  JSON object per line (the origin sends pool snapshots and drains this way),
  and :func:`listen_control` reads them in the worker. EOF on that pipe tells
  a worker its parent is gone. A *reply pipe* runs the other way:
  :meth:`Supervisor.request` sends a request to every worker and gathers
  their answers (:mod:`geoedge.worker_requests`; the origin's admin asks its
  workers to send a tunnel CONTROL message this way).

A worker is a function ``worker_main(WorkerContext) -> exit status`` run in the
child right after the fork. It must start its own event loop (the parent's is
unusable there); the child ends with ``os._exit`` so nothing of the parent's
(atexit handlers, the parent loop's cleanup) runs twice.

Why fork from inside the parent's running loop: restarts happen while the admin
listener runs. In the child, :func:`_reset_after_fork` forgets the parent's
running loop (Python 3.12 does this itself at fork; 3.11 does not), restores
default signal dispositions and closes the parent's descriptors it was told
about (``parent_fds``) and the other workers' control pipes and pidfds. The
parent's threads (the DNS resolver's) do not exist in the child, which touches
nothing of theirs.

What a worker inherits: stdin/stdout/stderr, its own control pipe, and the
descriptors that were open when :meth:`Supervisor.run` started (minus
``parent_fds``): the listening sockets, the TLS material, the log streams,
prometheus_client's mmap files -- open what the workers need before ``run``.
Anything the parent opened since (an accepted admin connection, a health
check's socket, a DNS query's) is released in a worker forked later, a
restarted one, or it would keep the connection open after the parent closed
it (its peer never sees EOF). Released, not closed: it is pointed at
``/dev/null`` (:func:`_release_fds`), because the parent's Python objects that
own it live on in the child and may close their number some day (a socket in
a garbage cycle, prometheus_client closing the parent's files after the fork);
a closed number could by then belong to one of the worker's own sockets.
Without ``/proc`` there is no record, and a worker inherits everything open at
its fork but the descriptors listed above.

``workers = 1`` still forks one worker: the parent is the same in production
and in tests. Daemons offer an in-process mode of their own for fine-grained
tests (the origin's :class:`origin.daemon.OriginDaemon` with ``in_process=True``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from geoedge.worker_requests import (
    PendingRequests,
    ReplyReader,
    RequestHandler,
    RequestServer,
    WorkerAnswer,
)
from tunnel.policy import Backoff

__all__ = [
    "Supervisor",
    "SupervisorStatistics",
    "WorkerContext",
    "listen_control",
    "resolve_worker_count",
    "worker_share",
]

log = logging.getLogger("geoedge.workers")

#: Signals whose parent-side handlers a child must not inherit.
_PARENT_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD,
)  # fmt: skip
#: Bytes of control messages kept for a worker that does not read them; past
#: this the worker is considered stuck and killed (it will be restarted).
MAX_CONTROL_BACKLOG = 16 * 1024 * 1024


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
    """Write end of the reply pipe (:mod:`geoedge.worker_requests`); -1: none."""


WorkerMain = Callable[[WorkerContext], int]
#: What a descriptor refers to: ``(st_dev, st_ino)`` of its open file.
FdIdentity = tuple[int, int]


@dataclass(frozen=True, slots=True)
class SupervisorStatistics:
    target: int
    running: int
    restarts: int
    stopping: bool
    pids: tuple[int, ...]


@dataclass(slots=True, eq=False)
class _Slot:
    index: int
    pid: int = 0
    pidfd: int = -1
    control: _ControlWriter | None = None
    replies: ReplyReader | None = None
    started_at: float = 0.0
    attempt: int = 0
    restart: asyncio.TimerHandle | None = None


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
        rng: random.Random | None = None,
    ) -> None:
        self._worker_main = worker_main
        self.target = resolve_worker_count(workers)
        self._stop_timeout_s = stop_timeout_s
        self._backoff = restart_backoff or Backoff(base_s=0.5, cap_s=30.0)
        self._stable_after_s = stable_after_s
        self._on_reload = on_reload
        self._on_worker_exit = on_worker_exit
        self._parent_fds = parent_fds
        self._on_stopping = on_stopping
        self._rng = rng or random.Random()
        self._slots = [_Slot(i) for i in range(self.target)]
        self._restarts = 0
        self._stopping = False
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
        self._inherited_fds = _open_fds()
        try:
            for slot in self._slots:
                if not self._stopping:
                    self._spawn(slot)
            if self._stopping:
                self._check_done()
            await self._done
        finally:
            for sig in _PARENT_SIGNALS[:-1]:  # all but SIGCHLD, never handled here
                loop.remove_signal_handler(sig)
            if self._kill_timer is not None:
                self._kill_timer.cancel()

    def stop(self) -> None:
        """Stop restarting, SIGTERM every worker, SIGKILL them after
        ``stop_timeout_s``. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        log.info("stopping %d worker(s)", self.running)
        if self._on_stopping is not None:
            self._on_stopping()  # e.g. STOPPING=1 to systemd, before the drain
        for slot in self._slots:
            if slot.restart is not None:
                slot.restart.cancel()
                slot.restart = None
            self._signal(slot, signal.SIGTERM)
        if self._loop is not None:
            self._kill_timer = self._loop.call_later(self._stop_timeout_s, self._kill_all)
            self._check_done()

    def broadcast(self, message: Mapping[str, Any]) -> None:
        """Send ``message`` (JSON-serializable) to every running worker."""
        line = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        for slot in self._slots:
            if slot.control is not None and not slot.control.send(line):
                log.error(
                    "worker %d (pid %d) is not reading its control pipe", slot.index, slot.pid
                )
                self._signal(slot, signal.SIGKILL)

    async def request(self, message: Mapping[str, Any], timeout_s: float) -> list[WorkerAnswer]:
        """Send ``message`` as a request to every running worker and wait up to
        ``timeout_s`` for their answers: one per worker asked, in slot order
        (:mod:`geoedge.worker_requests`). Raises ``TooManyRequests`` when too
        many wait already."""
        asked = {slot.index: slot.pid for slot in self._slots if slot.control is not None}
        request_id = self._requests.open(asked)
        line = (json.dumps({**message, "request_id": request_id}) + "\n").encode()
        for slot in self._slots:
            if slot.control is not None and not slot.control.send(line):
                log.error(
                    "worker %d (pid %d) is not reading its control pipe", slot.index, slot.pid
                )
                self._signal(slot, signal.SIGKILL)
        return await self._requests.wait(request_id, timeout_s)

    @property
    def running(self) -> int:
        return sum(1 for slot in self._slots if slot.pid)

    @property
    def all_running(self) -> bool:
        return self.running == self.target and not self._stopping

    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(
            target=self.target,
            running=self.running,
            restarts=self._restarts,
            stopping=self._stopping,
            pids=tuple(slot.pid for slot in self._slots if slot.pid),
        )

    # -- forking -----------------------------------------------------------------------

    def _spawn(self, slot: _Slot) -> None:
        assert self._loop is not None
        slot.restart = None
        if self._stopping:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            read_fd, write_fd = os.pipe()
            try:
                reply_read_fd, reply_write_fd = os.pipe()
            except OSError:
                os.close(read_fd)
                os.close(write_fd)
                raise
            try:
                pid = os.fork()
            except OSError:
                for fd in (read_fd, write_fd, reply_read_fd, reply_write_fd):
                    os.close(fd)
                raise
        except OSError as exc:  # EAGAIN, ENOMEM, EMFILE: try again later
            slot.attempt += 1
            delay = self._backoff.delay(slot.attempt, self._rng)
            log.error("cannot fork worker %d (%s); retrying in %.2fs", slot.index, exc, delay)
            slot.restart = self._loop.call_later(delay, self._spawn, slot)
            return
        if pid == 0:  # the child: never returns
            os.close(write_fd)
            os.close(reply_read_fd)
            self._run_child(slot.index, read_fd, reply_write_fd)
        os.close(read_fd)
        os.close(reply_write_fd)
        slot.pid = pid
        slot.started_at = time.monotonic()
        slot.control = _ControlWriter(self._loop, write_fd)
        slot.replies = ReplyReader(
            self._loop, reply_read_fd, lambda reply: self._requests.answer(slot.index, pid, reply)
        )
        slot.pidfd = os.pidfd_open(pid)
        self._loop.add_reader(slot.pidfd, self._reap, slot)
        log.info("worker %d started (pid %d)", slot.index, pid)

    def _run_child(self, index: int, control_fd: int, reply_fd: int) -> None:
        code = 1
        try:
            own = {control_fd, reply_fd}
            inherited = [fd for fd in self._parent_fds() if fd not in own]
            for slot in self._slots:
                if slot.control is not None:
                    inherited.append(slot.control.fd)
                if slot.replies is not None:
                    inherited.append(slot.replies.fd)
                if slot.pidfd >= 0:
                    inherited.append(slot.pidfd)
            _reset_after_fork(inherited)
            if self._inherited_fds is not None and (now := _open_fds()) is not None:
                _release_fds(_fds_opened_since(self._inherited_fds, now, keep=own))
            code = self._worker_main(WorkerContext(index, control_fd, os.getppid(), reply_fd))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    # -- reaping and restarting ------------------------------------------------------------

    def _reap(self, slot: _Slot) -> None:
        assert self._loop is not None
        try:
            pid, status = os.waitpid(slot.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = slot.pid, 0
        if pid == 0:
            return
        self._loop.remove_reader(slot.pidfd)
        os.close(slot.pidfd)
        slot.pidfd = -1
        if slot.control is not None:
            slot.control.close()
            slot.control = None
        if slot.replies is not None:
            slot.replies.close()
            slot.replies = None
        code = os.waitstatus_to_exitcode(status)
        dead_pid, slot.pid = slot.pid, 0
        self._requests.worker_gone(slot.index, dead_pid)
        lived_s = time.monotonic() - slot.started_at
        if self._on_worker_exit is not None:
            self._on_worker_exit(dead_pid, code)
        if self._stopping:
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
        if self._stopping and self.running == 0 and self._done and not self._done.done():
            self._done.set_result(None)

    def _kill_all(self) -> None:
        for slot in self._slots:
            if slot.pid:
                log.warning(
                    "worker %d (pid %d) did not stop in time: killing", slot.index, slot.pid
                )
                self._signal(slot, signal.SIGKILL)

    def _signal(self, slot: _Slot, sig: int) -> None:
        if slot.pid and slot.pidfd >= 0:
            try:
                signal.pidfd_send_signal(slot.pidfd, sig)
            except ProcessLookupError:
                pass

    def _on_hup(self) -> None:
        if self._on_reload is not None:
            try:
                if self._on_reload() is False:
                    return
            except Exception:
                log.exception("reload failed")
        self._forward(signal.SIGHUP)

    def _forward(self, sig: int) -> None:
        for slot in self._slots:
            self._signal(slot, sig)


def _reset_after_fork(inherited_fds: Iterable[int]) -> None:
    """In a fresh child: forget the parent's loop, signals and descriptors."""
    asyncio.events._set_running_loop(None)  # 3.11 does not reset it at fork (3.12 does)
    asyncio.set_event_loop(None)
    signal.set_wakeup_fd(-1)
    for sig in _PARENT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    # A log reopen or memory report asked for before the worker takes it: none.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    for fd in inherited_fds:
        try:
            os.close(fd)
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise


def _open_fds() -> dict[int, FdIdentity] | None:
    """The descriptors open in this process and what each refers to; None without
    ``/proc``. Identities, not just numbers: a descriptor closed since, whose
    number now belongs to something else, must not pass for the old one."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    fds: dict[int, FdIdentity] = {}
    for name in names:
        fd = int(name)
        try:
            stat = os.fstat(fd)
        except OSError:  # listdir's own descriptor, closed by now
            continue
        fds[fd] = (stat.st_dev, stat.st_ino)
    return fds


def _fds_opened_since(
    before: Mapping[int, FdIdentity], now: Mapping[int, FdIdentity], *, keep: Container[int]
) -> list[int]:
    """Descriptors in ``now`` that ``before`` did not have (or had, for another
    file), apart from ``keep`` and stdin/stdout/stderr, which stay whatever they are."""
    return sorted(
        fd
        for fd, identity in now.items()
        if fd > 2 and fd not in keep and before.get(fd) != identity
    )


def _release_fds(fds: Sequence[int]) -> None:
    """Point each of ``fds`` at ``/dev/null``: the file it referred to is no longer
    held here, yet its number stays taken, so a stale owner that closes it later
    cannot close an unrelated descriptor that reused the number (see the module
    docstring)."""
    if not fds:
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd in fds:
            os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


class _ControlWriter:
    """Non-blocking writer of a control pipe with a bounded backlog."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._loop = loop
        self.fd = fd
        os.set_blocking(fd, False)
        self._backlog = bytearray()
        self._watching = False

    def send(self, data: bytes) -> bool:
        """Queue ``data``; False when the backlog is over its cap."""
        if self.fd < 0:
            return True
        self._backlog += data
        if len(self._backlog) > MAX_CONTROL_BACKLOG:
            return False
        self._flush()
        return True

    def _flush(self) -> None:
        try:
            while self._backlog:
                written = os.write(self.fd, self._backlog)
                del self._backlog[:written]
        except BlockingIOError:
            pass
        except OSError:  # the worker is gone; its reaping closes us
            self._backlog.clear()
        if self._backlog and not self._watching:
            self._loop.add_writer(self.fd, self._flush)
            self._watching = True
        elif not self._backlog and self._watching:
            self._loop.remove_writer(self.fd)
            self._watching = False

    def close(self) -> None:
        if self.fd < 0:
            return
        if self._watching:
            self._loop.remove_writer(self.fd)
        os.close(self.fd)
        self.fd = -1


# --------------------------------------------------------------------------- worker side


@dataclass(slots=True)
class _ControlReader(asyncio.Protocol):
    on_message: Callable[[dict[str, Any]], None]
    on_parent_gone: Callable[[], None]
    requests: RequestServer | None = None
    buffer: bytearray = field(default_factory=bytearray)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\n")) >= 0:
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            try:
                message = json.loads(line)
            except ValueError:
                log.error("bad control message from the parent: %r", line[:200])
                continue
            if self.requests is not None and "request_id" in message:
                self.requests.handle(message)
                continue
            try:
                self.on_message(message)
            except Exception:
                log.exception("control message %r failed", message.get("op"))

    def eof_received(self) -> bool:
        self.on_parent_gone()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        return None


async def listen_control(
    context: WorkerContext,
    on_message: Callable[[dict[str, Any]], None],
    on_parent_gone: Callable[[], None],
    on_request: RequestHandler | None = None,
) -> asyncio.BaseTransport:
    """In a worker: call ``on_message(dict)`` for each message the parent broadcasts,
    and ``on_parent_gone()`` at EOF (the parent died). With ``on_request``, a
    request of :meth:`Supervisor.request` is answered on the reply pipe with
    what ``await on_request(dict)`` returns. Returns the pipe's transport."""
    loop = asyncio.get_running_loop()
    requests = None
    if on_request is not None and context.reply_fd >= 0:
        requests = RequestServer(on_request, _ControlWriter(loop, context.reply_fd).send)
    pipe = os.fdopen(context.control_fd, "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(
        lambda: _ControlReader(on_message, on_parent_gone, requests), pipe
    )
    return transport
