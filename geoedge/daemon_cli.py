"""The command line both daemons share (``geoedge-edge``, ``geoedge-origin``):
``--config``, ``--check [--user]``, ``--reload PID``, ``--log-level``/``--log-format``
and ``--version``; what ``--check`` does with ``--user``; and how a problem found
before serving is reported: one line each on stderr, naming the config file,
then exit status 2 (a bad config or file) or 1 (an address that cannot be bound).

``--reload PID`` is the units' ``ExecReload=``: it asks the running supervisor
``PID`` to reload (:mod:`geoedge.reload`: it checks the config with the code on
disk, re-executes itself, replaces its workers) and waits for the outcome,
printing what the supervisor says; exit status 0 when the new workers serve,
2 when the config was refused (the old ones serve on), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from geoedge.config import ConfigError
from geoedge.logs import add_logging_options
from geoedge.preflight import run_as
from geoedge.reload_socket import request_reload
from geoedge.version import add_version_option

__all__ = [
    "RELOAD_TIMEOUT_S",
    "daemon_parser",
    "parse_daemon_args",
    "report",
    "run_check",
    "run_reload",
]

#: How long ``--reload`` waits for the outcome: below systemd's default
#: TimeoutStartSec (90 s), which also bounds ExecReload=.
RELOAD_TIMEOUT_S = 80.0

#: ``check(config_path, service_gid)``: the exit status of ``--check``.
Check = Callable[[str, int | None], int]


def daemon_parser(prog: str, description: str, config_file: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", required=True, help=f"path to {config_file}")
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the config, open every file it names, and exit",
    )
    parser.add_argument(
        "--user", help="with --check (as root): check as this user, e.g. the service's"
    )
    parser.add_argument(
        "--reload",
        type=int,
        metavar="PID",
        help="ask the running daemon PID to reload in place (code and config) and "
        "wait for the outcome (systemd: ExecReload=... --reload $MAINPID)",
    )
    parser.add_argument(
        "--reload-timeout",
        type=float,
        default=RELOAD_TIMEOUT_S,
        metavar="SECONDS",
        help=f"with --reload: how long to wait for the outcome (default {RELOAD_TIMEOUT_S:g})",
    )
    add_logging_options(parser)
    add_version_option(parser)
    return parser


def parse_daemon_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.user and not args.check:
        parser.error("--user goes with --check (the service manager picks the daemon's user)")
    if args.reload is not None and args.check:
        parser.error("--reload and --check: the daemon checks the config itself when it reloads")
    return args


def run_reload(args: argparse.Namespace, prog: str) -> int:
    """``--reload PID``: see the module docstring."""
    return request_reload(args.reload, timeout_s=args.reload_timeout, prog=prog)


def run_check(args: argparse.Namespace, check: Check) -> int:
    """``--check``: as ``--user`` (a child process with that user's ids, so file
    permissions are the service's), else as this process. Root checking for a
    service it was not named cannot know the service's group (``None``)."""
    if args.user:
        return run_as(args.user, lambda: check(args.config, os.getegid()))
    return check(args.config, None if os.geteuid() == 0 else os.getegid())


def report(prog: str, path: str, exc: Exception) -> None:
    """One line per problem, each naming the config file (ConfigError's do already)."""
    prefix = "" if isinstance(exc, ConfigError) else f"{path}: "
    for line in str(exc).splitlines():
        print(f"{prog}: {prefix}{line}", file=sys.stderr)
