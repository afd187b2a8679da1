"""``[acme]`` in ``origin.toml``: the ACME account, the certificates to keep
issued for the edges, how to prove control of their names, and when to renew.

Defaults are written here and nowhere else (``geoedge config --defaults
origin`` and ``deploy/config/origin.example.toml`` come from them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from geoedge.acme_wire import is_dns_name

__all__ = [
    "LETS_ENCRYPT",
    "LETS_ENCRYPT_STAGING",
    "AcmeCertificateConfig",
    "AcmeConfig",
    "ChallengeType",
    "DnsConfig",
]

ChallengeType = Literal["http-01", "tls-alpn-01", "dns-01"]
KeyType = Literal["ecdsa-p256", "ecdsa-p384", "rsa-2048", "rsa-4096"]

LETS_ENCRYPT = "https://acme-v02.api.letsencrypt.org/directory"
LETS_ENCRYPT_STAGING = "https://acme-staging-v02.api.letsencrypt.org/directory"

_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


@dataclass(frozen=True, slots=True)
class AcmeCertificateConfig:
    """One certificate kept issued: its names, and what it is called."""

    id: str
    """Names the certificate in files (``<id>.pem`` on origin and edges),
    metrics and ``geoedge acme renew --force <id>``: lowercase letters, digits, ``.-_``."""
    domains: tuple[str, ...]
    """Its DNS names (the first is the subject). ``*.example.com`` needs dns-01."""
    challenge_types: tuple[ChallengeType, ...] = ()
    """This certificate's challenges in order of preference; empty: [acme] challenge_types."""
    key_type: KeyType = "ecdsa-p256"
    """The certificate's key, made anew at each renewal. ECDSA P-256 signs ~17x
    faster than RSA-2048 (measured on the edge's CPU); add an RSA certificate for the same
    names only for clients that cannot verify ECDSA."""

    def __post_init__(self) -> None:
        if not _ID.fullmatch(self.id):
            raise ValueError(f"id {self.id!r}: lowercase letters, digits and .-_ only")
        if not self.domains:
            raise ValueError("domains must name at least one DNS name")
        for domain in self.domains:
            if not is_dns_name(domain, wildcard=True):
                raise ValueError(f"domains: {domain!r} is not a lowercase DNS name")
        if len(set(self.domains)) != len(self.domains):
            raise ValueError("domains: a name is listed twice")


@dataclass(frozen=True, slots=True)
class DnsConfig:
    """DNS-01: how TXT records are set (the only way to a wildcard certificate)."""

    provider: Literal["route53", "challtestsrv"] = "route53"
    """``route53`` (boto3, the instance's IAM role: route53:ChangeResourceRecordSets,
    route53:GetChange, route53:ListHostedZones), or ``challtestsrv``
    (Pebble's test DNS server, for trying the whole flow locally)."""
    route53_hosted_zone_id: str = ""
    """The hosted zone holding the names; empty: the longest zone matching each name."""
    challtestsrv_url: str = "http://127.0.0.1:8055"
    """pebble-challtestsrv's management address (provider ``challtestsrv``)."""
    ttl_s: int = 60
    """TTL of the TXT records."""
    propagation_timeout_s: float = 300.0
    """How long to wait for the provider to report the record in place."""

    def __post_init__(self) -> None:
        if self.ttl_s < 1 or self.propagation_timeout_s <= 0:
            raise ValueError("ttl_s must be >= 1 and propagation_timeout_s > 0")


@dataclass(frozen=True, slots=True)
class AcmeConfig:
    """The origin's ACME client (RFC 8555); docs/acme.md."""

    certificates: tuple[AcmeCertificateConfig, ...] = ()
    """The certificates to keep issued and sent to every edge ([[acme.certificates]])."""
    directory_url: str = ""
    """The CA's ACME directory; empty: Let's Encrypt (its staging directory
    when ``staging``)."""
    staging: bool = False
    """With no directory_url: Let's Encrypt's staging CA (untrusted
    certificates, generous rate limits): try a setup there first."""
    contact: tuple[str, ...] = ()
    """The account's contacts (``mailto:ops@example.com``)."""
    agree_to_terms: bool = False
    """You agree to the CA's terms of service (the directory's termsOfService
    URL); an account cannot be made without it."""
    state_dir: Path = Path("/var/lib/geoedge/origin-acme")
    """The account key and the issued certificates (files 0600, the directory
    0700, created if missing). Back it up with the origin: the account key
    is the account."""
    challenge_types: tuple[ChallengeType, ...] = ("http-01", "tls-alpn-01")
    """Challenges to answer, in order of preference; a wildcard name always
    uses dns-01 (which needs [acme.dns])."""
    ca_bundle: Path | None = None
    """CAs trusted for the ACME server's own HTTPS (a test CA such as Pebble's);
    none: the system's."""
    renew_at_lifetime_fraction: float = 2 / 3
    """Without renewal information from the CA (ARI, RFC 9773), renew once this
    share of the lifetime has passed (90 days: at day 60)."""
    use_ari: bool = True
    """Renew when the CA's renewal information says, where it offers it."""
    retry_base_s: float = 60.0
    """A failed attempt is retried after a random delay in [0, base * 2^n],
    capped by retry_cap_s (full jitter)."""
    retry_cap_s: float = 3600.0
    ocsp_stapling: bool = True
    """Fetch the OCSP response of each certificate that names a responder and
    have every edge staple it (refreshed halfway through its validity). Let's
    Encrypt ended OCSP in 2025: its certificates name no responder, so
    nothing is fetched for them."""
    edge_ack_timeout_s: float = 10.0
    """How long to wait for the edges to confirm a challenge or a certificate."""
    validation_timeout_s: float = 120.0
    """How long the CA may take to validate and to issue."""
    dns: DnsConfig | None = None
    """DNS-01's provider ([acme.dns]); needed for wildcard names."""

    def __post_init__(self) -> None:
        if not self.certificates:
            raise ValueError("[[acme.certificates]] must list at least one certificate")
        ids = [c.id for c in self.certificates]
        if len(set(ids)) != len(ids):
            raise ValueError("[[acme.certificates]] ids must be unique")
        if self.directory_url and not self.directory_url.startswith(("https://", "http://")):
            raise ValueError("directory_url must be an http(s) URL")
        if not self.challenge_types or len(set(self.challenge_types)) != len(self.challenge_types):
            raise ValueError("challenge_types must list each type once")
        if "dns-01" in self.challenge_types and self.dns is None:
            raise ValueError("challenge type dns-01 needs [acme.dns]")
        wildcards = [d for c in self.certificates for d in c.domains if d.startswith("*.")]
        if wildcards and self.dns is None:
            raise ValueError(f"{wildcards[0]} is a wildcard: it needs dns-01 and [acme.dns]")
        if not 0.1 <= self.renew_at_lifetime_fraction <= 0.95:
            raise ValueError("renew_at_lifetime_fraction must be in 0.1..0.95")
        if not 0 < self.retry_base_s <= self.retry_cap_s:
            raise ValueError("need 0 < retry_base_s <= retry_cap_s")
        if self.edge_ack_timeout_s <= 0 or self.validation_timeout_s <= 0:
            raise ValueError("edge_ack_timeout_s and validation_timeout_s must be positive")
        for contact in self.contact:
            if not contact.startswith("mailto:"):
                raise ValueError(f"contact {contact!r}: give mailto: URLs")

    @property
    def directory(self) -> str:
        """The directory URL in effect."""
        if self.directory_url:
            return self.directory_url
        return LETS_ENCRYPT_STAGING if self.staging else LETS_ENCRYPT
