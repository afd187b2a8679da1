"""The edge's configuration (``edge.toml``): frozen typed data, one docstring per
field, units in the names. Loaded by :func:`geoedge.config.load_config`,
which rejects unknown keys naming the key and the file.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from edge.cache.config import CacheConfig, CompressionConfig
from edge.http1 import HttpLimits
from geoedge.logs import parse_level
from tunnel.aio.transport import TunnelDialConfig, parse_host_port
from tunnel.mux import SessionConfig

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: What a listener expects first: the versions the origin sends (its
#: ``ProxyProtocolMode``), and ``any`` for either.
ProxyProtocolExpected = Literal["off", "v1", "v2", "any"]
#: ``[http] h2_engine``: edge.h2_engine.CHOICES.
H2Engine = Literal["auto", "nghttp2", "h2"]

#: Mozilla "intermediate" TLS 1.2 ciphers (TLS 1.3 suites are OpenSSL's defaults).
MOZILLA_INTERMEDIATE_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384:DHE-RSA-CHACHA20-POLY1305"
)


@dataclass(frozen=True, slots=True)
class EdgeSection:
    id: str
    """This edge's name, sent to the origin in stream metadata and logged."""
    workers: int = 0
    """Worker processes sharing the listeners; 0 means one per CPU."""
    drain_timeout_s: float = 30.0
    """On SIGTERM: how long in-flight requests may finish before being cut."""
    drain_websocket_window_s: float = 10.0
    """On SIGTERM the edge closes each WebSocket itself (Close 1001, "going
    away", to both ends, between frames) at a random moment within this window,
    so clients reconnect spread out rather than as one wave (HAProxy's
    close-spread-time). Capped at drain_timeout_s; 0: all at once."""
    log_level: str = "info"
    """debug, info, warning or error (``--log-level`` overrides it)."""
    log_json: bool = True
    """JSON lines on stderr (journald); false for a plain line at a terminal
    (``--log-format`` overrides it)."""
    access_log: str = "-"
    """One JSON line per request: a file path (reopened on SIGUSR1, for
    logrotate), ``-`` for stdout, or ``""`` for none. Where the origin has its
    own, ``[origin] access_log`` (this was ``[http] access_log``)."""

    def __post_init__(self) -> None:
        if self.drain_websocket_window_s < 0 or self.drain_timeout_s < 0:
            raise ValueError("drain_timeout_s and drain_websocket_window_s must be >= 0")
        parse_level(self.log_level)


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """One HTTPS listener. Trust follows the hop (README "Trust"): a PROXY header
    vouches for TCP addresses only, so an L4 load balancer in ``trusted_proxies``
    never makes the client's HTTP forwarding headers trustworthy; only the HTTP
    hop in front, when listed in ``http_proxies``, may set them."""

    address: str = "0.0.0.0:443"
    """host:port to listen on with TLS."""
    proxy_protocol: ProxyProtocolExpected = "off"
    """The PROXY header a load balancer in front sends before TLS: ``"v2"``
    (an AWS NLB target group with proxy_protocol_v2), ``"v1"`` (HAProxy's
    ``send-proxy``, a Classic Load Balancer), ``"any"`` (either: while moving
    from one to the other) or ``"off"``. A header of the other version is
    refused. The same values as the origin's ``[[pools]] proxy_protocol``,
    which sends one (``true``, the old spelling, is read as ``"any"``)."""
    trusted_proxies: tuple[Network, ...] = ()
    """With ``proxy_protocol``: the load balancers (CIDRs) allowed to send a PROXY
    header. A connection from them must carry one; from anyone else a PROXY
    header is refused as spoofing."""
    alpn: tuple[str, ...] = ("h2", "http/1.1")
    """Protocols offered by ALPN, in order of preference: ``h2`` and/or
    ``http/1.1``. A client that offers no ALPN speaks HTTP/1.1."""
    http_proxies: tuple[Network, ...] = ()
    """HTTP proxies in front (CIDRs) whose forwarding headers (X-Forwarded-For,
    Forwarded, X-Real-IP, X-Forwarded-Proto/Host/Port, X-Request-Id) are kept
    and appended to; from every other client they are replaced. The address
    checked is the one that spoke HTTP to the edge: the PROXY header's source
    on a ``proxy_protocol`` listener, the TCP peer otherwise. Empty (the
    default): nobody's are trusted."""

    def __post_init__(self) -> None:
        parse_host_port(self.address)
        if (
            not self.alpn
            or set(self.alpn) - {"h2", "http/1.1"}
            or len(set(self.alpn)) != len(self.alpn)
        ):
            raise ValueError('alpn must list "h2" and/or "http/1.1", each once')
        if self.proxy_protocol != "off" and not self.trusted_proxies:
            raise ValueError("proxy_protocol needs trusted_proxies (the load balancer's CIDRs)")
        if self.trusted_proxies and self.proxy_protocol == "off":
            raise ValueError(
                "trusted_proxies lists PROXY-protocol load balancers and needs"
                ' proxy_protocol = "v2" (or "v1"); for HTTP proxies that set'
                " X-Forwarded-For use http_proxies"
            )


@dataclass(frozen=True, slots=True)
class RedirectListenerConfig:
    address: str = "0.0.0.0:80"
    """host:port of the plain-HTTP listener; everything is redirected (301) to HTTPS."""
    pass_through_prefixes: tuple[str, ...] = ("/.well-known/acme-challenge/",)
    """Paths forwarded to the origin instead (ACME HTTP-01)."""
    https_port: int = 443
    """Port written in the redirect's Location (omitted when 443)."""


@dataclass(frozen=True, slots=True)
class CertificateConfig:
    cert: Path
    """PEM certificate chain."""
    key: Path
    """PEM private key (ECDSA or RSA)."""
    names: tuple[str, ...] = ()
    """SNI names served by this certificate (exact or ``*.example.com``);
    empty means the certificate's own DNS SANs."""
    ocsp_response: Path | None = None
    """A DER OCSP response for this certificate (e.g. ``openssl ocsp ...
    -respout``), stapled for clients that ask; re-read on SIGHUP. Refresh it
    before its nextUpdate (cron + SIGHUP): an expired one is not stapled."""


#: Mozilla "intermediate" key-exchange groups, most preferred first.
MOZILLA_INTERMEDIATE_GROUPS = ("X25519", "P-256", "P-384")
_GROUP_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
#: RFC 6797 §11.2: a year at least for preload lists; 0 switches HSTS off.
HSTS_PRELOAD_MIN_AGE_S = 31_536_000


@dataclass(frozen=True, slots=True)
class TlsConfig:
    certificates: tuple[CertificateConfig, ...] = ()
    """Certificates; the first is the default for unknown or missing SNI. They
    take precedence over the origin's ACME certificates for their names.
    Empty only with ``[acme] enabled``."""
    min_version: Literal["TLSv1.2", "TLSv1.3"] = "TLSv1.2"
    max_version: Literal["TLSv1.2", "TLSv1.3"] = "TLSv1.3"
    ciphers: str = MOZILLA_INTERMEDIATE_CIPHERS
    """TLS 1.2 cipher list (OpenSSL syntax)."""
    groups: tuple[str, ...] = MOZILLA_INTERMEDIATE_GROUPS
    """Key-exchange groups offered, most preferred first, in OpenSSL's names
    (X25519, P-256, P-384, P-521, X448, ffdhe2048...). Empty: OpenSSL's own
    list (which adds X448 and P-521)."""
    handshake_timeout_s: float = 10.0
    session_tickets: bool = True
    """Stateless resumption; ticket keys are made before the workers fork, so
    a ticket from one worker resumes on any other."""
    tickets_per_handshake: int = 1
    """TLS 1.3 session tickets sent after each handshake (OpenSSL's
    ``num_tickets``, whose default is 2; Go's TLS servers send 1). A ticket
    resumes one connection (RFC 8446 §C.4), and a client keeps one per
    connection it had: a browser's one HTTP/2 connection needs one. Each
    ticket costs the edge ~50 us of CPU per full handshake (measured: 2
    tickets ~730, 1 ticket ~660 us of edge CPU per connection)."""
    hsts_max_age_s: int = 0
    """Strict-Transport-Security max-age sent on every HTTPS response (also
    the edge's own errors and the backend's, ahead of any STS field of its
    own); 0: no HSTS. Start low (300), then raise it to a year or more."""
    hsts_include_subdomains: bool = False
    """Add ``includeSubDomains``: every subdomain must serve HTTPS too."""
    hsts_preload: bool = False
    """Add ``preload`` (for hstspreload.org; needs includeSubDomains and a
    max-age of a year or more, and is hard to undo)."""

    def __post_init__(self) -> None:
        if self.min_version == "TLSv1.3" and self.max_version == "TLSv1.2":
            raise ValueError("min_version is above max_version")
        for group in self.groups:
            if not _GROUP_NAME.fullmatch(group):
                raise ValueError(f"groups: {group!r} is not a group name (X25519, P-256...)")
        if not 1 <= self.tickets_per_handshake <= 16:
            raise ValueError("tickets_per_handshake must be 1..16 (session_tickets = false: none)")
        if self.hsts_max_age_s < 0:
            raise ValueError("hsts_max_age_s must be >= 0 (0: no HSTS)")
        if self.hsts_max_age_s == 0 and (self.hsts_include_subdomains or self.hsts_preload):
            raise ValueError("hsts_include_subdomains/hsts_preload need hsts_max_age_s > 0")
        if self.hsts_preload and (
            not self.hsts_include_subdomains or self.hsts_max_age_s < HSTS_PRELOAD_MIN_AGE_S
        ):
            raise ValueError(
                "hsts_preload needs hsts_include_subdomains and "
                f"hsts_max_age_s >= {HSTS_PRELOAD_MIN_AGE_S} (a year)"
            )

    def hsts_value(self) -> str | None:
        """The Strict-Transport-Security field value, or None when HSTS is off."""
        if self.hsts_max_age_s == 0:
            return None
        value = f"max-age={self.hsts_max_age_s}"
        if self.hsts_include_subdomains:
            value += "; includeSubDomains"
        if self.hsts_preload:
            value += "; preload"
        return value


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """Deadlines (edge/deadlines.py has the table) and limits of client HTTP."""

    header_timeout_s: float = 10.0
    """A request head must arrive whole within this of its first octet (an
    absolute deadline, so a trickle cannot extend it: slowloris) → 408."""
    keepalive_timeout_s: float = 75.0
    """Idle keep-alive connections are closed after this."""
    body_timeout_s: float = 30.0
    """A request body must progress at least this often → 408, and its stream
    is reset (nginx's ``client_body_timeout``)."""
    first_byte_timeout_s: float = 60.0
    """How long a response may take to start once its request went up whole
    (counted from the request's last octet, so a slow upload is not the
    backend's fault) → 504, the stream reset (Varnish's and Fastly's
    ``first_byte_timeout``). The origin's ``[[pools]] first_byte_timeout_s``
    is the same deadline at the backend."""
    between_bytes_timeout_s: float = 60.0
    """Silence allowed once a response has started: nothing more from the
    origin for this long → the client's connection is cut, the stream reset
    (``between_bytes_timeout``; nginx's ``proxy_read_timeout``). Time the
    client's own slow reading holds it up does not count (``send_timeout_s``
    covers that). The origin's ``[[pools]] between_bytes_timeout_s`` is the
    same deadline at the backend."""
    long_poll_prefixes: tuple[str, ...] = ()
    """Request paths (prefixes) that long-poll or stream events and may be
    silent on purpose: they get ``websocket_idle_timeout_s`` instead of the two
    deadlines above. Listing them here is enough: the edge marks their streams
    (LONG_POLL, tunnel/PROTOCOL.md §6.2) and the origin then spares them its
    own deadlines too (docs/operations.md, "Long polls")."""
    h2_max_concurrent_streams: int = 100
    """Requests an HTTP/2 client may have open at once on one connection."""
    h2_engine: H2Engine = "auto"
    """What runs HTTP/2 with the clients: ``"nghttp2"`` (libnghttp2, in C,
    through geoedge's binding: built by ``pip install`` or ``make venv`` where
    libnghttp2's headers are, ``libnghttp2-dev`` on Debian), ``"h2"`` (the
    pure-Python ``h2`` library), or ``"auto"``: nghttp2 when the binding is
    built, else h2. Both behave the same to clients (docs/http2.md); the
    start-up line (and a reload's) says which runs. Naming one that cannot
    run here stops the edge at start-up (and ``--check`` refuses it)."""
    websocket_idle_timeout_s: float = 3600.0
    """Upgraded connections with no traffic either way are closed after this."""
    tunnel_wait_s: float = 5.0
    """How long a request waits for a tunnel that is (re)connecting before it is
    answered 503; the client's reading is paused meanwhile."""
    send_timeout_s: float = 60.0
    """A client that takes nothing of what is sent to it for this long is cut
    (nginx's ``send_timeout``)."""
    readiness_path: str = "/_geoedge/readyz"
    """Answered by the edge itself on every listener, HTTPS and the plain-HTTP
    one (HAProxy's ``monitor-uri``), for load balancers and DNS health checks
    that can reach only the traffic ports: ``GET`` or ``HEAD`` gets 200 while
    the worker that accepted it has a usable tunnel, 503 when it has none or
    the edge is draining. Never sent to the origin. Empty: off (the path is
    proxied like any other). The admin listener's ``/livez`` and ``/readyz``
    say the same per host."""
    limits: HttpLimits = field(default_factory=HttpLimits)

    def __post_init__(self) -> None:
        if self.first_byte_timeout_s <= 0 or self.between_bytes_timeout_s <= 0:
            raise ValueError("first_byte_timeout_s and between_bytes_timeout_s must be positive")
        if any(not prefix.startswith("/") for prefix in self.long_poll_prefixes):
            raise ValueError("long_poll_prefixes must start with '/'")
        if self.readiness_path and (
            not self.readiness_path.startswith("/") or "?" in self.readiness_path
        ):
            raise ValueError("readiness_path must be a path starting with '/', without a query")


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Who gets in (edge/admission.py): connection caps and request rates.
    Renamed from ``[limits]``, which ``[http.limits]`` (sizes of HTTP
    messages) made a name for two things. The caps are per host: each of the N
    workers enforces its share (the cap / N, rounded up), so the limit does not
    grow with the instance size."""

    max_connections: int = 10_000
    """Client connections this edge holds; past it new ones are closed right
    after accept(), before any TLS handshake."""
    max_connections_per_client_ip: int = 1024
    """Client connections from one address (after PROXY protocol) this edge
    holds; past it new ones are closed at once. The kernel spreads one
    client's connections over the workers unevenly, so keep it generous (the
    default is): carrier and office NAT put many users behind one address."""
    requests_per_s_per_client_ip: float = 0.0
    """Sustained requests a second from one address (token bucket); more get
    429 and a close. 0 turns the limit off."""
    request_burst: int = 100
    """How many requests above the rate one address may send at once."""

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_connections_per_client_ip < 1:
            raise ValueError("connection caps must be at least 1")
        if self.requests_per_s_per_client_ip < 0 or self.request_burst < 1:
            raise ValueError("requests_per_s_per_client_ip >= 0 and request_burst >= 1")


@dataclass(frozen=True, slots=True)
class OriginConfig:
    name: str
    """Origin name (logs, metrics, access log)."""
    tunnel: TunnelDialConfig
    """How to reach it: ``address``, ``transport``, certificates, ``connections``."""
    weight: int = 1
    """Share of new streams when several origins are equally close."""

    def __post_init__(self) -> None:
        if not 1 <= self.weight <= 1000:
            raise ValueError("weight must be in 1..1000")


@dataclass(frozen=True, slots=True)
class AdminConfig:
    address: str = "127.0.0.1:7444"
    """host:port of the admin HTTP listener: /livez, /readyz (and /healthz),
    /metrics, /status. No authentication: keep it on loopback or a management
    network. 7444 (the origin's 7445) sits beside the tunnel port 7443, clear
    of node_exporter's 9100, Envoy's 9901 and the usual exporter ports."""

    def __post_init__(self) -> None:
        parse_host_port(self.address)


@dataclass(frozen=True, slots=True)
class AcmeConfig:
    """Certificates issued by the origin's ACME client (docs/acme.md): the
    origin sends them, and the challenges it must answer, over the tunnels."""

    enabled: bool = False
    """Take certificates and ACME challenges from the origins. Off: the edge
    answers their messages "unknown kind" and serves its files only."""
    store_dir: Path = Path("/var/lib/geoedge/edge-acme")
    """Where issued certificates and their keys are kept (one file each, mode
    0600; the directory 0700, created if missing), so the edge serves them
    after a restart without its origin. The unit's StateDirectory."""


@dataclass(frozen=True, slots=True)
class EdgeConfig:
    #: Old key paths that still load, with a deprecation warning naming the new
    #: one (geoedge.config): the same names as the origin's for the same ideas.
    RENAMED_KEYS: ClassVar[dict[str, str | tuple[str, ...]]] = {
        "http.access_log": "edge.access_log",
        "limits": "admission",
        # One deadline for both phases; the origin had one for each.
        "http.response_timeout_s": ("http.first_byte_timeout_s", "http.between_bytes_timeout_s"),
    }
    RENAMED_VALUES: ClassVar[dict[str, tuple[tuple[object, object], ...]]] = {
        "listeners[].proxy_protocol": ((True, "any"), (False, "off")),
    }

    edge: EdgeSection
    tls: TlsConfig
    origins: tuple[OriginConfig, ...]
    listeners: tuple[ListenerConfig, ...] = (ListenerConfig(),)
    redirect: RedirectListenerConfig | None = None
    http: HttpConfig = field(default_factory=HttpConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    tunnel: SessionConfig = field(default_factory=SessionConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    acme: AcmeConfig = field(default_factory=AcmeConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)

    def __post_init__(self) -> None:
        if not self.origins:
            raise ValueError("at least one [[origins]] entry is needed")
        if not self.tls.certificates and not self.acme.enabled:
            raise ValueError(
                "at least one [[tls.certificates]] entry is needed (or [acme] enabled = true)"
            )
        if not self.listeners:
            raise ValueError("at least one [[listeners]] entry is needed")
