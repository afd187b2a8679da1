"""The local stack the demo, the tests and the load tests run: throwaway PKI,
ports, configs, processes.

Everything here is for localhost only (every address is ``127.0.0.1``) and
short-lived: a CA that signs the client-facing certificate and the two tunnel
peer certificates, free ports picked by the kernel, an ``edge.toml`` and an
``origin.toml`` rendered from what the callers vary, and a group of child
processes that each write to a log file and are stopped by PID.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from geoedge import pki
from geoedge.config import toml_key, toml_value

LOCALHOST = "127.0.0.1"


class StackError(RuntimeError):
    """A process of the stack did not start (the message carries the end of its log)."""


# ------------------------------------------------------------------ ports


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago and that this process
    has not handed out before: the kernel may offer the same port to two
    ``bind(0)`` calls in a row, and a stack asks for several before starting
    anything that binds them."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind((LOCALHOST, 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            break
    _HANDED_OUT.add(port)
    return port


def port_free(port: int) -> bool:
    """Whether ``port`` of 127.0.0.1 can be bound now."""
    with socket.socket() as sock:
        try:
            sock.bind((LOCALHOST, port))
        except OSError:
            return False
    return True


# ------------------------------------------------------------------ PKI


@dataclass(frozen=True, slots=True)
class DevPki:
    """The files of a throwaway PKI: the CA's certificate, the client-facing
    server certificate (names localhost and 127.0.0.1), and the two tunnel
    peers' certificates, whose identities are ``edge_id`` and ``origin_id``."""

    ca: Path
    server: pki.CertPaths
    edge: pki.CertPaths
    origin: pki.CertPaths
    edge_id: str
    origin_id: str


def make_dev_pki(
    directory: Path,
    *,
    edge_id: str,
    origin_id: str,
    ca_name: str = "geoedge private CA",
    server_basename: str = "server",
) -> DevPki:
    """A new CA in ``directory/ca`` and the certificates it signs in ``directory``."""
    pki.create_ca(directory / "ca", name=ca_name)
    ca = pki.load_ca(directory / "ca")
    server = pki.issue_server_cert(ca, directory, server_basename, ["localhost", LOCALHOST])
    origin = pki.issue_peer_cert(
        ca, directory, "origin", origin_id, role="origin", dns_names=["localhost"]
    )
    edge = pki.issue_peer_cert(ca, directory, "edge", edge_id, role="edge")
    return DevPki(ca.paths.cert, server, edge, origin, edge_id, origin_id)


# ------------------------------------------------------------------ configs


class StackKeys(Protocol):
    """The files the configs name: a :class:`DevPki`, or the tests' own PKI."""

    @property
    def ca(self) -> Path: ...
    @property
    def server(self) -> pki.CertPaths: ...
    @property
    def edge(self) -> pki.CertPaths: ...
    @property
    def origin(self) -> pki.CertPaths: ...


def _keys(values: Mapping[str, object]) -> str:
    """``key = value`` lines, written as the config renderer writes them."""
    return "".join(f"{toml_key(key)} = {toml_value(value)}\n" for key, value in values.items())


def _optional(values: Mapping[str, object | None]) -> dict[str, object]:
    return {key: value for key, value in values.items() if value is not None}


def edge_toml(
    keys: StackKeys,
    *,
    edge_id: str,
    https_port: int,
    admin_port: int,
    origins: Sequence[tuple[str, int]],
    certificate: pki.CertPaths | None = None,
    workers: int = 1,
    drain_timeout_s: float = 5.0,
    access_log: str | Path | None = None,
    admission: Mapping[str, int] | None = None,
    tunnel: Mapping[str, float] | None = None,
    origin_tunnel: Mapping[str, object] | None = None,
    comment: str = "",
    top: str = "",
    edge_keys: str = "",
    listener_keys: str = "",
    tls_keys: str = "",
    certificate_keys: str = "",
    extra: str = "",
) -> str:
    """A local edge: one listener on 127.0.0.1:``https_port`` serving
    ``certificate`` (default: ``keys.server``), an admin endpoint, and one
    tunnel per ``(name, port)`` of ``origins`` authenticated with ``keys.edge``
    and ``keys.ca``.

    ``access_log`` (``""`` turns it off; [edge]), ``admission`` and ``tunnel``
    (the [admission] and [tunnel] tables) are left out when None; ``origin_tunnel``:
    more keys of each [origins.tunnel]. The ``*_keys`` strings are TOML lines
    added to the table they name ([edge], [[listeners]], [tls], the first
    [[tls.certificates]], which may be followed by more entries); ``top`` goes
    before every table, ``extra`` (tables of the caller's own) after [tunnel].
    """
    certificate = certificate or keys.server
    origin_tables = "".join(
        f"""
[[origins]]
name = "{name}"
[origins.tunnel]
address = "{LOCALHOST}:{port}"
server_name = "localhost"
cert = "{keys.edge.cert}"
key = "{keys.edge.key}"
ca = "{keys.ca}"
{_keys(origin_tunnel or {})}"""
        for name, port in origins
    )
    access = "" if access_log is None else f'access_log = "{access_log}"\n'
    admission_table = "" if admission is None else f"\n[admission]\n{_keys(admission)}"
    tunnel_table = "" if tunnel is None else f"\n[tunnel]\n{_keys(tunnel)}"
    return f"""{comment and f"# {comment}"}
{top}
[edge]
id = "{edge_id}"
workers = {workers}
drain_timeout_s = {drain_timeout_s}
{access}{edge_keys}
[[listeners]]
address = "{LOCALHOST}:{https_port}"
{listener_keys}
[tls]
{tls_keys}
[[tls.certificates]]
cert = "{certificate.cert}"
key = "{certificate.key}"
{certificate_keys}{admission_table}
[admin]
address = "{LOCALHOST}:{admin_port}"
{tunnel_table}{extra}{origin_tables}"""


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """The [pools.health] table of the origin's pool (``timeout_s`` None: the default)."""

    path: str = "/health"
    interval_s: float = 1.0
    timeout_s: float | None = None


def origin_toml(
    keys: StackKeys,
    *,
    origin_id: str,
    tunnel_port: int,
    admin_port: int,
    allowed_identities: Iterable[str],
    backends: Sequence[int],
    pool: str = "app",
    health: HealthCheck | None = None,
    workers: int = 1,
    drain_timeout_s: float = 5.0,
    log_level: str | None = None,
    access_log: str | None = None,
    log_json: bool | None = None,
    tunnel: Mapping[str, float] | None = None,
    comment: str = "",
    listener_keys: str = "",
    pool_keys: str = "",
) -> str:
    """A local origin balancer: a tunnel listener on 127.0.0.1:``tunnel_port``
    (``keys.origin``, ``keys.ca``) that accepts the edges named in
    ``allowed_identities``, an admin endpoint,
    and one default pool ``pool`` over the ``backends`` ports of 127.0.0.1.

    ``log_level``, ``access_log`` and ``log_json`` are keys of [origin], left
    out when None; ``tunnel`` is the [tunnel] table; ``listener_keys`` and
    ``pool_keys`` are TOML lines added to [tunnel_listener] and the pool.
    """
    origin_keys = _keys(
        _optional({"log_level": log_level, "access_log": access_log, "log_json": log_json})
    )
    identities = toml_value(list(allowed_identities))
    tunnel_table = "" if tunnel is None else f"\n[tunnel]\n{_keys(tunnel)}"
    health_table = "" if health is None else f"[pools.health]\n{_keys(_optional(asdict(health)))}"
    backend_tables = "".join(
        f'[[pools.backends]]\naddress = "{LOCALHOST}:{port}"\n' for port in backends
    )
    return f"""{comment and f"# {comment}"}
[origin]
id = "{origin_id}"
workers = {workers}
drain_timeout_s = {drain_timeout_s}
{origin_keys}
[tunnel_listener]
address = "{LOCALHOST}:{tunnel_port}"
cert = "{keys.origin.cert}"
key = "{keys.origin.key}"
ca = "{keys.ca}"
allowed_identities = {identities}
{listener_keys}
[admin]
address = "{LOCALHOST}:{admin_port}"
{tunnel_table}
[[pools]]
name = "{pool}"
default = true
{pool_keys}
{health_table}{backend_tables}"""


# ------------------------------------------------------------------ waiting


def tail(log: Path, limit: int = 3000) -> str:
    """The end of a log file (or a note that there is none)."""
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-limit:]
    return "(no log)"


def _check_running(procs: Iterable[subprocess.Popen[bytes]], log: Path | None) -> None:
    for proc in procs:
        if proc.poll() is not None:
            detail = "" if log is None else f":\n{tail(log)}"
            raise StackError(f"{proc.args!r} exited with status {proc.returncode}{detail}")


def wait_port(
    port: int,
    deadline: float,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    host: str = LOCALHOST,
) -> None:
    """Until something accepts connections on ``host:port``; :class:`StackError`
    when ``proc`` exits first or ``deadline`` (monotonic) passes."""
    while time.monotonic() < deadline:
        _check_running(() if proc is None else (proc,), log)
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.2):
            return
        time.sleep(0.05)
    who = "" if proc is None else f" ({proc.args!r})"
    detail = "" if log is None else f":\n{tail(log)}"
    raise StackError(f"nothing listening on {host}:{port}{who}{detail}")


def wait_healthy(
    admin_port: int,
    deadline: float,
    what: str,
    log: Path | None = None,
    procs: Iterable[subprocess.Popen[bytes]] = (),
) -> None:
    """Until the admin endpoint on ``admin_port`` answers 200 on /healthz (an
    edge: a usable tunnel); :class:`StackError` when one of ``procs`` exits
    first or ``deadline`` (monotonic) passes (with the end of ``log`` then)."""
    procs = tuple(procs)
    while time.monotonic() < deadline:
        _check_running(procs, None)
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection(LOCALHOST, admin_port, timeout=1)
            try:
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    return
            finally:
                conn.close()
        time.sleep(0.1)
    detail = "" if log is None else f":\n{tail(log)}"
    raise StackError(f"{what} never became healthy{detail}")


# ------------------------------------------------------------------ processes


class ProcessGroup:
    """Child processes by name, each in its own session (a Ctrl-C at the
    terminal reaches the caller only) and writing to a log file.

    :meth:`stop` signals every process still running: SIGTERM, then SIGKILL
    (to its process group when ``kill_group``) after a grace period. It is
    idempotent; the group forgets the processes it stopped.
    """

    def __init__(self, kill_group: bool = False) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.kill_group = kill_group

    def spawn(
        self,
        name: str,
        argv: list[str],
        *,
        log: Path,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        append: bool = False,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` as ``name``, stdout and stderr to ``log`` (truncated
        unless ``append``), stdin from /dev/null."""
        out = open(log, "ab" if append else "wb")  # noqa: SIM115 - the child holds it
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        finally:
            out.close()
        self.procs[name] = proc
        return proc

    def exited(self) -> list[str]:
        """The names of the processes that are no longer running."""
        return [name for name, proc in self.procs.items() if proc.poll() is not None]

    def stop(self, grace_s: float = 5.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.05, deadline - time.monotonic()))
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    if self.kill_group:
                        os.killpg(proc.pid, signal.SIGKILL)
                    else:
                        proc.kill()
                proc.wait()
        self.procs.clear()
