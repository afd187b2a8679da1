"""The origin balancer's configuration: ``origin.toml`` validated into frozen dataclasses.

One table per component, units in the names, defaults written here and nowhere
else (``deploy/config/origin.example.toml`` is checked against this schema by a
unit test). Loading goes through :func:`geoedge.config.load_config`, so
every wrong key is reported as ``origin.toml: [pools[0].health] rise: ...``.

Cross-field rules that one table cannot check on its own (pool names unique, at
most one default pool, a host claimed by one pool only) are checked in
:meth:`OriginConfig.__post_init__`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from geoedge.config import load_config
from geoedge.logs import parse_level
from origin.acme.config import AcmeConfig
from origin.hash_key import HashKey
from tunnel.aio.transport import TunnelListenerConfig, is_host_name, parse_host_port
from tunnel.mux import SessionConfig

__all__ = [
    "AdminConfig",
    "BackendConfig",
    "DnsConfig",
    "HealthCheckConfig",
    "OriginConfig",
    "OriginSection",
    "PassiveHealthConfig",
    "PoolConfig",
    "load_origin_config",
    "normalize_host",
]

Algorithm = Literal["least_connections", "round_robin", "weighted", "consistent_hash"]
ProxyProtocolMode = Literal["off", "v1", "v2"]


def normalize_host(text: str) -> str:
    """``Example.COM:443`` -> ``example.com``; ``[::1]:80`` -> ``::1``; trailing dot dropped.

    Pools are matched on this form of the stream's HTTP Host or TLS SNI.
    """
    host = text.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        host = host[1:end] if end > 0 else host[1:]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


@dataclass(frozen=True, slots=True)
class OriginSection:
    id: str = "origin-1"
    """This origin's name, in logs and metrics."""
    workers: int = 0
    """Worker processes sharing the tunnel listener; 0 means one per CPU."""
    drain_timeout_s: float = 30.0
    """On SIGTERM: how long in-flight streams may take to finish after GOAWAY
    before the rest are reset."""
    log_level: str = "info"
    """debug, info, warning or error (``--log-level`` overrides it)."""
    log_json: bool = True
    """JSON lines on stderr (journald); false for a plain line at a terminal
    (``--log-format`` overrides it)."""
    access_log: str = "-"
    """One JSON line per stream (request), joined to the edge's by ``request_id``:
    a file path (reopened on SIGUSR1, for logrotate), ``-`` for stdout, or ``""``
    for none."""

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError("workers must be >= 0 (0 means one per CPU)")
        if self.drain_timeout_s < 0:
            raise ValueError("drain_timeout_s must be >= 0")
        if not self.id:
            raise ValueError("id must not be empty")
        parse_level(self.log_level)


@dataclass(frozen=True, slots=True)
class AdminConfig:
    address: str = "127.0.0.1:7445"
    """host:port of the admin HTTP listener (/livez, /readyz and /healthz,
    /metrics, /status, backend drain); keep it on loopback or a management
    network: it has no authentication. 7445 (the edge's 7444) sits beside the
    tunnel port 7443, clear of node_exporter's 9100 and Envoy's 9901."""

    def __post_init__(self) -> None:
        parse_host_port(self.address)


@dataclass(frozen=True, slots=True)
class HealthCheckConfig:
    path: str = "/health"
    """HTTP path fetched with GET; a 2xx or 3xx answer is a pass."""
    interval_s: float = 2.0
    """Time between checks of one backend."""
    timeout_s: float = 1.0
    """A check not answered within this is a failure."""
    rise: int = 2
    """Consecutive passes that bring a down backend back."""
    fall: int = 2
    """Consecutive failures that take an up backend out."""

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError("path must start with '/'")
        if not 0 < self.timeout_s <= self.interval_s:
            raise ValueError("need 0 < timeout_s <= interval_s")
        if self.rise < 1 or self.fall < 1:
            raise ValueError("rise and fall must be at least 1")


@dataclass(frozen=True, slots=True)
class PassiveHealthConfig:
    failures: int = 3
    """Consecutive connect failures (in one worker) that eject a backend."""
    eject_base_s: float = 1.0
    """First ejection lasts this long; each further one in a row doubles it."""
    eject_max_s: float = 30.0
    """Longest ejection."""

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError("failures must be at least 1")
        if not 0 < self.eject_base_s <= self.eject_max_s:
            raise ValueError("need 0 < eject_base_s <= eject_max_s")


@dataclass(frozen=True, slots=True)
class BackendConfig:
    address: str
    """host:port of a Node.js backend (an IP address avoids a DNS lookup per connect)."""
    weight: int = 1
    """Relative share for the weighted algorithms (and least_connections' tie-break)."""

    def __post_init__(self) -> None:
        parse_host_port(self.address)
        if not 1 <= self.weight <= 1000:
            raise ValueError("weight must be in 1..1000")


@dataclass(frozen=True, slots=True)
class DnsConfig:
    name: str
    """The name to resolve (for SRV: ``_http._tcp.app.service.consul``)."""
    type: Literal["A", "AAAA", "SRV"] = "A"
    """A/AAAA give addresses (with ``port``); SRV gives targets, ports and weights."""
    port: int = 0
    """Backend port for A/AAAA records (SRV records carry their own)."""
    interval_s: float = 10.0
    """How often the name is resolved again."""
    nameservers: tuple[str, ...] = ()
    """``ip`` or ``ip:port`` of DNS servers to ask (Consul: ``127.0.0.1:8600``);
    empty: the system resolver (A/AAAA through getaddrinfo, so /etc/hosts counts)."""

    def __post_init__(self) -> None:
        if not is_host_name(self.name):
            raise ValueError(f"name {self.name!r} is not a DNS name")
        if self.type != "SRV" and not 0 < self.port <= 65535:
            raise ValueError(f"type {self.type!r} needs a port (1-65535)")
        if self.interval_s <= 0:
            raise ValueError("interval_s must be positive")
        for server in self.nameservers:
            host, _, port = server.rpartition(":") if server.count(":") == 1 else (server, "", "")
            try:
                ipaddress.ip_address((host or server).strip("[]"))
            except ValueError:
                raise ValueError(f"nameserver {server!r} is not an IP address") from None
            if port and not (port.isdigit() and 0 < int(port) <= 65535):
                raise ValueError(f"nameserver {server!r}: bad port")


@dataclass(frozen=True, slots=True)
class PoolConfig:
    name: str
    """Pool name, in metrics and in the admin's drain URLs."""
    hosts: tuple[str, ...] = ()
    """HTTP Host / TLS SNI names served by this pool (``*.example.com`` matches
    one or more labels in front of ``example.com``)."""
    default: bool = False
    """Streams whose host matches no pool go to the default pool."""
    algorithm: Algorithm = "least_connections"
    """least_connections, round_robin, weighted (smooth weighted round robin)
    or consistent_hash (on ``hash_key``, for stickiness)."""
    hash_key: str = "client_ip"
    """What consistent_hash hashes: client_ip, path, header:<name> (e.g.
    header:x-user) or cookie:<name> (e.g. cookie:session); a request without
    the header or cookie falls back to its client address."""
    proxy_protocol: ProxyProtocolMode = "off"
    """Send a PROXY protocol header with the client address first: ``"v1"``,
    ``"v2"`` or ``"off"``; the same values as the edge's ``[[listeners]]
    proxy_protocol``, which expects one."""
    connect_timeout_s: float = 2.0
    """Time allowed for one TCP connect to a backend."""
    connect_retries: int = 2
    """Other backends tried when a connect fails (nothing was sent yet)."""
    max_connections_per_backend: int = 0
    """Streams (requests) this origin host sends to one backend at once; 0: no
    cap. Divided among the workers (each enforces its share, rounded up), so
    the limit does not grow with the instance size. When every usable backend
    is at its cap, new streams queue (below)."""
    queue_timeout_s: float = 5.0
    """How long a stream may wait for a backend slot (HAProxy's timeout queue);
    past it the stream is reset with NO_BACKEND (the edge answers 503).
    0: no queue, a stream that finds every backend at its cap fails at once."""
    max_queued: int = 1024
    """Streams one worker queues per pool; beyond it new ones fail at once."""
    keepalive_timeout_s: float = 3.0
    """How long a backend connection left idle by a finished stream is kept for
    the next stream to the same backend (HTTP keep-alive reuse; the edge's
    ``[http] keepalive_timeout_s`` is the same idea towards clients). Keep it
    below the backends' own keep-alive timeout (Node.js: 5 s). 0: a new
    connection per stream. Never used with ``proxy_protocol`` (its header is
    per client)."""
    keepalive_max_idle: int = 64
    """Idle connections one worker keeps per backend."""
    slow_start_s: float = 0.0
    """A backend that comes back ramps its weight from ~0 to full over this long."""
    first_byte_timeout_s: float = 60.0
    """How long a backend may take to start its response, counted from the last
    octet sent to it (Varnish's and Fastly's ``first_byte_timeout``); past it
    the stream is reset with TIMEOUT (the edge answers 504) and the backend
    connection closed. The edge's ``[http] first_byte_timeout_s`` is the same
    deadline a hop before. 0: none."""
    between_bytes_timeout_s: float = 60.0
    """Silence allowed once the backend's response has started (no octet either
    way for this long: reset with TIMEOUT, the client's response is cut;
    ``between_bytes_timeout``, nginx's ``proxy_read_timeout``). Not applied
    after a 101 (WebSocket: the edge's idle timeout applies). 0: none."""
    long_poll_prefixes: tuple[str, ...] = ()
    """Request targets (path prefixes) exempt from both deadlines here. The
    edge's ``[http] long_poll_prefixes`` is the one to set: it exempts its own
    deadlines and marks the stream (LONG_POLL), which this origin honours
    whatever this list says. This list only adds targets the origin alone
    spares (an edge still cuts them at its own deadlines)."""
    health: HealthCheckConfig | None = None
    """Active HTTP checks; without this table only passive ejection applies."""
    passive: PassiveHealthConfig = field(default_factory=PassiveHealthConfig)
    """Ejection after consecutive connect failures."""
    backends: tuple[BackendConfig, ...] = ()
    """Static backends."""
    dns: DnsConfig | None = None
    """Backends discovered in DNS (in addition to the static ones)."""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError("name must be non-empty and contain no '/'")
        if not self.backends and self.dns is None:
            raise ValueError(f"pool {self.name!r} needs backends or a dns table")
        if self.connect_timeout_s <= 0:
            raise ValueError("connect_timeout_s must be positive")
        if self.connect_retries < 0 or self.max_connections_per_backend < 0:
            raise ValueError("connect_retries and max_connections_per_backend must be >= 0")
        if self.slow_start_s < 0:
            raise ValueError("slow_start_s must be >= 0")
        if self.keepalive_timeout_s < 0 or self.keepalive_max_idle < 0:
            raise ValueError("keepalive_timeout_s and keepalive_max_idle must be >= 0")
        HashKey.parse(self.hash_key)
        if self.queue_timeout_s < 0 or self.max_queued < 0:
            raise ValueError("queue_timeout_s and max_queued must be >= 0")
        if self.first_byte_timeout_s < 0 or self.between_bytes_timeout_s < 0:
            raise ValueError(
                "first_byte_timeout_s and between_bytes_timeout_s must be >= 0 (0: none)"
            )
        if any(not prefix.startswith("/") for prefix in self.long_poll_prefixes):
            raise ValueError("long_poll_prefixes must start with '/'")
        seen: set[str] = set()
        for backend in self.backends:
            if backend.address in seen:
                raise ValueError(f"backend {backend.address} listed twice")
            seen.add(backend.address)
        for host in self.hosts:
            if normalize_host(host) != host.lower().rstrip(".") or not host:
                raise ValueError(f"host {host!r}: give a bare name, without port")


@dataclass(frozen=True, slots=True)
class OriginConfig:
    #: Old key paths that still load, with a deprecation warning naming the new
    #: one (geoedge.config_renames): the edge's names for the same ideas.
    RENAMED_KEYS: ClassVar[dict[str, str | tuple[str, ...]]] = {
        "pools[].response_timeout_s": "pools[].first_byte_timeout_s",
        "pools[].read_timeout_s": "pools[].between_bytes_timeout_s",
        "pools[].keepalive_idle_s": "pools[].keepalive_timeout_s",
    }

    tunnel_listener: TunnelListenerConfig
    """Where edges connect (mutual TLS, or TCP inside WireGuard)."""
    pools: tuple[PoolConfig, ...]
    """Backend pools, chosen per stream by Host/SNI."""
    origin: OriginSection = field(default_factory=OriginSection)
    tunnel: SessionConfig = field(default_factory=SessionConfig)
    """Tunnel tuning (windows, ping, limits)."""
    admin: AdminConfig = field(default_factory=AdminConfig)
    acme: AcmeConfig | None = None
    """Certificates for the edges from an ACME CA (docs/acme.md); none: off."""

    def __post_init__(self) -> None:
        if not self.pools:
            raise ValueError("at least one [[pools]] is needed")
        names = [pool.name for pool in self.pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pool names must be unique: {', '.join(duplicates)}")
        defaults = [pool.name for pool in self.pools if pool.default]
        if len(defaults) > 1:
            raise ValueError(f"more than one default pool: {', '.join(defaults)}")
        owner: dict[str, str] = {}
        for pool in self.pools:
            for host in pool.hosts:
                key = host.lower().rstrip(".")
                if key in owner:
                    raise ValueError(f"host {host!r} is in pools {owner[key]!r} and {pool.name!r}")
                owner[key] = pool.name

    def pool(self, name: str) -> PoolConfig | None:
        return next((pool for pool in self.pools if pool.name == name), None)


def load_origin_config(path: str | Path) -> OriginConfig:
    """Read and validate ``origin.toml``; raises :class:`~geoedge.config.ConfigError`."""
    return load_config(path, OriginConfig)
