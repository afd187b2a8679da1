"""Tunnel transports: mutual TLS 1.3 over TCP, or plain TCP inside WireGuard.

Both ends share the configuration types here. The listener (origin) admits a
peer only if its certificate is an *edge* certificate whose identity is
allowed (TLS), or its address falls in an allowed CIDR (TCP inside WireGuard,
where WireGuard has already authenticated the peer's key and bound it to that
address). The dialer (edge) accepts only an *origin* certificate for the name
it dialed. Every refusal is logged with its reason.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tunnel.aio.connection import (
    Authorizer,
    ConnectionInfo,
    StreamAcceptor,
    TunnelConnection,
)
from tunnel.aio.control import ControlHandler
from tunnel.aio.errors import PeerRefused, TunnelHandshakeError
from tunnel.aio.tls import tunnel_client_context, tunnel_server_context
from tunnel.mux import SessionConfig
from tunnel.mux.errors import MuxError
from tunnel.peer_name import PeerRole, parse_peer_name

log = logging.getLogger("geoedge.tunnel")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


#: A DNS name as resolvers take it: dot-separated labels of letters, digits,
#: hyphens and (for service names such as Consul's) underscores.
_NUMERIC = re.compile(r"[0-9.]+")
_DNS_NAME = re.compile(r"(?=.{1,253}\.?$)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.?)+")


def parse_host_port(text: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or (with a default) a bare host. The host
    must be an IP address (IPv6 in brackets) or a DNS name: ``app#x:80``,
    ``http://app:80`` or ``a b:80`` are refused, not passed on to a resolver."""
    host, sep, port = text.rpartition(":")
    if not sep or (host.count(":") and not host.startswith("[")):
        if default_port is None:
            raise ValueError(f"{text!r}: expected host:port")
        host, port = text, str(default_port)
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{text!r}: {host} is not an IPv6 address") from None
        host = host[1:-1]
    elif not is_host_name(host):
        raise ValueError(f"{text!r}: host must be an IP address or a DNS name")
    if not port.isascii() or not port.isdigit() or not 0 < len(port) <= 5:
        raise ValueError(f"{text!r}: port must be 0-65535")
    number = sum(int(c) * 10**i for i, c in enumerate(reversed(port)))
    if number > 65535:
        raise ValueError(f"{text!r}: port must be 0-65535")
    return host, number


def is_host_name(text: str) -> bool:
    """An IPv4 address or a DNS name (all-numeric names must be IPv4 addresses)."""
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return _DNS_NAME.fullmatch(text) is not None and not _NUMERIC.fullmatch(text)
    return True


@dataclass(frozen=True, slots=True)
class TunnelListenerConfig:
    """Where the origin accepts edges."""

    address: str = "0.0.0.0:7443"
    """host:port to bind (for ``tcp``, the WireGuard address)."""
    transport: Literal["tls", "tcp"] = "tls"
    """``tls``: mutual TLS 1.3; ``tcp``: plain TCP, only inside WireGuard."""
    cert: Path | None = None
    """Origin certificate (PEM), for ``tls``."""
    key: Path | None = None
    """Origin private key (PEM), for ``tls``."""
    ca: Path | None = None
    """CA that issued the edges' certificates, for ``tls``."""
    allowed_identities: tuple[str, ...] = ()
    """Edge identities admitted (``tls``); ``"*"`` admits any certificate of the CA."""
    allowed_peers: tuple[Network, ...] = ()
    """CIDRs of admitted edges (``tcp``): their WireGuard addresses."""
    allow_public_plaintext: bool = False
    """Let ``tcp`` bind an address that is not private (see
    :data:`PRIVATE_NETWORKS`), a wildcard or a host name. Plain TCP carries the
    tunnel unencrypted and admits peers by address alone, which only a
    network such as WireGuard makes safe; say so explicitly for any other."""

    def __post_init__(self) -> None:
        host, _ = parse_host_port(self.address)
        if self.transport == "tls":
            if not (self.cert and self.key and self.ca):
                raise ValueError("transport 'tls' needs cert, key and ca")
            if not self.allowed_identities:
                raise ValueError("transport 'tls' needs allowed_identities (or ['*'])")
            return
        if not self.allowed_peers:
            raise ValueError("transport 'tcp' needs allowed_peers (WireGuard CIDRs)")
        exposure = plaintext_exposure(host)
        if exposure is not None and not self.allow_public_plaintext:
            raise ValueError(
                f"address {self.address!r} {exposure}: transport 'tcp' is unencrypted; "
                "bind the private (WireGuard) address, or set allow_public_plaintext = true"
            )


#: Where a plain-TCP tunnel listener may bind without allow_public_plaintext:
#: RFC 1918, RFC 6598 shared space (some VPNs), loopback, link-local, IPv6
#: unique-local and link-local. Written out rather than ``is_private``, which
#: also counts the documentation ranges (203.0.113.0/24 and others).
PRIVATE_NETWORKS: tuple[Network, ...] = tuple(
    ipaddress.ip_network(net)
    for net in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "::1/128",
        "fc00::/7",
        "fe80::/10",
    )
)


def plaintext_exposure(host: str) -> str | None:
    """Why binding ``host`` with plain TCP could expose the tunnel, or None."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return "is a host name, which may resolve to a public address"
    if address.is_unspecified:
        return "binds every address of the host, public ones included"
    if not any(address in net for net in PRIVATE_NETWORKS):
        return "is not a private address"
    return None


@dataclass(frozen=True, slots=True)
class TunnelDialConfig:
    """How an edge reaches one origin."""

    address: str
    """host:port of the origin's tunnel listener."""
    transport: Literal["tls", "tcp"] = "tls"
    server_name: str | None = None
    """Name to verify in the origin's certificate (default: the host)."""
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    connections: int = 2
    """Tunnel connections kept open to this origin (the pool size)."""
    connect_timeout_s: float = 5.0
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 10.0

    def __post_init__(self) -> None:
        parse_host_port(self.address)
        if self.transport == "tls" and not (self.cert and self.key and self.ca):
            raise ValueError("transport 'tls' needs cert, key and ca")
        if self.connections < 1:
            raise ValueError("connections must be at least 1")


def check_peer_certificate(
    der: bytes | None, *, expect_role: PeerRole, allowed: frozenset[str]
) -> str:
    """The identity of a verified tunnel peer certificate, or :class:`PeerRefused`.

    The certificate must name its role in its ``geoedge://<role>/<id>`` URI SAN
    (:func:`geoedge.pki.issue_peer_cert` writes it), and the role must be
    ``expect_role``: an origin admits only ``edge`` certificates and an edge
    dials only ``origin`` ones, so the key of one side can never pose as the
    other, whatever ``allowed`` says. A certificate without the URI SAN (its
    identity would come from the CN) names no role and is refused too. Then
    the identity must be in ``allowed`` (``"*"``: any).
    """
    if der is None:
        raise PeerRefused("no peer certificate")
    name = parse_peer_name(der)
    if name is None:
        raise PeerRefused("certificate carries no geoedge identity")
    if name.role != expect_role:
        found = f"role {name.role!r}" if name.role else "no role (no geoedge:// URI SAN)"
        raise PeerRefused(
            f"certificate of {name.identity!r} has {found}, expected role {expect_role!r}"
        )
    if "*" not in allowed and name.identity not in allowed:
        raise PeerRefused(f"identity {name.identity!r} is not in allowed_identities")
    return name.identity


@dataclass(frozen=True, slots=True)
class _TlsAuthorizer:
    allowed: frozenset[str]
    expect_role: PeerRole

    def __call__(self, transport: asyncio.Transport) -> ConnectionInfo:
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None:
            raise PeerRefused("no TLS session")
        identity = check_peer_certificate(
            ssl_object.getpeercert(binary_form=True),
            expect_role=self.expect_role,
            allowed=self.allowed,
        )
        return ConnectionInfo(identity, _peer(transport), "tls")


@dataclass(frozen=True, slots=True)
class _CidrAuthorizer:
    allowed: tuple[Network, ...] = field(default_factory=tuple)

    def __call__(self, transport: asyncio.Transport) -> ConnectionInfo:
        peer = _peer(transport)
        if peer is None:
            raise PeerRefused("no peer address")
        address = ipaddress.ip_address(peer[0])
        if not any(address in net for net in self.allowed):
            raise PeerRefused(f"{address} is not in allowed_peers")
        return ConnectionInfo(str(address), peer, "tcp")


def _peer(transport: asyncio.Transport) -> tuple[str, int] | None:
    peer = transport.get_extra_info("peername")
    return (peer[0], peer[1]) if peer else None


def _accept_any(transport: asyncio.Transport) -> ConnectionInfo:
    peer = _peer(transport)
    return ConnectionInfo(peer[0] if peer else "?", peer, "tcp")


def listener_ssl_context(config: TunnelListenerConfig) -> ssl.SSLContext | None:
    if config.transport != "tls":
        return None
    assert config.cert and config.key and config.ca
    return tunnel_server_context(config.cert, config.key, config.ca)


async def serve_tunnel(
    config: TunnelListenerConfig,
    session_config: SessionConfig,
    on_stream: StreamAcceptor,
    *,
    on_connection: Callable[[TunnelConnection], None] | None = None,
    sock: socket.socket | None = None,
    ssl_context: ssl.SSLContext | None = None,
    control_handlers: Mapping[int, ControlHandler] | None = None,
) -> asyncio.Server:
    """Listen for edges. ``sock`` lets worker processes share one listening
    socket; ``control_handlers`` answer the edges' CONTROL messages
    (:mod:`tunnel.aio.control`)."""
    loop = asyncio.get_running_loop()
    if config.transport == "tls":
        authorize: Authorizer = _TlsAuthorizer(frozenset(config.allowed_identities), "edge")
        ssl_context = ssl_context or listener_ssl_context(config)
    else:
        authorize = _CidrAuthorizer(config.allowed_peers)
        ssl_context = None

    def factory() -> TunnelConnection:
        connection = TunnelConnection(
            session_config,
            client=False,
            authorize=authorize,
            on_stream=on_stream,
            control_handlers=control_handlers,
        )
        if on_connection is not None:
            on_connection(connection)
        return connection

    if sock is not None:
        return await loop.create_server(factory, sock=sock, ssl=ssl_context, backlog=1024)
    host, port = parse_host_port(config.address)
    return await loop.create_server(
        factory, host, port, ssl=ssl_context, reuse_address=True, backlog=1024
    )


def dial_ssl_context(config: TunnelDialConfig) -> ssl.SSLContext | None:
    if config.transport != "tls":
        return None
    assert config.cert and config.key and config.ca
    return tunnel_client_context(config.cert, config.key, config.ca)


async def dial_tunnel(
    config: TunnelDialConfig,
    session_config: SessionConfig,
    *,
    on_stream: StreamAcceptor | None = None,
    ssl_context: ssl.SSLContext | None = None,
    learned_window_hint: int = 0,
    control_handlers: Mapping[int, ControlHandler] | None = None,
) -> TunnelConnection:
    """One connection attempt: connect, authenticate, wait for the peer's HELLO.
    ``control_handlers`` answer the origin's CONTROL messages (:mod:`tunnel.aio.control`)."""
    loop = asyncio.get_running_loop()
    host, port = parse_host_port(config.address)
    if config.transport == "tls":
        ssl_context = ssl_context or dial_ssl_context(config)
        authorize: Authorizer = _TlsAuthorizer(frozenset({"*"}), "origin")
        server_name: str | None = config.server_name or host
    else:
        ssl_context, authorize, server_name = None, _accept_any, None

    def factory() -> TunnelConnection:
        return TunnelConnection(
            session_config,
            client=True,
            authorize=authorize,
            on_stream=on_stream,
            learned_window_hint=learned_window_hint,
            control_handlers=control_handlers,
        )

    async with asyncio.timeout(config.connect_timeout_s):
        _, connection = await loop.create_connection(
            factory, host, port, ssl=ssl_context, server_hostname=server_name
        )
        try:
            await connection.established
        except (MuxError, PeerRefused) as exc:
            connection.abort("handshake failed")
            raise TunnelHandshakeError(f"{config.address}: {exc}") from exc
        except BaseException:
            connection.abort("handshake failed")
            raise
    return connection
