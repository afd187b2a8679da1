"""The command line both daemons share (``geoedge-edge``, ``geoedge-origin``):
``--config``, ``--check [--user]``, ``--log-level``/``--log-format`` and
``--version``; what ``--check`` does with ``--user``; and how a problem found
before serving is reported: one line each on stderr, naming the config file,
then exit status 2 (a bad config or file) or 1 (an address that cannot be bound).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from geoedge.config import ConfigError
from geoedge.logs import add_logging_options
from geoedge.preflight import run_as
from geoedge.version import add_version_option

__all__ = ["daemon_parser", "parse_daemon_args", "report", "run_check"]

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
    add_logging_options(parser)
    add_version_option(parser)
    return parser


def parse_daemon_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.user and not args.check:
        parser.error("--user goes with --check (the service manager picks the daemon's user)")
    return args


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
