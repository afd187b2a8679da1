"""What a daemon's supervisor hands to itself across ``execve`` when it reloads
(:mod:`geoedge.reload`): the record, how it travels, and the exec itself.

The supervisor re-executes itself *in place*, keeping its pid, as HAProxy's
master does (``-W``), rather than forking a new master as nginx's binary
upgrade does: systemd's main pid stays the same (``MAINPID=`` names the same
process), the workers of the old code remain this process's children (it
reaps them after the exec like any other), and nothing outlives the service by
accident. What must survive the exec survives as open descriptors, inherited
across it as nginx (``NGINX`` variable) and HAProxy (``-x``/``HAPROXY_MWORKER_FDS``)
do, and named in one environment variable, :data:`ENV`, a JSON object:

- ``pid``: the process it is meant for (like ``LISTEN_PID``); any other
  process ignores and drops it, so a child never takes its parent's sockets;
- ``sockets``: ``[fd, role, name]`` per listening socket: ``systemd`` (passed
  by socket activation at the first start, matched to the config again by
  address), ``bound`` (bound by the daemon itself: kept if the new config
  still has its address, else closed), ``admin`` (the admin listener, kept if
  its address did not change) and ``control`` (the reload socket);
- ``workers``: the live workers (:class:`geoedge.worker_slot.AdoptedWorker`: pid,
  slot, their two pipes' descriptors, whether they drain already);
- ``replies``: connections of reload clients waiting for the outcome;
- ``metrics_dir``: the multiprocess metrics directory the old workers write
  to (kept, not emptied: their counters go on);
- ``requested_at``: when the reload began (``CLOCK_MONOTONIC``), for its duration;
- ``state``: the daemon's own runtime state (the origin's drained backends).

Why descriptors rather than a hand-over over a Unix socket (``SCM_RIGHTS``,
HAProxy's ``-x``): in place there is no second process to talk to; the exec
keeps every descriptor not marked close-on-exec, so the sockets never close,
not even for a moment, and nothing is passed twice. Only the listed ones are
made inheritable; everything else the old supervisor had open closes at the
exec, so descriptors do not pile up over reloads.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from geoedge.worker_slot import AdoptedWorker

__all__ = ["ENV", "Inheritance", "InheritedSocket", "own_command", "reexec", "take_inheritance"]

ENV = "GEOEDGE_REEXEC"


@dataclass(frozen=True, slots=True)
class InheritedSocket:
    fd: int
    role: str
    """``systemd``, ``bound``, ``admin`` or ``control`` (module docstring)."""
    name: str
    """systemd's ``FileDescriptorName=``, or the setting that bound it."""

    def take(self) -> socket.socket:
        """The socket object (close-on-exec again: only a re-exec passes it on)."""
        os.set_inheritable(self.fd, False)
        sock = socket.socket(fileno=self.fd)
        sock.setblocking(False)
        return sock


@dataclass(frozen=True, slots=True)
class Inheritance:
    pid: int
    sockets: tuple[InheritedSocket, ...] = ()
    workers: tuple[AdoptedWorker, ...] = ()
    replies: tuple[int, ...] = ()
    metrics_dir: str | None = None
    requested_at: float = 0.0
    state: dict[str, Any] = field(default_factory=dict)

    def of_role(self, role: str) -> list[InheritedSocket]:
        return [s for s in self.sockets if s.role == role]

    def fds(self) -> list[int]:
        """Every descriptor the record names."""
        fds = [s.fd for s in self.sockets] + list(self.replies)
        for worker in self.workers:
            fds += [fd for fd in (worker.control_fd, worker.reply_fd) if fd >= 0]
        return fds

    def encode(self) -> str:
        return json.dumps(
            {
                "pid": self.pid,
                "sockets": [[s.fd, s.role, s.name] for s in self.sockets],
                "workers": [w.to_json() for w in self.workers],
                "replies": list(self.replies),
                "metrics_dir": self.metrics_dir,
                "requested_at": self.requested_at,
                "state": self.state,
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str) -> Inheritance:
        data = json.loads(text)
        return cls(
            pid=int(data["pid"]),
            sockets=tuple(
                InheritedSocket(int(fd), role, name) for fd, role, name in data["sockets"]
            ),
            workers=tuple(AdoptedWorker.from_json(w) for w in data["workers"]),
            replies=tuple(int(fd) for fd in data["replies"]),
            metrics_dir=data.get("metrics_dir"),
            requested_at=float(data.get("requested_at", 0.0)),
            state=dict(data.get("state") or {}),
        )


def take_inheritance(env: MutableMapping[str, str] | None = None) -> Inheritance | None:
    """The record left by the previous image of this process, if any (removed
    from the environment either way, so that nothing forked later sees it)."""
    env = os.environ if env is None else env
    text = env.pop(ENV, None)
    if text is None:
        return None
    inheritance = Inheritance.decode(text)
    if inheritance.pid != os.getpid():
        return None
    return inheritance


def own_command(orig_argv: Sequence[str] | None = None) -> list[str]:
    """The command line that started this process, as it must run again to
    load the code on disk now.

    Started as a script (``/usr/local/bin/geoedge-edge --config ...``: the
    kernel ran the interpreter of its ``#!`` line), it is the script again, so
    that the kernel reads the ``#!`` line again: after ``geoedge release
    activate`` the link leads to another release, whose interpreter and
    packages are not this process's. Started as ``python -m edge ...``, it is
    this interpreter with the same arguments."""
    argv = list(sys.orig_argv if orig_argv is None else orig_argv)
    if len(argv) > 1 and not argv[1].startswith("-") and _is_script(argv[1]):
        return argv[1:]
    return [sys.executable, *argv[1:]]


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!" and os.access(path, os.X_OK)
    except OSError:
        return False


def reexec(
    inheritance: Inheritance,
    *,
    argv: Sequence[str] | None = None,
    restore_env: dict[str, str] | None = None,
) -> None:
    """Execute this process's own command (:func:`own_command`) again, the
    code on disk now, passing ``inheritance``. Returns only if the exec failed
    (``OSError`` raised after the descriptors were made close-on-exec again)."""
    argv = own_command() if argv is None else list(argv)
    env = {**os.environ, **(restore_env or {}), ENV: inheritance.encode()}
    fds = inheritance.fds()
    for fd in fds:
        os.set_inheritable(fd, True)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(argv[0], argv, env)
    except OSError:
        for fd in fds:
            os.set_inheritable(fd, False)
        raise
