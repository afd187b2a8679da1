"""``geoedge-origin --config origin.toml``: the origin balancer daemon.

Exit status: 0 after a clean stop, 2 for a bad command line, config or file
(one line per problem, naming the file and the setting: a missing or
unreadable certificate, key or CA, a private key others can read), 1 when
start-up fails otherwise (an address in use: the message names the setting).
``--reload PID`` asks a running origin to reload in place (:mod:`geoedge.reload`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import uvloop

from geoedge.config import ConfigError
from geoedge.daemon_cli import daemon_parser, parse_daemon_args, report, run_check, run_reload
from geoedge.listening import check_bindable
from geoedge.logs import configure_logging, logging_choice
from geoedge.preflight import FileCheck, ListenError, PreflightError, check_files
from geoedge.reexec import take_inheritance
from geoedge.version import running_version
from origin.config import OriginConfig, load_origin_config
from origin.daemon import OriginDaemon
from tunnel.aio.tls import TunnelTlsError
from tunnel.aio.transport import listener_ssl_context

__all__ = ["main"]

log = logging.getLogger("geoedge.origin")


PROG = "geoedge-origin"


def build_parser() -> argparse.ArgumentParser:
    return daemon_parser(
        PROG,
        "geoedge origin balancer: accepts edge tunnels, balances streams over Node.js backends",
        "origin.toml",
    )


def origin_files(config: OriginConfig) -> list[FileCheck]:
    """Every file the origin opens, with the setting that names it."""
    listener = config.tunnel_listener
    named = (
        (listener.cert, "certificate", "cert"),
        (listener.key, "private key", "key"),
        (listener.ca, "CA", "ca"),
    )
    return [
        FileCheck(path, kind, f"[tunnel_listener] {key}")  # type: ignore[arg-type]
        for path, kind, key in named
        if path is not None
    ]


def preflight(path: str, *, service_gid: int | None) -> OriginConfig:
    """Load the config, open every file it names, build the tunnel's TLS context:
    what ``--check`` does and what start-up does first (``service_gid``: see
    :func:`~geoedge.preflight.key_mode_problem`)."""
    config = load_origin_config(path)
    check_files(origin_files(config), service_gid=service_gid)
    try:
        listener_ssl_context(config.tunnel_listener)
    except TunnelTlsError as exc:
        raise TunnelTlsError(f"[tunnel_listener]: {exc}") from exc
    return config


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_daemon_args(build_parser(), argv)
    if args.reload is not None:
        return run_reload(args, PROG)
    if args.check:
        return run_check(args, _check)
    inheritance = take_inheritance()  # this is the exec of a reload (geoedge.reload)
    running_version()  # read once, before any fork: what every worker reports
    try:
        config = preflight(args.config, service_gid=os.getegid())
    except (ConfigError, PreflightError, TunnelTlsError) as exc:
        report(PROG, args.config, exc)
        return 2
    level, json_lines = logging_choice(args, config.origin.log_level, config.origin.log_json)
    configure_logging(level, json=json_lines)
    daemon = OriginDaemon(config, config_path=args.config, inheritance=inheritance)
    try:
        return uvloop.run(daemon.run())
    except ListenError as exc:
        report(PROG, args.config, exc)
        return 1
    except (OSError, TunnelTlsError) as exc:
        log.error("origin failed to start: %s", exc)
        return 1


def _check(path: str, service_gid: int | None) -> int:
    try:
        config = preflight(path, service_gid=service_gid)
        check_bindable(  # a reload's check only
            [
                ("[tunnel_listener] address", config.tunnel_listener.address),
                ("[admin] address", config.admin.address),
            ]
        )
    except (ConfigError, PreflightError, TunnelTlsError) as exc:
        report(PROG, path, exc)
        return 2
    print(f"{path}: ok ({len(config.pools)} pool(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
