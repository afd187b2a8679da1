"""The edge's configuration (``edge.toml``): frozen typed data, one docstring per
field, units in the names. Loaded by :func:`tunnel.runtime.config.load_config`,
which rejects unknown keys naming the key and the file.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from edge.http1 import HttpLimits
from tunnel.aio.transport import TunnelDialConfig, parse_host_port
from tunnel.mux import SessionConfig

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

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


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    address: str = "0.0.0.0:443"
    """host:port to listen on with TLS."""
    proxy_protocol: bool = False
    """Expect a PROXY v1/v2 header first (an AWS NLB in front); only accepted
    from ``trusted_proxies``."""
    trusted_proxies: tuple[Network, ...] = ()
    """Peers allowed to send PROXY headers and X-Forwarded-* headers (kept and
    appended to); from everyone else these headers are stripped."""

    def __post_init__(self) -> None:
        parse_host_port(self.address)
        if self.proxy_protocol and not self.trusted_proxies:
            raise ValueError("proxy_protocol needs trusted_proxies (the load balancer's CIDRs)")


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
    """Certificates; the first is the default for unknown or missing SNI."""
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
        if not self.certificates:
            raise ValueError("at least one [[tls.certificates]] entry is needed")
        if self.min_version == "TLSv1.3" and self.max_version == "TLSv1.2":
            raise ValueError("min_version is above max_version")
        for group in self.groups:
            if not _GROUP_NAME.fullmatch(group):
                raise ValueError(f"groups: {group!r} is not a group name (X25519, P-256...)")
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
    header_timeout_s: float = 10.0
    """A request head must arrive whole within this (slowloris)."""
    keepalive_timeout_s: float = 75.0
    """Idle keep-alive connections are closed after this."""
    websocket_idle_timeout_s: float = 3600.0
    """Upgraded connections with no traffic either way are closed after this."""
    tunnel_wait_s: float = 5.0
    """How long a request waits for a tunnel that is (re)connecting before it is
    answered 503; the client's reading is paused meanwhile."""
    send_timeout_s: float = 60.0
    """A client that takes nothing of what is sent to it for this long is cut
    (nginx's ``send_timeout``)."""
    limits: HttpLimits = field(default_factory=HttpLimits)
    access_log: str = "-"
    """File for JSON access-log lines; ``-`` is stdout, empty disables it."""


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
    address: str = "127.0.0.1:9100"
    """/healthz and /metrics; keep it off the public interface."""


@dataclass(frozen=True, slots=True)
class EdgeConfig:
    edge: EdgeSection
    tls: TlsConfig
    origins: tuple[OriginConfig, ...]
    listeners: tuple[ListenerConfig, ...] = (ListenerConfig(),)
    redirect: RedirectListenerConfig | None = None
    http: HttpConfig = field(default_factory=HttpConfig)
    tunnel: SessionConfig = field(default_factory=SessionConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)

    def __post_init__(self) -> None:
        if not self.origins:
            raise ValueError("at least one [[origins]] entry is needed")
        if not self.listeners:
            raise ValueError("at least one [[listeners]] entry is needed")
