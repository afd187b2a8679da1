"""``geoedge-edge --config edge.toml``: the regional edge daemon.

This module is the command line: it loads and checks the configuration, opens
every file the daemon will use and builds the TLS contexts (:func:`preflight`,
also what ``--check`` runs), then hands over to :class:`edge.daemon.EdgeDaemon`
(sockets, workers, admin, signals).

Exit status: 0 after a clean stop, 2 for a bad config or file (one line per
problem, naming the file and the setting), 1 when an address cannot be bound.
``--reload PID`` asks a running edge to reload in place (:mod:`geoedge.reload`).
"""

from __future__ import annotations

import logging
import os
import pwd
from collections.abc import Sequence
from pathlib import Path

import uvloop

from edge.acme_store import AcmeStore
from edge.config import EdgeConfig
from edge.daemon import EdgeDaemon
from edge.h2_engine import EngineUnavailable, resolve_engine
from edge.tls import CertificateStore, TlsConfigError
from geoedge.config import ConfigError, load_config
from geoedge.daemon_cli import daemon_parser, parse_daemon_args, report, run_check, run_reload
from geoedge.listening import check_bindable
from geoedge.logs import configure_logging, logging_choice
from geoedge.preflight import FileCheck, ListenError, PreflightError, check_files
from geoedge.reexec import take_inheritance
from geoedge.version import running_version
from tunnel.aio.tls import TunnelTlsError
from tunnel.aio.transport import dial_ssl_context

__all__ = ["main", "preflight"]

log = logging.getLogger("geoedge.edge")

PROG = "geoedge-edge"


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
    if config.edge.access_log not in ("", "-"):
        checks.append(FileCheck(Path(config.edge.access_log), "log file", "[edge] access_log"))
    return checks


def preflight(path: str, *, service_gid: int | None) -> tuple[EdgeConfig, CertificateStore]:
    """Load the config, open every file, build the TLS contexts: what ``--check``
    does and what start-up does before it binds anything (``service_gid``: see
    :func:`~geoedge.preflight.key_mode_problem`). Raises
    :class:`ConfigError`, :class:`PreflightError`, :class:`TlsConfigError` or
    :class:`TunnelTlsError`, each naming the file or the setting."""
    config = load_config(path, EdgeConfig)
    try:  # here, not at the first HTTP/2 connection
        resolve_engine(config.http.h2_engine)
    except EngineUnavailable as exc:
        raise PreflightError([f"[http] {exc}"]) from exc
    check_files(edge_files(config), service_gid=service_gid)
    certificates = CertificateStore(
        config.tls,
        tuple(listener.alpn for listener in config.listeners),
        AcmeStore(config.acme.store_dir) if config.acme.enabled else None,
    )
    for origin in config.origins:
        try:
            dial_ssl_context(origin.tunnel)  # built again in each worker: same files
        except TunnelTlsError as exc:
            raise TunnelTlsError(f"[origins.tunnel] ({origin.name}): {exc}") from exc
    return config, certificates


def listen_addresses(config: EdgeConfig) -> list[tuple[str, str]]:
    """Every address the edge listens on, with its setting."""
    wanted = [("[[listeners]] address", listener.address) for listener in config.listeners]
    if config.redirect is not None:
        wanted.append(("[redirect] address", config.redirect.address))
    return [*wanted, ("[admin] address", config.admin.address)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = daemon_parser(
        PROG,
        "geoedge edge: terminates TLS near users and carries their requests over "
        "tunnels to the origin balancer",
        "edge.toml",
    )
    args = parse_daemon_args(parser, argv)
    if args.reload is not None:
        return run_reload(args, PROG)
    level, json_lines = logging_choice(args, "info", True)  # until the config is read
    configure_logging(level, json=json_lines)
    if args.check:
        return run_check(args, _check)
    inheritance = take_inheritance()  # this is the exec of a reload (geoedge.reload)
    running_version()  # read once, before any fork: what every worker reports
    try:
        config, certificates = preflight(args.config, service_gid=os.getegid())
    except (ConfigError, PreflightError, TlsConfigError, TunnelTlsError) as exc:
        report(PROG, args.config, exc)
        return 2
    level, json_lines = logging_choice(args, config.edge.log_level, config.edge.log_json)
    configure_logging(level, json=json_lines)
    daemon = EdgeDaemon(config, certificates, inheritance=inheritance)
    try:
        return uvloop.run(daemon.run())
    except ListenError as exc:
        report(PROG, args.config, exc)
        return 1


def _check(path: str, service_gid: int | None) -> int:
    try:
        config, certificates = preflight(path, service_gid=service_gid)
        check_bindable(listen_addresses(config))  # a reload's check only
    except (ConfigError, PreflightError, TlsConfigError, TunnelTlsError) as exc:
        report(PROG, path, exc)
        return 2
    print(
        f"{path}: ok ({len(config.tls.certificates)} certificate(s), "
        f"{0 if certificates.acme is None else len(certificates.acme)} ACME certificate(s), "
        f"{certificates.staples} OCSP response(s), {len(config.origins)} origin(s); "
        f"files checked as {_whoami()})"
    )
    return 0


def _whoami() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


if __name__ == "__main__":
    raise SystemExit(main())
