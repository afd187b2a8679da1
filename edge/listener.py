"""The edge's listeners: one accept loop (:class:`Listener`) and what each kind
of listener does with an accepted connection.

- :class:`TlsListener`: admission, then the edge's TLS transport
  (:class:`edge.tls_transport.TlsServerTransport`) at once, since the
  ClientHello is usually already there.
- :class:`ProxyListener`: TLS behind a PROXY-protocol load balancer. A PROXY
  header arrives *before* the TLS ClientHello: the listener reads exactly the
  header with ``MSG_PEEK`` (so not one byte of the ClientHello is consumed),
  then starts the TLS transport on the socket. Headers are accepted only from
  the configured trusted CIDRs; a trusted peer without a header, or an
  untrusted one with a header, is refused with a logged reason. The header
  vouches for the TCP addresses only: whether the client's forwarding headers
  are trusted is decided from its source address and the listener's
  ``http_proxies`` (README "Trust").
- :class:`RedirectListener`: plain HTTP, answered with a redirect to HTTPS.

The accept loop takes up to :data:`ACCEPT_BATCH` connections per wake-up and
survives EMFILE by pausing, as trio's does, instead of dying.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

from edge.config import ListenerConfig
from edge.tls_transport import LINGER_S, SEND_TIMEOUT_S, TlsServerTransport
from geoedge.proxy import (
    ProxyErrorReason,
    ProxyHeaderParser,
    ProxyProtocolError,
    looks_like_proxy_header,
)

log = logging.getLogger("geoedge.edge")

PROXY_HEADER_TIMEOUT_S = 5.0
#: Connections accepted per wake-up of a listening socket.
ACCEPT_BATCH = 64
#: accept() failures that mean "out of descriptors or memory": pause accepting
#: for ACCEPT_PAUSE_S instead of dying (as trio does), so the rest carries on.
ACCEPT_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_PAUSE_S = 0.1

#: ``admit(client_ip)``: the callable that releases the connection's place
#: (called when its socket closes), or None to refuse it before any TLS.
Admit = Callable[[str], Callable[[], None] | None]
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
    loop: asyncio.AbstractEventLoop, sock: socket.socket, version: str = "any"
) -> tuple[str, int] | None:
    """Consume exactly one PROXY header from ``sock``; the client address (None
    for a LOCAL header, e.g. the load balancer's own health check).
    ``version``: the listener's ``proxy_protocol`` (``v1``, ``v2`` or ``any``):
    a header of another version is refused, naming both.

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
            parser = ProxyHeaderParser(  # peeked bytes are re-read whole
                accept_v1=version != "v2", accept_v2=version != "v1", max_v2_bytes=4096
            )
            try:
                header = parser.feed(peeked)
            except ProxyProtocolError as exc:
                if exc.reason is ProxyErrorReason.VERSION_DISABLED:
                    sent = "v2" if version == "v1" else "v1"
                    raise ClientRefused(
                        f'a PROXY {sent} header on a listener with proxy_protocol = "{version}"'
                    ) from None
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


class Listener:
    """Accepts on a listening socket (owned by the caller) and hands each
    connection, non-blocking with TCP_NODELAY, to :meth:`accepted`;
    :meth:`close` stops accepting. Connections already handed over are not
    the listener's: closing it leaves them be."""

    def __init__(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._closed = False
        self._resume: asyncio.TimerHandle | None = None
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._accept)

    def accepted(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        """Take one accepted connection (each kind of listener says how)."""
        raise NotImplementedError

    def _accept(self) -> None:
        loop, sock = self._loop, self._sock
        for _ in range(ACCEPT_BATCH):
            try:
                conn, peer = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in ACCEPT_RESOURCE_ERRNOS:
                    log.error("accept failed (%s); pausing accepts for 100 ms", exc)
                    loop.remove_reader(sock.fileno())
                    self._resume = loop.call_later(ACCEPT_PAUSE_S, self._resume_accepting)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            try:
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as exc:  # reset before we got to it: only this one is lost
                log.debug("connection lost while being set up: %s", exc)
                conn.close()
                continue
            self.accepted(conn, (peer[0], peer[1]))

    def _resume_accepting(self) -> None:
        self._resume = None
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._resume is not None:
            self._resume.cancel()
        self._loop.remove_reader(self._sock.fileno())


class TlsListener(Listener):
    """Starts a :class:`TlsServerTransport` per connection, once ``admit``
    (when given) lets it in; a refused one is closed before any TLS."""

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        factory: Callable[[], asyncio.Protocol],
        handshake_timeout_s: float,
        linger_s: float = LINGER_S,
        send_timeout_s: float = SEND_TIMEOUT_S,
        admit: Admit | None = None,
        on_failed: Callable[[Any, str], None] | None = None,
    ) -> None:
        self._admit = admit
        self._on_failed = on_failed
        self._linger_s = linger_s
        self._send_timeout_s = send_timeout_s
        self._context = context
        self._factory = factory
        self._handshake_timeout_s = handshake_timeout_s
        super().__init__(sock)

    def accepted(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        release = None
        if self._admit is not None:
            release = self._admit(peer[0])
            if release is None:
                conn.close()
                return
        try:
            TlsServerTransport(
                self._loop,
                conn,
                self._context,
                self._factory(),
                self._handshake_timeout_s,
                self._linger_s,
                self._send_timeout_s,
                release,
                self._on_failed,
            )
        except OSError as exc:  # reset before we got to it: only this one is lost
            log.debug("connection lost while being set up: %s", exc)
            conn.close()
            if release is not None:
                release()


class ProxyListener(Listener):
    """TLS behind a PROXY-protocol load balancer (see the module docstring).
    ``admit`` is asked about the client address the PROXY header gives (the
    balancer's own is shared by every client); ``on_refused(peer, reason)``
    hears of every connection refused before TLS."""

    def __init__(
        self,
        sock: socket.socket,
        config: ListenerConfig,
        ssl_context: ssl.SSLContext,
        handshake_timeout_s: float,
        factory: Callable[[tuple[str, int]], asyncio.Protocol],
        on_refused: Callable[[tuple[str, int], str], None],
        send_timeout_s: float = SEND_TIMEOUT_S,
        admit: Admit | None = None,
        on_failed: Callable[[Any, str], None] | None = None,
    ) -> None:
        self._config = config
        self._context = ssl_context
        self._handshake_timeout_s = handshake_timeout_s
        self._factory = factory
        self._on_refused = on_refused
        self._send_timeout_s = send_timeout_s
        self._admit = admit
        self._on_failed = on_failed
        #: Connections still waiting for their PROXY header (bounded by its timeout).
        self._pending: set[asyncio.Task[None]] = set()
        super().__init__(sock)

    def accepted(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        task = self._loop.create_task(self._start(conn, peer))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _start(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        loop = self._loop
        try:
            if not is_trusted(peer[0], self._config.trusted_proxies):
                # Untrusted: a PROXY header from it would be a spoofing attempt.
                async with asyncio.timeout(PROXY_HEADER_TIMEOUT_S):
                    await _wait_readable(loop, conn)
                if looks_like_proxy_header(conn.recv(16, socket.MSG_PEEK)):
                    raise ClientRefused(f"PROXY header from untrusted peer {peer[0]}")
                client = peer
            else:
                async with asyncio.timeout(PROXY_HEADER_TIMEOUT_S):
                    version = self._config.proxy_protocol
                    client = await read_proxy_header(loop, conn, version) or peer
            release = self._admit(client[0]) if self._admit is not None else None
            if self._admit is not None and release is None:
                conn.close()
                return
            TlsServerTransport(
                loop,
                conn,
                self._context,
                self._factory(client),
                self._handshake_timeout_s,
                LINGER_S,
                self._send_timeout_s,
                release,
                self._on_failed,
            )
        except (ClientRefused, TimeoutError, OSError) as exc:
            reason = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError):
                reason = "no PROXY header within the timeout"
            self._on_refused(peer, f"PROXY protocol: {reason}")
            conn.close()


class RedirectListener(Listener):
    """Plain HTTP: each connection gets a protocol from ``factory`` (the
    edge's answer is a redirect to HTTPS)."""

    def __init__(self, sock: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        self._factory = factory
        self._pending: set[asyncio.Task[Any]] = set()
        super().__init__(sock)

    def accepted(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        task = self._loop.create_task(self._loop.connect_accepted_socket(self._factory, conn))
        self._pending.add(task)
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("redirect connection lost while being set up: %s", task.exception())
