"""systemd integration for both daemons, without libsystemd: the two small
protocols a ``Type=notify`` service with socket activation speaks.

- ``sd_notify`` (``NOTIFY_SOCKET``): one datagram of ``KEY=value`` lines to a
  Unix socket whose path systemd gives (``@`` at the start: the abstract
  namespace). :class:`ServiceNotifier` sends ``READY=1`` once the daemon
  serves (the edge: every worker has a tunnel up and warm, or
  ``ready_timeout_s`` passed, so an edge whose origin is down still starts,
  and says why in ``STATUS=``), ``STATUS=`` lines as things change,
  ``RELOADING=1`` (with ``MONOTONIC_USEC=``) when a reload begins and
  ``READY=1`` when it ends (with ``MAINPID=``, this same pid: the supervisor
  re-executes in place, :mod:`geoedge.reload`), ``STOPPING=1`` when a drain
  starts, and
  ``WATCHDOG=1`` every half ``WatchdogSec=`` while the supervisor's event loop
  runs and a worker is alive: a supervisor stuck, or left with no worker,
  stops petting and systemd restarts the service.
- ``sd_listen_fds`` (``LISTEN_PID``, ``LISTEN_FDS``, ``LISTEN_FDNAMES``): the
  listening sockets systemd opened for us (``.socket`` units), descriptors 3
  and up. :func:`listen_sockets` takes them (once: the variables are removed
  so that nothing forked later takes them too); the daemons match them to
  their configured addresses and bind only what systemd did not pass. The
  sockets outlive the process, so a restart refuses no connection: the kernel
  queues them while no process accepts. A reload keeps them too, without
  systemd's help (:mod:`geoedge.reexec`).

Without ``NOTIFY_SOCKET`` (not under systemd) the notifier does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, MutableMapping

__all__ = ["ServiceNotifier", "listen_sockets"]

log = logging.getLogger("geoedge.systemd")

#: The first descriptor systemd passes (SD_LISTEN_FDS_START).
LISTEN_FDS_START = 3
#: How often the notifier looks at the daemon's state (readiness, stopping).
POLL_S = 0.5


def listen_sockets(
    env: MutableMapping[str, str] | None = None,
) -> list[tuple[str, socket.socket]]:
    """The sockets systemd passed to this process, with their names
    (``FileDescriptorName=``, or ``unknown``); none when the variables are
    absent or meant for another process (``LISTEN_PID``)."""
    env = os.environ if env is None else env
    pid, count = env.get("LISTEN_PID"), env.get("LISTEN_FDS")
    names = env.get("LISTEN_FDNAMES", "")
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(key, None)
    if pid is None or count is None or not pid.isdigit() or int(pid) != os.getpid():
        return []
    labels = names.split(":") if names else []
    found = []
    for index in range(int(count)):
        fd = LISTEN_FDS_START + index
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
        found.append((labels[index] if index < len(labels) else "unknown", sock))
    return found


def same_address(sock: socket.socket, host: str, port: int) -> bool:
    """Whether ``sock`` is bound where a listener configured as host:port would be."""
    bound = sock.getsockname()
    if not isinstance(bound, tuple) or bound[1] != port:
        return False
    wildcard = {"0.0.0.0", "::", ""}
    return bound[0] == host or (bound[0] in wildcard and host in wildcard)


class ServiceNotifier:
    """Tells systemd how the service is doing (see the module docstring)."""

    def __init__(self, env: MutableMapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._address = env.get("NOTIFY_SOCKET") or None
        usec = env.get("WATCHDOG_USEC", "")
        watchdog_pid = env.get("WATCHDOG_PID", "")
        mine = not watchdog_pid or watchdog_pid == str(os.getpid())
        self.watchdog_s = int(usec) / 1e6 / 2 if usec.isdigit() and mine and int(usec) else None
        #: What this notifier took from the environment: a re-exec of the
        #: supervisor (geoedge.reload) puts it back for its next image.
        self.environment: dict[str, str] = {}
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            value = env.pop(key, None)  # workers must not speak for the service
            if value is not None:
                self.environment[key] = value
        self._sock: socket.socket | None = None
        self.ready_sent = False
        self.stopping_sent = False
        self._status = ""

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *lines: str) -> None:
        if self._address is None:
            return
        address = self._address
        if address.startswith("@"):
            address = "\0" + address[1:]
        try:
            if self._sock is None:
                # Non-blocking: a notify socket whose reader is slow (its queue
                # full) must not stall the supervisor's event loop; the
                # datagram is dropped instead (the next STATUS= or WATCHDOG=1
                # follows within seconds).
                self._sock = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
                )
            self._sock.sendto("\n".join(lines).encode(), address)
        except OSError as exc:  # systemd gone or its queue full: nothing to tell
            log.debug("sd_notify to %s failed: %s", self._address, exc)

    def status(self, text: str) -> None:
        if text != self._status:
            self._status = text
            self.send(f"STATUS={text}")

    def ready(self, status: str) -> None:
        """READY=1, at start or at the end of a reload; ``MAINPID=`` with it
        names this process, the service's main one across a re-exec too
        (sd_notify(3): a daemon that re-executes says who the main process is)."""
        self._status = status
        self.ready_sent = True
        self.send("READY=1", f"MAINPID={os.getpid()}", f"STATUS={status}")

    def reloading(self) -> None:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading")

    def stopping(self, status: str) -> None:
        if self.stopping_sent:
            return
        self.stopping_sent = True
        self._status = status
        self.send("STOPPING=1", f"STATUS={status}")

    async def run(
        self,
        state: Callable[[], tuple[bool, bool, str]],
        *,
        ready_timeout_s: float,
        alive: Callable[[], bool],
    ) -> None:
        """Until cancelled: ``state()`` gives (ready, stopping, status text). READY=1
        at the first ready, or after ``ready_timeout_s`` whatever the state;
        STOPPING=1 once; WATCHDOG=1 while ``alive()``."""
        if self._address is None:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        next_pet = started
        while True:
            ready, stopping, text = state()
            now = loop.time()
            if stopping:
                self.stopping(text)
            elif not self.ready_sent and (ready or now - started >= ready_timeout_s):
                self.ready(text)
            elif not self.stopping_sent:
                self.status(text)
            if self.watchdog_s is not None and now >= next_pet:
                if alive():
                    self.send("WATCHDOG=1")
                next_pet = now + self.watchdog_s
            await asyncio.sleep(POLL_S)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
