"""Listeners: TLS, TLS behind a PROXY-protocol load balancer, plain-HTTP redirect.

A PROXY header arrives *before* the TLS ClientHello, so a PROXY listener cannot
hand its socket straight to ``create_server(ssl=...)``. It accepts the socket
itself, reads exactly the header with ``MSG_PEEK`` (so not one byte of the
ClientHello is consumed), and then starts the edge's TLS transport on it
(:class:`edge.tls_transport.TlsServerTransport`). Headers are accepted only from the
configured trusted CIDRs; a trusted peer without a header, or an untrusted one
with a header, is refused with a logged reason. The header vouches for the TCP
addresses only: whether the client's forwarding headers are trusted is decided
from its source address and the listener's ``http_proxies`` (README "Trust").

The accept loop survives EMFILE by sleeping, as trio's does, instead of dying.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable

from edge.config import ListenerConfig
from edge.tls_transport import (
    ACCEPT_PAUSE_S,
    ACCEPT_RESOURCE_ERRNOS,
    LINGER_S,
    SEND_TIMEOUT_S,
    TlsServerTransport,
)
from geoedge.proxy import ProxyHeaderParser, ProxyProtocolError, looks_like_proxy_header

log = logging.getLogger("geoedge.edge")

PROXY_HEADER_TIMEOUT_S = 5.0
_MAX_PEEK = 4096 + 16


class ClientRefused(Exception):
    """A connection refused before TLS; the message is the logged reason."""


def is_trusted(address: str, networks: tuple[object, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in networks)  # type: ignore[operator]


async def _wait_readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    future = loop.create_future()
    loop.add_reader(sock.fileno(), future.set_result, None)
    try:
        await future
    finally:
        loop.remove_reader(sock.fileno())


async def read_proxy_header(
    loop: asyncio.AbstractEventLoop, sock: socket.socket
) -> tuple[str, int] | None:
    """Consume exactly one PROXY header from ``sock``; the client address (None
    for a LOCAL header, e.g. the load balancer's own health check).

    The header is peeked, not read, so that not one byte of the ClientHello
    behind it is taken from OpenSSL. While it is incomplete, ``SO_RCVLOWAT``
    (one more octet than is buffered) makes the socket readable only when more
    arrives or the peer closes: no polling, and a close mid-header is seen."""
    buffered = 0
    try:
        while True:
            await _wait_readable(loop, sock)
            peeked = sock.recv(_MAX_PEEK, socket.MSG_PEEK)
            if len(peeked) <= buffered:
                raise ClientRefused("closed inside the PROXY header")
            buffered = len(peeked)
            if looks_like_proxy_header(peeked) is False:
                raise ClientRefused("no PROXY header from a trusted peer")
            parser = ProxyHeaderParser(max_v2_bytes=4096)  # peeked bytes are re-read whole
            try:
                header = parser.feed(peeked)
            except ProxyProtocolError as exc:
                raise ClientRefused(f"malformed PROXY header: {exc}") from None
            if header is not None:
                sock.recv(len(peeked) - len(parser.remainder))  # the header only; TLS follows
                return header.source
            if buffered >= _MAX_PEEK:
                raise ClientRefused("PROXY header too long")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, buffered + 1)
    finally:
        if buffered:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)


async def serve_proxy_listener(
    sock: socket.socket,
    config: ListenerConfig,
    ssl_context: ssl.SSLContext,
    handshake_timeout_s: float,
    factory: Callable[[tuple[str, int]], asyncio.Protocol],
    on_refused: Callable[[tuple[str, int], str], None],
    send_timeout_s: float = SEND_TIMEOUT_S,
    admit: Callable[[str], Callable[[], None] | None] | None = None,
    on_failed: Callable[[object, str], None] | None = None,
) -> None:
    """Accept loop of a listener behind a PROXY-protocol load balancer.
    ``admit``: as :class:`edge.tls_transport.TlsListener`'s, asked about the
    client address the PROXY header gives (the balancer's own is shared)."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    tasks: set[asyncio.Task[None]] = set()

    async def handle(conn: socket.socket, peer: tuple[str, int]) -> None:
        try:
            if not is_trusted(peer[0], config.trusted_proxies):
                # Untrusted: a PROXY header from it would be a spoofing attempt.
                async with asyncio.timeout(PROXY_HEADER_TIMEOUT_S):
                    await _wait_readable(loop, conn)
                if looks_like_proxy_header(conn.recv(16, socket.MSG_PEEK)):
                    raise ClientRefused(f"PROXY header from untrusted peer {peer[0]}")
                client = peer
            else:
                async with asyncio.timeout(PROXY_HEADER_TIMEOUT_S):
                    client = await read_proxy_header(loop, conn) or peer
            release = admit(client[0]) if admit is not None else None
            if admit is not None and release is None:
                conn.close()
                return
            TlsServerTransport(
                loop,
                conn,
                ssl_context,
                factory(client),
                handshake_timeout_s,
                LINGER_S,
                send_timeout_s,
                release,
                on_failed,
            )
        except (ClientRefused, TimeoutError, OSError) as exc:
            reason = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError):
                reason = "no PROXY header within the timeout"
            on_refused(peer, f"PROXY protocol: {reason}")
            conn.close()

    while True:
        try:
            conn, peer = await loop.sock_accept(sock)
        except OSError as exc:
            if exc.errno in ACCEPT_RESOURCE_ERRNOS:
                log.error("accept failed (%s); pausing accepts for 100 ms", exc)
                await asyncio.sleep(ACCEPT_PAUSE_S)
                continue
            raise
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = asyncio.create_task(handle(conn, (peer[0], peer[1])))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
