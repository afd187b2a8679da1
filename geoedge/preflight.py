"""What a daemon checks before it serves: the files it will open, the addresses
it will bind, and who it runs as. Shared by both daemons' ``--check`` and
start-up, so that an operator error is one line naming the file or the
setting, never a worker crash loop or a traceback.

- :func:`check_files` opens every file a daemon will read (certificates,
  private keys, CAs, OCSP responses) and checks that the files it will write
  (the access log) can be written, all as the current process, and refuses a
  private key that users other than the service can read: any permission for
  others, or for a group other than the service's own group (``root:geoedge
  0640`` with the service in group ``geoedge`` is fine; ``0644`` is not).
  Every problem is reported, not just the first.
  At start-up the service's group is the daemon's own; ``--check`` run as
  root without ``--user`` cannot know it and checks only the "others" bits.
- :func:`run_as` runs a check as another user (``--check --user geoedge`` as
  root): a forked child drops to that user's uid, gid and groups, so the
  answer is the service's own, permissions and ACLs included.
- :class:`ListenError` names the setting and the address of a failed bind.
"""

from __future__ import annotations

import grp
import importlib
import os
import pwd
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "FileCheck",
    "ListenError",
    "PreflightError",
    "check_files",
    "key_mode_problem",
    "run_as",
]

#: Modules the standard library imports on first use during a check (ssl's
#: host names); imported before switching users, who may not read them.
_LAZY_IMPORTS = ("encodings.idna",)

FileKind = Literal["certificate", "private key", "CA", "OCSP response", "log file"]


class PreflightError(Exception):
    """Problems found before serving: one line each, naming the file or setting."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class ListenError(OSError):
    """A listening socket could not be bound: ``<setting> <address>: <reason>``."""

    def __init__(self, setting: str, address: str, cause: OSError) -> None:
        reason = os.strerror(cause.errno) if cause.errno else str(cause)
        super().__init__(cause.errno, reason)
        self.message = f"{setting} {address}: {reason}"

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class FileCheck:
    """A file the daemon will open, and the setting that names it."""

    path: Path
    kind: FileKind
    setting: str
    """Where the config names it, e.g. ``[[tls.certificates]] key``."""


def key_mode_problem(path: Path, st: os.stat_result, service_gid: int | None) -> str | None:
    """Why a private key's permissions are unsafe, or None (pure: a stat result
    in). ``service_gid`` None: the service's group is not known (``--check`` as
    root without ``--user``), so only access for everyone is refused."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o007:
        who = "everyone"
    elif mode & 0o070 and service_gid is not None and st.st_gid != service_gid:
        who = f"group {_group_name(st.st_gid)}, which is not the service's"
    else:
        return None
    return (
        f"{path}: private key mode {mode:04o} lets {who} read it; "
        f"chmod 600 {path} (or 640 with the service's group)"
    )


def check_files(checks: Iterable[FileCheck], *, service_gid: int | None) -> None:
    """Open (or, for a log file, check writable) every file in ``checks`` as
    this process; :class:`PreflightError` lists every problem. ``service_gid``:
    the group the service runs as (see :func:`key_mode_problem`)."""
    gid = service_gid
    problems: list[str] = []
    seen: set[Path] = set()
    for check in checks:
        if check.path in seen:
            continue
        seen.add(check.path)
        problem = _check_one(check, gid)
        if problem is not None:
            problems.append(f"{check.setting}: {problem}")
    if problems:
        raise PreflightError(problems)


def _check_one(check: FileCheck, service_gid: int | None) -> str | None:
    path = check.path
    if check.kind == "log file":
        return _check_writable(path)
    try:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            f.read(1)
    except OSError as exc:
        return f"{path}: cannot read the {check.kind} ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: the {check.kind} is not a regular file"
    if check.kind == "private key":
        return key_mode_problem(path, st, service_gid)
    return None


def _check_writable(path: Path) -> str | None:
    """The log file can be appended to, or created in its directory."""
    if path.exists():
        if not os.access(path, os.W_OK):
            return f"{path}: the log file is not writable by {_user_name(os.geteuid())}"
        return None
    directory = path.parent
    while not directory.is_dir():  # the daemon creates what is missing (AccessLog)
        if directory.exists() or directory == directory.parent:
            return f"{path}: {directory} is not a directory"
        directory = directory.parent
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{path}: directory {directory} is not writable by {_user_name(os.geteuid())}"
    return None


def run_as(user: str, check: Callable[[], int]) -> int:
    """Run ``check`` in a child process as ``user`` (its uid, primary gid and
    groups) and return its exit status. Needs root, unless ``user`` is the
    current user (then ``check`` runs here)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        print(f"no such user: {user}", file=sys.stderr)
        return 2
    if entry.pw_uid == os.geteuid():
        return check()
    if os.geteuid() != 0:
        print(
            f"checking as {user} needs root (running as {_user_name(os.geteuid())})",
            file=sys.stderr,
        )
        return 2
    for module in _LAZY_IMPORTS:  # the interpreter's files may be unreadable to ``user``
        importlib.import_module(module)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.setgroups(os.getgrouplist(user, entry.pw_gid))
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            code = check()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            print(f"check as {user} failed: {exc}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
