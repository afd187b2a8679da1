"""The listening sockets both daemons bind in their supervisor and share with
the workers they fork (under systemd they come from ``LISTEN_FDS`` instead:
:mod:`geoedge.systemd`; after a reload, from the supervisor's previous image:
:mod:`geoedge.reexec`)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from geoedge.preflight import ListenError, PreflightError
from geoedge.reexec import Inheritance, InheritedSocket
from geoedge.systemd import listen_sockets, same_address
from tunnel.aio.transport import parse_host_port

__all__ = [
    "HELD_ENV",
    "LISTEN_BACKLOG",
    "Listening",
    "activated_or_bound",
    "bind_listener",
    "check_bindable",
    "held_address",
    "take_listeners",
]

log = logging.getLogger("geoedge.listening")

#: The accept queue: what waits while every worker is busy or a restart is under
#: way. deploy/sysctl raises net.core.somaxconn to at least this.
LISTEN_BACKLOG = 4096
#: Set for a reload's config check (geoedge.reload): the addresses the running
#: supervisor holds already, ``host:port`` separated by commas.
HELD_ENV = "GEOEDGE_RELOAD_HELD"


def bind_listener(host: str, port: int, *, backlog: int = LISTEN_BACKLOG) -> socket.socket:
    """A non-blocking listening socket with SO_REUSEADDR; an IPv6 wildcard
    accepts IPv4 too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def activated_or_bound(
    wanted: Sequence[tuple[str, str]],
    passed: list[tuple[str, socket.socket]],
    kept: Sequence[tuple[str, socket.socket]] = (),
) -> list[socket.socket]:
    """One listening socket per ``(setting, address)`` in ``wanted``, in order:
    the one systemd passed for that address (socket activation, ``passed`` from
    :func:`geoedge.systemd.listen_sockets`), else one the supervisor bound
    before it re-executed itself (``kept``: a reload keeps the socket, and the
    connections in its queue), else one bound here. A kept socket no setting
    claims any more (a listener the reload removed) is closed.

    Raises :class:`ListenError` naming the setting when an address cannot be
    bound, or naming the socket when systemd passed one that no setting claims;
    every socket, bound or passed, is closed first.
    """
    passed = list(passed)
    kept_left = list(kept)
    sockets: list[socket.socket] = []
    try:
        for setting, address in wanted:
            sockets.append(_take_or_bind(setting, address, passed, kept_left))
        if passed:
            names = ", ".join(f"{name} ({_bound(sock)})" for name, sock in passed)
            raise ListenError(
                "socket activation", names, OSError("no listener in the config has this address")
            )
    except ListenError:
        for sock in sockets:
            sock.close()
        for _, sock in passed + kept_left:
            sock.close()
        raise
    for name, sock in kept_left:
        log.info("closing the listener of %s (%s): no longer in the config", name, _bound(sock))
        sock.close()
    return sockets


def _take_or_bind(
    setting: str,
    address: str,
    passed: list[tuple[str, socket.socket]],
    kept: list[tuple[str, socket.socket]],
) -> socket.socket:
    host, port = parse_host_port(address)
    for index, (name, sock) in enumerate(passed):
        if same_address(sock, host, port):
            del passed[index]
            sock.setblocking(False)
            log.info("listening on %s: socket %r from systemd", address, name)
            return sock
    for index, (_, sock) in enumerate(kept):
        if same_address(sock, host, port):
            del kept[index]
            sock.setblocking(False)
            log.info("listening on %s: the socket kept across the reload", address)
            return sock
    try:
        return bind_listener(host, port)
    except OSError as exc:
        raise ListenError(setting, address, exc) from None


def _bound(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


@dataclass(slots=True)
class Listening:
    """A supervisor's listening sockets, in the order asked for, and where each
    came from: what the next re-exec passes on (:mod:`geoedge.reexec`)."""

    sockets: list[socket.socket]
    #: Per socket (same order): (role, name): ``("systemd", FileDescriptorName)``
    #: or ``("bound", setting)``.
    origins: list[tuple[str, str]]

    def handover(self) -> list[InheritedSocket]:
        return [
            InheritedSocket(sock.fileno(), role, name)
            for sock, (role, name) in zip(self.sockets, self.origins, strict=True)
        ]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def take_listeners(
    wanted: Sequence[tuple[str, str]], inheritance: Inheritance | None, *, activation: bool = True
) -> Listening:
    """The sockets for ``wanted`` (``(setting, address)`` pairs): after a reload
    those the previous image held (systemd's matched strictly, the daemon's own
    kept if still configured), at a first start those systemd passed
    (``activation``), and any other bound here. Raises :class:`ListenError`
    as :func:`activated_or_bound` does."""
    if inheritance is not None:
        passed = [(s.name, s.take()) for s in inheritance.of_role("systemd")]
        kept = [(s.name, s.take()) for s in inheritance.of_role("bound")]
    else:
        passed = listen_sockets() if activation else []
        kept = []
    from_systemd = {id(sock): name for name, sock in passed}
    sockets = activated_or_bound(wanted, passed, kept)
    origins = [
        ("systemd", from_systemd[id(sock)]) if id(sock) in from_systemd else ("bound", setting)
        for sock, (setting, _) in zip(sockets, wanted, strict=True)
    ]
    return Listening(sockets, origins)


def held_address(sock: socket.socket) -> str:
    """``host:port`` (``[v6]:port``) of a bound socket, as :data:`HELD_ENV` lists them."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_bindable(wanted: Sequence[tuple[str, str]], env: Mapping[str, str] | None = None) -> None:
    """In a reload's config check (:data:`HELD_ENV` set; otherwise nothing is
    done: a plain ``--check`` runs beside the daemon): that every address of
    ``wanted`` (``(setting, address)``) that the running daemon does not hold
    can be bound, by binding it and closing it at once. The supervisor
    re-executes only after this check: a new address in use must stop the
    reload there, while the old workers serve on, not after the exec.
    Raises :class:`PreflightError`, one line per address, naming the setting."""
    held_text = (os.environ if env is None else env).get(HELD_ENV)
    if held_text is None:
        return
    held = [parse_host_port(text) for text in held_text.split(",") if text]
    problems = []
    for setting, address in wanted:
        host, port = parse_host_port(address)
        if any(_same_place(host, port, h, p) for h, p in held):
            continue
        try:
            bind_listener(host, port).close()
        except OSError as exc:
            problems.append(str(ListenError(setting, address, exc)))
    if problems:
        raise PreflightError(problems)


def _same_place(host: str, port: int, held_host: str, held_port: int) -> bool:
    wildcard = {"0.0.0.0", "::", ""}
    return port == held_port and (host == held_host or {host, held_host} <= wildcard)
