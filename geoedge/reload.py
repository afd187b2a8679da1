"""``systemctl reload``: an upgrade in place, for both daemons (DESIGN.md principle 13).

The sequence, in the supervisor (:class:`Reloader`):

1. A request: SIGHUP (``kill -HUP``), or a connection on the *reload socket*
   from ``geoedge-edge --reload PID`` (the units' ``ExecReload=``), which
   waits for the outcome. ``RELOADING=1`` goes to systemd at once.
2. The check: this process's own command line with ``--check``, in a fresh
   interpreter, so the code on disk now checks the config file now: config,
   every file it names, the TLS contexts, and that every address it wants and
   this process does not hold yet can be bound (nothing may fail after the
   exec: the old workers would go with the supervisor). A bad config is refused here with
   the check's own lines (one per problem, naming the key and the file); the
   supervisor and its workers go on as they were, ``READY=1`` ends the
   reload, and the client exits 2.
3. The exec (:func:`geoedge.reexec.reexec`): the supervisor becomes a fresh
   interpreter of the code on disk, in place (same pid), keeping its
   listening sockets, admin and reload sockets, its workers and the waiting
   clients' connections. Before it, the admin server answers the requests it
   holds and stops accepting (:meth:`geoedge.admin.AdminServer.hand_over`):
   a scrape or a purge is never cut, and one made meanwhile waits in the
   listener's queue for the new image.
4. The new supervisor loads the config and forks a new worker per slot from
   its own, fresh memory; each readies itself before it accepts (the edge:
   a tunnel to an origin up and warm, so nothing queues behind the tunnel's
   warm-up padding) and says so. Meanwhile the old workers serve.
5. Once every new worker is ready, the old ones are retired (SIGTERM): they
   stop accepting and drain as for a stop (the edge: ``Connection: close``
   after the request in hand, HTTP/2 GOAWAY, WebSockets closed with 1001
   spread over ``drain_websocket_window_s``; the origin: GOAWAY to the edges,
   whose new streams go to the new workers' tunnels while open ones finish).
   ``MAINPID=`` (the same pid) and ``READY=1`` go to systemd, the clients get
   ``ok``. If the new workers are not ready within ``takeover_timeout_s``,
   the clients get ``failed`` (exit 1) and the old workers keep serving until
   the new ones are.

A request while one runs waits for it and runs after it (it may bring a
newer file). systemd 252 (Debian 12) has no ``Type=notify-reload``;
``ExecReload=`` running the client is what makes ``systemctl reload`` wait
for the outcome and fail when the reload does: systemd ends the reload job
when that command exits, with its status.

The reload socket and its client: :mod:`geoedge.reload_socket`; the check:
:mod:`geoedge.reload_check`; what crosses the exec: :mod:`geoedge.reexec`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path

from geoedge.admin import AdminServer
from geoedge.listening import Listening, held_address
from geoedge.metrics import enable_multiprocess
from geoedge.reexec import Inheritance, InheritedSocket, own_command, reexec
from geoedge.reload_check import check_command, run_check
from geoedge.reload_socket import FAILED, OK, REFUSED, reload_socket_name
from geoedge.systemd import ServiceNotifier
from geoedge.workers import Supervisor

__all__ = [
    "Reloader",
    "handover_record",
    "held_sockets",
    "inherited_admin_and_reload",
    "start_metrics",
]

log = logging.getLogger("geoedge.reload")

#: How long a client of the reload socket has to send its request.
REQUEST_TIMEOUT_S = 5.0
_UCRED = struct.Struct("3i")


class Reloader:
    """The supervisor's side of a reload (module docstring).

    ``handover(replies, requested_at)`` builds the record the exec passes on
    (the daemon knows its sockets and state); ``inheritance`` is the record
    this process got from its previous image, if it is one."""

    def __init__(
        self,
        *,
        notifier: ServiceNotifier,
        handover: Callable[[list[int], float], Inheritance],
        takeover_timeout_s: float,
        inheritance: Inheritance | None = None,
        describe: Callable[[], str] = lambda: "",
        on_result: Callable[[str], None] = lambda result: None,
        held: Callable[[], list[socket.socket]] = list,
        admin: Callable[[], AdminServer | None] = lambda: None,
    ) -> None:
        """``describe()``: what the new generation runs, for the ``ok`` line;
        ``on_result(result)``: a reload ended (``ok``/``refused``/``failed``);
        ``held()``: the sockets the daemon listens on (the check may not bind
        their addresses, and need not); ``admin()``: the admin server, which
        answers the requests it holds before the exec (:meth:`AdminServer.hand_over`)."""
        self._notifier = notifier
        self._handover = handover
        self._takeover_timeout_s = takeover_timeout_s
        self._describe = describe
        self._on_result = on_result
        self._held = held
        self._admin = admin
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Clients of the reload that runs now, and of the one queued after it.
        self._current: list[socket.socket] = []
        self._queued: list[socket.socket] = []
        self._busy = False
        self._again = False
        self._stopping = False
        self._began = 0.0
        self._timeout: asyncio.TimerHandle | None = None
        self.inherited = inheritance is not None
        if inheritance is not None:
            # This process is the exec of a reload: it ends once the new
            # generation is ready (:meth:`generation_ready`).
            self._busy = True
            self._began = inheritance.requested_at
            self._current = [_socket_of(fd) for fd in inheritance.replies]
            notifier.ready_sent = True  # systemd knows the service; READY=1 ends the reload

    # -- life cycle ---------------------------------------------------------------------

    def start(self, inherited: socket.socket | None = None) -> None:
        """Listen on the reload socket (the previous image's, if inherited) and,
        after an exec, start the takeover's deadline."""
        loop = asyncio.get_running_loop()
        if inherited is not None:
            self._sock = inherited
        else:
            self._sock = _bind_reload_socket()
        self._accepting = loop.create_task(self._accept())
        if self._busy:
            self._timeout = loop.call_later(self._takeover_timeout_s, self._takeover_late)
            self._send(self._current, "the new supervisor runs: starting new workers")

    def close(self) -> None:
        """The daemon stops: waiting clients get ``failed``; no more requests."""
        self._stopping = True
        if self._timeout is not None:
            self._timeout.cancel()
        self._finish_all(FAILED, "the daemon is stopping")
        if self._accepting is not None:
            self._accepting.cancel()
        for task in self._tasks:
            task.cancel()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def listening_socket(self) -> socket.socket | None:
        """The reload socket (what an exec passes on)."""
        return self._sock

    def fds(self) -> list[int]:
        """The reload socket and the waiting clients' connections: a worker
        must not hold them (a client would never see its answer's EOF)."""
        socks = [self._sock, *self._current, *self._queued]
        return [s.fileno() for s in socks if s is not None and s.fileno() >= 0]

    # -- requests --------------------------------------------------------------------------

    def request(self, client: socket.socket | None = None) -> bool:
        """Reload now, or after the one that runs (SIGHUP: no client). Returns
        False: nothing else is to happen on the signal."""
        if self._stopping:
            if client is not None:
                _answer(client, FAILED, "the daemon is stopping")
            return False
        if self._busy:
            self._again = True
            if client is not None:
                self._queued.append(client)
                self._send([client], "a reload is under way: this one runs after it")
            return False
        if client is not None:
            self._current.append(client)
        self._busy = True
        self._began = time.clock_gettime(time.CLOCK_MONOTONIC)
        self._notifier.reloading()
        log.info("reload: checking the config with the code on disk")
        self._send(self._current, "checking the config with the code on disk")
        self._spawn(self._check_then_exec())
        return False

    async def _check_then_exec(self) -> None:
        held = [held_address(sock) for sock in self._held()]
        passed, lines = await asyncio.to_thread(run_check, check_command(), held)
        if not passed:
            reason = "; ".join(lines) or "the config check failed"
            self._finish(REFUSED, f"{reason} (the workers keep serving as they were)")
            return
        if self._stopping:
            return
        self._send(self._current, "config ok: re-executing")
        admin = self._admin()
        if admin is not None:
            await admin.hand_over()
            if self._stopping:
                return
        command = own_command()
        log.info("reload: re-executing %s", " ".join(command))
        record = self._handover([c.fileno() for c in self._current], self._began)
        try:
            reexec(record, argv=command, restore_env=self._notifier.environment)
        except OSError as exc:
            if admin is not None:
                await admin.start(admin.listening_socket())
            self._finish(FAILED, f"cannot execute {command[0]}: {exc}")

    # -- after the exec ------------------------------------------------------------------------

    def generation_ready(self) -> None:
        """Every new worker is ready and the old ones were retired."""
        if self._busy and self.inherited:
            took = time.clock_gettime(time.CLOCK_MONOTONIC) - self._began
            self._finish(OK, f"{self._describe()}; took {took:.1f} s")

    def _takeover_late(self) -> None:
        self._timeout = None
        if not self._busy:
            return
        self._finish(
            FAILED,
            f"the new workers were not ready after {self._takeover_timeout_s:g} s "
            "(see the log): the previous workers keep serving until they are",
        )

    def _finish(self, result: str, text: str) -> None:
        if self._timeout is not None:
            self._timeout.cancel()
            self._timeout = None
        self.inherited = False
        self._busy = False
        self._on_result(result)
        (log.info if result == OK else log.error)("reload %s: %s", result, text)
        self._notifier.ready(f"reload {result}: {text}")
        self._finish_all(result, text)
        if self._again and not self._stopping:
            self._again = False
            queued, self._queued = self._queued, []
            self._current = []
            if queued:
                for client in queued:
                    self.request(client)
            else:
                self.request()

    def _finish_all(self, result: str, text: str) -> None:
        clients, self._current = self._current, []
        for client in clients:
            _answer(client, result, text)

    # -- the reload socket ----------------------------------------------------------------------

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                client, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and the like: try again shortly
                log.warning("reload socket: accept failed: %s", exc)
                await asyncio.sleep(0.5)
                continue
            self._spawn(self._serve(client))

    async def _serve(self, client: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        pid, uid, _ = _UCRED.unpack(
            client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
        if uid not in (0, os.geteuid()):
            log.warning("reload socket: refused pid %d (uid %d)", pid, uid)
            client.close()
            return
        line = b""
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                while not line.endswith(b"\n") and len(line) < 64:
                    chunk = await loop.sock_recv(client, 64)
                    if not chunk:
                        break
                    line += chunk
        if line.strip() != b"reload":
            client.close()
            return
        log.info("reload requested by pid %d", pid)
        self.request(client)

    def _spawn(self, coroutine: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def _send(clients: Sequence[socket.socket], *lines: str) -> None:
        for client in clients:
            with contextlib.suppress(OSError):
                client.settimeout(2.0)  # a few hundred octets: a client that reads gets them
                client.sendall("".join(f"{line}\n" for line in lines).encode())


def start_metrics(inheritance: Inheritance | None) -> Path:
    """Multiprocess metrics on: the previous image's directory after a reload
    (its workers still write there), a fresh one at a first start."""
    if inheritance is not None and inheritance.metrics_dir is not None:
        return enable_multiprocess(inheritance.metrics_dir, keep=True)
    return enable_multiprocess()


def inherited_admin_and_reload(
    inheritance: Inheritance | None,
) -> tuple[socket.socket | None, socket.socket | None]:
    """The admin listener and the reload socket of the supervisor's previous
    image (none at a first start)."""
    if inheritance is None:
        return None, None
    admin = next((s.take() for s in inheritance.of_role("admin")), None)
    control = next((s.take() for s in inheritance.of_role("control")), None)
    return admin, control


def held_sockets(listening: Listening, admin: AdminServer | None) -> list[socket.socket]:
    """What a daemon listens on (a reload's check need not bind it)."""
    admin_sock = admin.listening_socket() if admin is not None else None
    return [*listening.sockets, *([admin_sock] if admin_sock is not None else [])]


def handover_record(
    *,
    listening: Listening,
    admin: AdminServer | None,
    reloader: Reloader,
    supervisor: Supervisor | None,
    metrics_dir: str | None,
    replies: list[int],
    requested_at: float,
    state: dict[str, object] | None = None,
) -> Inheritance:
    """What a supervisor passes to its next image (:mod:`geoedge.reexec`)."""
    sockets = listening.handover()
    admin_sock = admin.listening_socket() if admin is not None else None
    if admin_sock is not None:
        sockets.append(InheritedSocket(admin_sock.fileno(), "admin", "[admin] address"))
    reload_sock = reloader.listening_socket()
    if reload_sock is not None:
        sockets.append(InheritedSocket(reload_sock.fileno(), "control", "reload"))
    return Inheritance(
        pid=os.getpid(),
        sockets=tuple(sockets),
        workers=tuple(supervisor.handover()) if supervisor is not None else (),
        replies=tuple(replies),
        metrics_dir=metrics_dir,
        requested_at=requested_at,
        state=dict(state or {}),
    )


def _bind_reload_socket() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.bind(reload_socket_name(os.getpid()))
    sock.listen(16)
    sock.setblocking(False)
    return sock


def _socket_of(fd: int) -> socket.socket:
    os.set_inheritable(fd, False)
    return socket.socket(fileno=fd)


def _answer(client: socket.socket, result: str, text: str) -> None:
    with contextlib.suppress(OSError):
        client.settimeout(2.0)
        client.sendall(f"{result} {text}\n".encode())
    client.close()
