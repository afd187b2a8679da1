"""What a forked worker does with the descriptors it got from its supervisor
(:mod:`geoedge.workers`): close the ones it was told about, and release the
ones the supervisor opened after it started supervising.

Released, not closed: a released descriptor is pointed at ``/dev/null``
(:func:`release_fds`), because the supervisor's Python objects that own it
live on in the child and may close their number some day (a socket in a
garbage cycle, prometheus_client closing the parent's files after the fork);
a closed number could by then belong to one of the worker's own sockets.
Descriptors are compared by identity (``st_dev``, ``st_ino``), not number: a
descriptor closed since, whose number now belongs to something else, must not
pass for the old one. Without ``/proc`` there is no record, and a worker
inherits everything open at its fork but the descriptors it was told about.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
from collections.abc import Container, Iterable, Mapping, Sequence

__all__ = ["PARENT_SIGNALS", "FdIdentity", "fds_opened_since", "open_fds", "release_fds"]

#: Signals whose supervisor-side handlers a child must not inherit.
PARENT_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD,
)  # fmt: skip

#: What a descriptor refers to: ``(st_dev, st_ino)`` of its open file.
FdIdentity = tuple[int, int]


def reset_after_fork(inherited_fds: Iterable[int]) -> None:
    """In a fresh child: forget the parent's loop, signals and descriptors."""
    asyncio.events._set_running_loop(None)  # 3.11 does not reset it at fork (3.12 does)
    asyncio.set_event_loop(None)
    signal.set_wakeup_fd(-1)
    for sig in PARENT_SIGNALS:
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


def open_fds() -> dict[int, FdIdentity] | None:
    """The descriptors open in this process and what each refers to; None without
    ``/proc``."""
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


def fds_opened_since(
    before: Mapping[int, FdIdentity], now: Mapping[int, FdIdentity], *, keep: Container[int]
) -> list[int]:
    """Descriptors in ``now`` that ``before`` did not have (or had, for another
    file), apart from ``keep`` and stdin/stdout/stderr, which stay whatever they are."""
    return sorted(
        fd
        for fd, identity in now.items()
        if fd > 2 and fd not in keep and before.get(fd) != identity
    )


def release_fds(fds: Sequence[int]) -> None:
    """Point each of ``fds`` at ``/dev/null``: the file it referred to is no longer
    held here, yet its number stays taken (see the module docstring)."""
    if not fds:
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd in fds:
            try:
                os.dup2(null, fd, inheritable=False)
            except OSError as exc:
                # EBADF: a number this process may not use, above its open-file
                # limit, where a tool running it (valgrind) keeps its own files.
                if exc.errno != errno.EBADF:
                    raise
    finally:
        os.close(null)
