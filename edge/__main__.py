"""``geoedge-edge --config edge.toml``: the regional edge daemon.

The supervisor loads and checks the configuration, builds the TLS contexts and
binds the listening sockets, then runs the workers (:mod:`edge.worker`) that
share them. Signals: SIGTERM/SIGINT drain (stop accepting, finish in-flight
requests up to ``drain_timeout_s``, GOAWAY the tunnels) and exit; SIGHUP
reloads certificates without dropping a connection.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys

import uvloop

from edge.config import EdgeConfig, ListenerConfig
from edge.listener import bind_listener
from edge.tls import CertificateStore, TlsConfigError
from tunnel.aio.transport import parse_host_port
from tunnel.runtime.config import ConfigError, load_config
from tunnel.runtime.logs import configure_logging

log = logging.getLogger("geoedge.edge")


def bind_sockets(config: EdgeConfig) -> list[tuple[ListenerConfig | None, socket.socket]]:
    sockets: list[tuple[ListenerConfig | None, socket.socket]] = [
        (listener, bind_listener(parse_host_port(listener.address)))
        for listener in config.listeners
    ]
    if config.redirect is not None:
        sockets.append((None, bind_listener(parse_host_port(config.redirect.address))))
    return sockets


async def run_worker(
    config: EdgeConfig,
    certificates: CertificateStore,
    sockets: list[tuple[ListenerConfig | None, socket.socket]],
    *,
    with_admin: bool,
) -> None:
    from edge.admin import start_admin
    from edge.worker import EdgeWorker

    worker = EdgeWorker(config, certificates, sockets)
    await worker.start()
    admin = await start_admin(config.admin.address, worker) if with_admin else None
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, worker.reload_certificates)
    log.info("edge %s serving %s", config.edge.id, ", ".join(x.address for x in config.listeners))
    await stop.wait()
    log.info("draining (up to %.0fs)", config.edge.drain_timeout_s)
    await worker.drain()
    if admin is not None:
        await admin.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="geoedge-edge", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="path to edge.toml")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", choices=("json", "plain"), default="json")
    args = parser.parse_args(argv)
    configure_logging(args.log_level, json=args.log_format == "json")
    try:
        config = load_config(args.config, EdgeConfig)
        certificates = CertificateStore(config.tls)
    except (ConfigError, TlsConfigError) as exc:
        print(f"geoedge-edge: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: ok")
        return 0
    try:
        sockets = bind_sockets(config)
    except OSError as exc:
        print(f"geoedge-edge: cannot listen: {exc}", file=sys.stderr)
        return 1
    uvloop.run(run_worker(config, certificates, sockets, with_admin=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
