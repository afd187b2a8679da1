"""What an edge shows of the ACME certificates it holds (its store,
:mod:`edge.acme_store`), read by the parent process when asked:

- the fleet-wide certificate expiry metric, one series per certificate::

      geoedge_certificate_expiry_timestamp_seconds{role="served", name, source}

  with ``name`` its first DNS name and ``source`` ``acme:<id>``: the family
  and labels every certificate a daemon serves or trusts is exported under
  (branch ``fleet``'s :mod:`geoedge.cert_expiry` does the file certificates
  and the tunnel's), so one alert rule (``GeoedgeCertificateExpiresSoon``,
  deploy/monitoring/alerts.yml) covers certificates from files and from ACME,
  per edge (``instance``) and per name;
- the status page's "ACME certificates" table.

The files are read, not the workers' memory: every worker stores a
certificate before it serves it, and the store keeps the newest, so the
files are what the edge serves and what it would serve after a restart.
The workers' own ``geoedge_edge_acme_certificate_expiry_timestamp_seconds``
says what their memory holds (the earliest of the live workers). A file is
parsed again only when its size or modification time changes; a certificate
past its end stays listed (with a negative time left), so its alert does
not resolve by expiring.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from geoedge.status_page import (
    CERTIFICATE_BAD_DAYS,
    CERTIFICATE_WARN_DAYS,
    Cell,
    Row,
    Table,
    expiry_cells,
)

__all__ = ["METRIC", "HeldCertificate", "HeldCertificates"]

log = logging.getLogger("geoedge.edge.acme")

#: The fleet-wide certificate expiry family (see the module docstring).
METRIC = "geoedge_certificate_expiry_timestamp_seconds"
_LABELS = ["role", "name", "source"]


@dataclass(frozen=True, slots=True)
class HeldCertificate:
    id: str
    names: tuple[str, ...]
    not_after: float
    serial: int
    stapled: bool
    """An OCSP response is stored beside it (``<id>.ocsp``)."""


class HeldCertificates(Collector):
    """The certificates in one edge's ACME store; see the module docstring."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache: dict[Path, tuple[tuple[int, int], HeldCertificate]] = {}
        self._failed: dict[Path, str] = {}

    def certificates(self) -> list[HeldCertificate]:
        found = []
        try:
            paths = sorted(self.directory.glob("*.pem"))
        except OSError:
            paths = []
        for path in paths:
            held = self._read(path)
            if held is not None:
                found.append(held)
        self._cache = {p: v for p, v in self._cache.items() if p in paths}
        return found

    def _read(self, path: Path) -> HeldCertificate | None:
        try:
            stat = path.stat()
            key = (stat.st_mtime_ns, stat.st_size)
            cached = self._cache.get(path)
            if cached is not None and cached[0] == key:
                return cached[1]
            leaf = x509.load_pem_x509_certificate(path.read_bytes())  # the first: the leaf
            san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except (OSError, ValueError, x509.ExtensionNotFound) as exc:
            reason = str(exc) or type(exc).__name__
            if self._failed.get(path) != reason:
                self._failed[path] = reason
                log.warning("cannot read ACME certificate %s for its expiry: %s", path, reason)
            return None
        self._failed.pop(path, None)
        held = HeldCertificate(
            path.stem,
            tuple(san.get_values_for_type(x509.DNSName)),
            leaf.not_valid_after_utc.timestamp(),
            leaf.serial_number,
            os.path.exists(path.with_suffix(".ocsp")),
        )
        self._cache[path] = (key, held)
        return held

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            METRIC,
            "When each certificate this daemon serves or trusts expires (notAfter, Unix time)",
            labels=_LABELS,
        )
        for held in self.certificates():
            name = held.names[0] if held.names else held.id
            family.add_metric(["served", name, f"acme:{held.id}"], held.not_after)
        yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(METRIC, "", labels=_LABELS)

    def table(self, now: float | None = None) -> Table:
        """The status page's table: soonest expiry first."""
        now = time.time() if now is None else now
        rows = []
        for held in sorted(self.certificates(), key=lambda c: c.not_after):
            expires, left = expiry_cells(held.not_after, now)
            rows.append(
                Row(
                    [
                        Cell(held.id),
                        Cell(", ".join(held.names)),
                        expires,
                        left,
                        Cell(f"{held.serial:x}"),
                        Cell("yes" if held.stapled else "no"),
                    ]
                )
            )
        return Table(
            "ACME certificates",
            ["id", "names", "expires", "left", "serial", "OCSP stapled"],
            rows,
            note=f"Issued by the origin's ACME client and kept in {self.directory}."
            " The origin renews them (its status page says when, and any error)."
            f" Warning below {CERTIFICATE_WARN_DAYS:.0f} days left, bad below"
            f" {CERTIFICATE_BAD_DAYS:.0f}.",
            empty="none received from the origin yet",
        )
