"""``geoedge-origin --config origin.toml``: the origin balancer daemon.

Exit status: 0 after a clean stop, 2 for a bad command line or config (the
message names the file, table and key), 1 when start-up fails otherwise
(address in use, unreadable certificate).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import uvloop

from origin.config import load_origin_config
from origin.daemon import OriginDaemon
from tunnel.runtime.config import ConfigError
from tunnel.runtime.logs import configure_logging
from tunnel.runtime.version import add_version_option

__all__ = ["main"]

log = logging.getLogger("geoedge.origin")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geoedge-origin",
        description="geoedge origin balancer: accepts edge tunnels, balances streams "
        "over Node.js backends",
    )
    parser.add_argument("--config", required=True, help="path to origin.toml")
    parser.add_argument("--check", action="store_true", help="validate the config file and exit")
    add_version_option(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_origin_config(args.config)
    except ConfigError as exc:
        print(f"geoedge-origin: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: ok ({len(config.pools)} pool(s))")
        return 0
    configure_logging(config.origin.log_level, json=config.origin.log_json)
    daemon = OriginDaemon(config, config_path=args.config)
    try:
        return uvloop.run(daemon.run())
    except OSError as exc:
        log.error("origin failed to start: %s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
