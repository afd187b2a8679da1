"""``geoedge-edge --config edge.toml``: the regional edge daemon.

The supervisor loads and checks the configuration, builds the TLS contexts and
binds the listening sockets, then runs the workers (:mod:`edge.worker`) that
share them. Signals: SIGTERM/SIGINT drain (stop accepting, finish in-flight
requests up to ``drain_timeout_s``, GOAWAY the tunnels) and exit; SIGHUP
reloads certificates without dropping a connection; SIGUSR1 makes every worker
log a memory report (:mod:`tunnel.runtime.memory`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys

import uvloop
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from edge.config import EdgeConfig, ListenerConfig
from edge.listener import bind_listener
from edge.tls import CertificateStore, TlsConfigError
from tunnel.aio.transport import parse_host_port
from tunnel.runtime.admin import AdminServer, HealthReport
from tunnel.runtime.config import ConfigError, load_config
from tunnel.runtime.logs import configure_logging
from tunnel.runtime.memory import MemoryKeeper, tune_gc
from tunnel.runtime.metrics import cleanup_multiprocess, enable_multiprocess, process_exited
from tunnel.runtime.workers import Supervisor, WorkerContext

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
) -> None:
    """One worker: serve until SIGTERM, then drain; SIGHUP reloads certificates,
    SIGUSR1 logs a memory report."""
    from edge.worker import EdgeWorker

    worker = EdgeWorker(config, certificates, sockets)
    await worker.start()
    tune_gc()
    memory = MemoryKeeper("geoedge_edge", ("edge", "tunnel"))
    memory.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, worker.reload_certificates)
    await stop.wait()
    await worker.drain()
    memory.close()


def edge_health() -> HealthReport:
    """Healthy while some worker has a usable tunnel (the workers export it)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    up = {
        sample.labels.get("origin", "?"): sample.value
        for metric in registry.collect()
        if metric.name == "geoedge_edge_tunnels_up"
        for sample in metric.samples
    }
    return any(v > 0 for v in up.values()), {"tunnels_up": up}


async def supervise(
    config: EdgeConfig,
    certificates: CertificateStore,
    sockets: list[tuple[ListenerConfig | None, socket.socket]],
) -> None:
    admin = AdminServer(config.admin.address, health=edge_health)
    await admin.start()

    def worker_main(context: WorkerContext) -> int:
        uvloop.run(run_worker(config, certificates, sockets))
        return 0

    def reload_in_parent() -> None:
        # The workers reload into the contexts they inherited (ticket keys kept);
        # the parent only checks the files, to log a bad certificate once.
        try:
            CertificateStore(config.tls)
        except TlsConfigError as exc:
            log.error("certificate reload will fail: %s", exc)

    supervisor = Supervisor(
        worker_main,
        workers=config.edge.workers,
        stop_timeout_s=config.edge.drain_timeout_s + 5,
        on_reload=reload_in_parent,
        on_worker_exit=lambda pid, status: process_exited(pid),
        parent_fds=lambda: [fd for fd in [admin.fileno()] if fd is not None],
    )
    log.info(
        "edge %s serving %s with %d worker(s)",
        config.edge.id,
        ", ".join(x.address for x in config.listeners),
        supervisor.target,
    )
    try:
        await supervisor.run()
    finally:
        await admin.close()


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
    metrics_dir = enable_multiprocess()  # before any metric exists or a worker forks
    try:
        uvloop.run(supervise(config, certificates, sockets))
    finally:
        cleanup_multiprocess(metrics_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
