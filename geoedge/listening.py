"""The listening sockets both daemons bind in their supervisor and share with
the workers they fork (under systemd they come from ``LISTEN_FDS`` instead:
:mod:`geoedge.systemd`)."""

from __future__ import annotations

import contextlib
import socket

__all__ = ["LISTEN_BACKLOG", "bind_listener"]

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
