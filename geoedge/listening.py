"""The listening sockets both daemons bind in their supervisor and share with
the workers they fork (under systemd they come from ``LISTEN_FDS`` instead:
:mod:`geoedge.systemd`)."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Sequence

from geoedge.preflight import ListenError
from geoedge.systemd import same_address
from tunnel.aio.transport import parse_host_port

__all__ = ["LISTEN_BACKLOG", "activated_or_bound", "bind_listener"]

log = logging.getLogger("geoedge.listening")

#: The accept queue: what waits while every worker is busy or a restart is under
#: way. deploy/sysctl raises net.core.somaxconn to at least this.
LISTEN_BACKLOG = 4096


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
    wanted: Sequence[tuple[str, str]], passed: list[tuple[str, socket.socket]]
) -> list[socket.socket]:
    """One listening socket per ``(setting, address)`` in ``wanted``, in order:
    the one systemd passed for that address (socket activation, ``passed`` from
    :func:`geoedge.systemd.listen_sockets`), else one bound here.

    Raises :class:`ListenError` naming the setting when an address cannot be
    bound, or naming the socket when systemd passed one that no setting claims;
    every socket, bound or passed, is closed first.
    """
    passed = list(passed)
    sockets: list[socket.socket] = []
    try:
        for setting, address in wanted:
            sockets.append(_take_or_bind(setting, address, passed))
        if passed:
            names = ", ".join(f"{name} ({_bound(sock)})" for name, sock in passed)
            raise ListenError(
                "socket activation", names, OSError("no listener in the config has this address")
            )
    except ListenError:
        for sock in sockets:
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
