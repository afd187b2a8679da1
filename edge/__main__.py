"""``geoedge-edge --config edge.toml``: the regional edge daemon.

The supervisor loads and checks the configuration, opens every file the
daemon will use (:func:`preflight`), builds the TLS contexts and binds the
listening sockets, then runs the workers (:mod:`edge.worker`) that share them.
Signals: SIGTERM/SIGINT drain (``/healthz`` answers 503 from then on; stop
accepting, finish in-flight requests up to ``drain_timeout_s``, GOAWAY the
tunnels) and exit; SIGHUP reloads certificates and OCSP responses without
dropping a connection, in the supervisor first (so a worker it starts later
serves the current ones), then in the workers; SIGUSR1 reopens the access log
(logrotate's postrotate); SIGUSR2 makes every worker log a memory report
(:mod:`geoedge.memory`).

Exit status: 0 after a clean stop, 2 for a bad config or file (one line per
problem, naming the file and the setting), 1 when an address cannot be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pwd
import signal
import socket
import sys
from pathlib import Path

import uvloop
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from edge.config import EdgeConfig, ListenerConfig
from edge.status import EdgeStatus
from edge.tls import CertificateStore, TlsConfigError
from geoedge.admin import AdminServer, HealthReport
from geoedge.config import ConfigError, load_config
from geoedge.listening import bind_listener
from geoedge.logs import add_logging_options, configure_logging, logging_choice
from geoedge.memory import MemoryKeeper, tune_gc
from geoedge.metrics import (
    cleanup_multiprocess,
    enable_multiprocess,
    merged_families,
    process_exited,
)
from geoedge.preflight import (
    FileCheck,
    ListenError,
    PreflightError,
    check_files,
    run_as,
)
from geoedge.status_window import MetricsWindow
from geoedge.systemd import ServiceNotifier, listen_sockets, same_address
from geoedge.version import add_version_option
from geoedge.workers import Supervisor, WorkerContext
from tunnel.aio.tls import TunnelTlsError
from tunnel.aio.transport import dial_ssl_context, parse_host_port

log = logging.getLogger("geoedge.edge")

#: Under systemd (Type=notify): READY=1 once a tunnel is up, or after this long
#: without one (the edge serves anyway: requests wait tunnel_wait_s, then 503),
#: so that a start does not fail, or a restart hang, while an origin is down.
READY_TIMEOUT_S = 30.0

Sockets = list[tuple[ListenerConfig | None, socket.socket]]


def edge_files(config: EdgeConfig) -> list[FileCheck]:
    """Every file the edge opens, with the setting that names it."""
    checks: list[FileCheck] = []
    for cert in config.tls.certificates:
        checks.append(FileCheck(cert.cert, "certificate", "[[tls.certificates]] cert"))
        checks.append(FileCheck(cert.key, "private key", "[[tls.certificates]] key"))
        if cert.ocsp_response is not None:
            checks.append(
                FileCheck(cert.ocsp_response, "OCSP response", "[[tls.certificates]] ocsp_response")
            )
    for origin in config.origins:
        tunnel = origin.tunnel
        table = f"[origins.tunnel] ({origin.name})"
        for path, kind, key in (
            (tunnel.cert, "certificate", "cert"),
            (tunnel.key, "private key", "key"),
            (tunnel.ca, "CA", "ca"),
        ):
            if path is not None:
                checks.append(FileCheck(path, kind, f"{table} {key}"))  # type: ignore[arg-type]
    if config.http.access_log not in ("", "-"):
        checks.append(FileCheck(Path(config.http.access_log), "log file", "[http] access_log"))
    return checks


def preflight(path: str, *, service_gid: int | None) -> tuple[EdgeConfig, CertificateStore]:
    """Load the config, open every file, build the TLS contexts: what ``--check``
    does and what start-up does before it binds anything (``service_gid``: see
    :func:`~geoedge.preflight.key_mode_problem`). Raises
    :class:`ConfigError`, :class:`PreflightError`, :class:`TlsConfigError` or
    :class:`TunnelTlsError`, each naming the file or the setting."""
    config = load_config(path, EdgeConfig)
    check_files(edge_files(config), service_gid=service_gid)
    certificates = CertificateStore(
        config.tls, tuple(listener.alpn for listener in config.listeners)
    )
    for origin in config.origins:
        try:
            dial_ssl_context(origin.tunnel)  # built again in each worker: same files
        except TunnelTlsError as exc:
            raise TunnelTlsError(f"[origins.tunnel] ({origin.name}): {exc}") from exc
    return config, certificates


def bind_sockets(
    config: EdgeConfig, activated: list[tuple[str, socket.socket]] | None = None
) -> Sockets:
    """The listening sockets: those systemd passed (socket activation, matched
    to the listeners by address), the rest bound here."""
    passed = list(activated or ())
    sockets: Sockets = []
    wanted: list[tuple[ListenerConfig | None, str, str]] = [
        (listener, "[[listeners]] address", listener.address) for listener in config.listeners
    ]
    if config.redirect is not None:
        wanted.append((None, "[redirect] address", config.redirect.address))
    try:
        for listener, setting, address in wanted:
            sockets.append((listener, _take_or_bind(setting, address, passed)))
        if passed:
            names = ", ".join(f"{name} ({_bound(sock)})" for name, sock in passed)
            raise ListenError(
                "socket activation", names, OSError("no listener in the config has this address")
            )
    except ListenError:
        for _, sock in sockets:
            sock.close()
        for _, sock in passed:
            sock.close()
        raise
    return sockets


def _take_or_bind(
    setting: str, address: str, passed: list[tuple[str, socket.socket]]
) -> socket.socket:
    host, port = parse_host_port(address)
    for index, (name, sock) in enumerate(passed):
        if same_address(sock, host, port):
            del passed[index]
            sock.setblocking(False)
            log.info("listening on %s: socket %r from systemd", address, name)
            return sock
    try:
        return bind_listener(host, port)
    except OSError as exc:
        raise ListenError(setting, address, exc) from None


def _bound(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


async def run_worker(config: EdgeConfig, certificates: CertificateStore, sockets: Sockets) -> None:
    """One worker: serve until SIGTERM, then drain; SIGHUP reloads certificates,
    SIGUSR1 reopens the access log, SIGUSR2 logs a memory report."""
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
    loop.add_signal_handler(signal.SIGUSR1, worker.reopen_logs)
    await stop.wait()
    await worker.drain()
    memory.close()


def edge_health(draining: bool) -> HealthReport:
    """Healthy while some worker has a usable tunnel (the workers export it) and
    the edge is not draining: a load balancer must stop sending new clients
    from the moment a drain starts."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    up = {
        sample.labels.get("origin", "?"): sample.value
        for metric in registry.collect()
        if metric.name == "geoedge_edge_tunnels_up"
        for sample in metric.samples
    }
    return not draining and any(v > 0 for v in up.values()), {
        "draining": draining,
        "tunnels_up": up,
    }


async def supervise(
    config: EdgeConfig,
    certificates: CertificateStore,
    sockets: Sockets,
    notifier: ServiceNotifier | None = None,
) -> None:
    notifier = notifier or ServiceNotifier({})

    def worker_main(context: WorkerContext) -> int:
        uvloop.run(run_worker(config, certificates, sockets))
        return 0

    def reload_in_parent() -> bool:
        # Into the supervisor's own contexts (the ones the next forked worker
        # inherits; ticket keys kept). On failure the workers are not signalled:
        # the problem is logged once and they keep what they serve.
        notifier.reloading()
        try:
            certificates.reload()
        except TlsConfigError as exc:
            log.error("certificate reload failed, keeping the current certificates: %s", exc)
            notifier.ready("certificate reload failed: serving the previous certificates")
            return False
        notifier.ready("certificates reloaded")
        return True

    def service_state() -> tuple[bool, bool, str]:
        """(ready, stopping, STATUS=) for systemd: ready once a tunnel is up."""
        stats = supervisor.statistics()
        _, detail = edge_health(False)
        tunnels = detail["tunnels_up"]
        up = [name for name, count in tunnels.items() if count > 0]
        down = sorted(set(origin.name for origin in config.origins) - set(up))
        if stats.stopping:
            return bool(up), True, f"draining {stats.running} worker(s)"
        text = f"{stats.running}/{stats.target} workers; tunnels up: {', '.join(up) or 'none'}"
        if down:
            text += f"; waiting for {', '.join(down)}"
        return bool(up) and stats.running > 0, False, text

    supervisor = Supervisor(
        worker_main,
        workers=config.edge.workers,
        stop_timeout_s=config.edge.drain_timeout_s + 5,
        on_reload=reload_in_parent,
        on_worker_exit=lambda pid, status: process_exited(pid),
        parent_fds=lambda: [fd for fd in [admin.fileno()] if fd is not None],
        on_stopping=lambda: notifier.stopping(f"draining {supervisor.running} worker(s)"),
    )
    admin = AdminServer(
        config.admin.address,
        health=lambda: edge_health(supervisor.statistics().stopping),
        status=EdgeStatus(config, MetricsWindow(merged_families), supervisor.statistics),
    )
    try:
        await admin.start()
    except OSError as exc:
        raise ListenError("[admin] address", config.admin.address, exc) from None
    log.info(
        "edge %s serving %s with %d worker(s)",
        config.edge.id,
        ", ".join(x.address for x in config.listeners),
        supervisor.target,
    )
    systemd = asyncio.get_running_loop().create_task(
        notifier.run(
            service_state,
            ready_timeout_s=READY_TIMEOUT_S,
            alive=lambda: supervisor.statistics().running > 0,
        )
    )
    try:
        await supervisor.run()
    finally:
        systemd.cancel()
        notifier.close()
        await admin.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="geoedge-edge", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="path to edge.toml")
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
    args = parser.parse_args(argv)
    if args.user and not args.check:
        parser.error("--user goes with --check (the service manager picks the daemon's user)")
    level, json_lines = logging_choice(args, "info", True)  # until the config is read
    configure_logging(level, json=json_lines)
    if args.check:
        if args.user:
            return run_as(args.user, lambda: _check(args.config, os.getegid()))
        # Root checking for a service it was not named: its group is unknown.
        return _check(args.config, None if os.geteuid() == 0 else os.getegid())
    try:
        config, certificates = preflight(args.config, service_gid=os.getegid())
    except (ConfigError, PreflightError, TlsConfigError, TunnelTlsError) as exc:
        _report(args.config, exc)
        return 2
    level, json_lines = logging_choice(args, config.edge.log_level, config.edge.log_json)
    configure_logging(level, json=json_lines)
    notifier = ServiceNotifier()  # takes NOTIFY_SOCKET: the workers do not speak to systemd
    try:
        sockets = bind_sockets(config, listen_sockets())
    except ListenError as exc:
        _report(args.config, exc)
        return 1
    metrics_dir = enable_multiprocess()  # before any metric exists or a worker forks
    try:
        uvloop.run(supervise(config, certificates, sockets, notifier))
    except ListenError as exc:
        _report(args.config, exc)
        return 1
    finally:
        cleanup_multiprocess(metrics_dir)
    return 0


def _check(path: str, service_gid: int | None) -> int:
    try:
        config, certificates = preflight(path, service_gid=service_gid)
    except (ConfigError, PreflightError, TlsConfigError, TunnelTlsError) as exc:
        _report(path, exc)
        return 2
    print(
        f"{path}: ok ({len(config.tls.certificates)} certificate(s), "
        f"{certificates.staples} OCSP response(s), {len(config.origins)} origin(s); "
        f"files checked as {_whoami()})"
    )
    return 0


def _report(path: str, exc: Exception) -> None:
    """One line per problem, each naming the config file (ConfigError's do already)."""
    for line in str(exc).splitlines():
        prefix = "" if isinstance(exc, ConfigError) else f"{path}: "
        print(f"geoedge-edge: {prefix}{line}", file=sys.stderr)


def _whoami() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


if __name__ == "__main__":
    raise SystemExit(main())
