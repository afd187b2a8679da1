"""How long every certificate a daemon relies on has left: one metric, one table.

Certificates expire silently otherwise: the tunnel certificates last 825
days, the CA ten years, the server certificates users see 90 days with ACME.
Each daemon watches the certificate files its config names and exports, per
certificate::

    geoedge_certificate_expiry_timestamp_seconds{role, name, source}

the ``notAfter`` as a Unix time (days left = ``(value - time()) / 86400``,
which the alert rules in deploy/monitoring/alerts.yml compute), where

- ``role`` is ``served`` (a certificate users see, ``[[tls.certificates]]``),
  ``tunnel`` (this daemon's own tunnel certificate) or ``tunnel_ca`` (each CA
  certificate it trusts for the tunnel: during a CA rotation the file holds
  both, and both are listed);
- ``name`` is the certificate's geoedge identity (``edge/tokyo-1``), else
  its first DNS name, else its common name;
- ``source`` is where it came from: the file's path, or ``acme:<id>`` for
  a certificate the origin's ACME client issued (the edge's store,
  :mod:`edge.acme_status`, given as ``extra``), so one alert covers them all.

Files are read when scraped, and parsed again only when their size or
modification time changed: a renewed certificate shows at the next scrape,
before any reload. A file that cannot be read is left out and logged once
per change (the daemon itself refuses to start without it).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from geoedge.status_page import Cell, Row, Table
from tunnel.peer_name import parse_peer_name

__all__ = [
    "METRIC",
    "CertificateExpiry",
    "CertificateWatch",
    "WatchedFile",
    "certificates_table",
    "expiry_cells",
    "tunnel_files",
    "utc",
]

log = logging.getLogger("geoedge.certificates")

METRIC = "geoedge_certificate_expiry_timestamp_seconds"
#: Days left below which the status page shows a certificate as a warning, and as bad
#: (ACME renews at 30 days left of 90: below 21, renewal has been failing for 9 days).
WARN_DAYS = 21.0
BAD_DAYS = 7.0


@dataclass(frozen=True, slots=True)
class WatchedFile:
    role: str
    """``served``, ``tunnel`` or ``tunnel_ca``."""
    path: Path
    every: bool = False
    """Every certificate in the file (a CA bundle), not only the first (a chain's leaf)."""


@dataclass(frozen=True, slots=True)
class CertificateExpiry:
    role: str
    name: str
    source: str
    not_after: float
    """Unix time."""

    def days_left(self, now: float | None = None) -> float:
        return (self.not_after - (time.time() if now is None else now)) / 86400


class CertificateWatch(Collector):
    """The certificates of ``files``, as the metric and for the status page."""

    def __init__(
        self,
        files: Iterable[WatchedFile],
        extra: Callable[[], Iterable[CertificateExpiry]] | None = None,
    ) -> None:
        """``extra``: certificates that are not files the config names (ACME's)."""
        self.files = tuple(dict.fromkeys(files))  # in order, each once
        self._extra = extra
        self._cache: dict[WatchedFile, tuple[tuple[int, int], list[CertificateExpiry]]] = {}
        self._failed: dict[Path, str] = {}

    def certificates(self) -> list[CertificateExpiry]:
        found: list[CertificateExpiry] = []
        for watched in self.files:
            found += self._read(watched)
        if self._extra is not None:
            found += self._extra()
        return found

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            METRIC,
            "When each certificate this daemon serves or trusts expires (notAfter, Unix time)",
            labels=["role", "name", "source"],
        )
        for cert in self.certificates():
            family.add_metric([cert.role, cert.name, cert.source], cert.not_after)
        yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(METRIC, "", labels=["role", "name", "source"])

    def _read(self, watched: WatchedFile) -> list[CertificateExpiry]:
        path = watched.path
        try:
            stat = path.stat()
            key = (stat.st_mtime_ns, stat.st_size)
            cached = self._cache.get(watched)
            if cached is not None and cached[0] == key:
                return cached[1]
            certificates = x509.load_pem_x509_certificates(path.read_bytes())
        except (OSError, ValueError) as exc:
            reason = str(exc)
            if self._failed.get(path) != reason:
                self._failed[path] = reason
                log.warning("cannot read certificate %s for its expiry: %s", path, reason)
            return []
        self._failed.pop(path, None)
        chosen = certificates if watched.every else certificates[:1]
        found = [
            CertificateExpiry(
                watched.role,
                certificate_name(cert),
                os.fspath(path),
                cert.not_valid_after_utc.timestamp(),
            )
            for cert in chosen
        ]
        self._cache[watched] = (key, found)
        return found


def certificate_name(cert: x509.Certificate) -> str:
    """The geoedge identity (``role/id``), else the first DNS name, else the common name."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = san.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    peer = parse_peer_name(cert)
    if peer is not None and peer.role:
        return f"{peer.role}/{peer.identity}"
    if dns:
        return dns[0]
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(common[0].value) if common else cert.subject.rfc4514_string()


def tunnel_files(cert: Path | None, ca: Path | None) -> Sequence[WatchedFile]:
    """A daemon's tunnel certificate and the CA bundle it trusts (mutual TLS only)."""
    files = []
    if cert is not None:
        files.append(WatchedFile("tunnel", cert))
    if ca is not None:
        files.append(WatchedFile("tunnel_ca", ca, every=True))
    return files


def certificates_table(watch: CertificateWatch, now: float | None = None) -> Table:
    """The status page's "Certificates" table: soonest expiry first."""
    now = time.time() if now is None else now
    rows = []
    for cert in sorted(watch.certificates(), key=lambda c: c.not_after):
        expires, left = expiry_cells(cert.not_after, now)
        rows.append(Row([Cell(cert.role), Cell(cert.name), Cell(cert.source), expires, left]))
    return Table(
        "Certificates",
        ["role", "name", "source", "expires", "left"],
        rows,
        note=f"Warning below {WARN_DAYS:.0f} days, bad below {BAD_DAYS:.0f}; the alert"
        " GeoedgeCertificateExpiresSoon fires below 14 (deploy/monitoring/alerts.yml).",
    )


def expiry_cells(not_after: float, now: float) -> tuple[Cell, Cell]:
    """A certificate's end (UTC) and the time it has left, toned by how little."""
    days = (not_after - now) / 86400
    left = "expired" if days < 0 else f"{days:.0f} days" if days >= 2 else f"{days:.1f} days"
    tone = "bad" if days < BAD_DAYS else "warn" if days < WARN_DAYS else "ok"
    return Cell(utc(not_after)), Cell(left, tone)


def utc(timestamp: float) -> str:
    """A Unix time as the status pages show it."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))
