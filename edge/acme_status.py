"""What an edge shows of the ACME certificates it holds (its store,
:mod:`edge.acme_store`), read by the parent process when asked:

- their expiry for :class:`geoedge.cert_expiry.CertificateWatch` (``extra``),
  so they join the fleet-wide metric, one series per certificate::

      geoedge_certificate_expiry_timestamp_seconds{role="served", name, source}

  with ``name`` its first DNS name and ``source`` ``acme:<id>``: one alert
  rule (``GeoedgeCertificateExpiresSoon``, deploy/monitoring/alerts.yml)
  covers certificates from files and from ACME, per edge (``instance``) and
  per name, and the status page's "Certificates" table lists them too;
- the status page's "ACME certificates" table (serial, OCSP staple).

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
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from geoedge.cert_expiry import BAD_DAYS, WARN_DAYS, CertificateExpiry, expiry_cells
from geoedge.status_page import Cell, Row, Table

__all__ = ["HeldCertificate", "HeldCertificates"]

log = logging.getLogger("geoedge.edge.acme")


@dataclass(frozen=True, slots=True)
class HeldCertificate:
    id: str
    names: tuple[str, ...]
    not_after: float
    serial: int
    stapled: bool
    """An OCSP response is stored beside it (``<id>.ocsp``)."""


class HeldCertificates:
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

    def expiries(self) -> list[CertificateExpiry]:
        """For :class:`geoedge.cert_expiry.CertificateWatch`: one per certificate."""
        return [
            CertificateExpiry(
                "served",
                held.names[0] if held.names else held.id,
                f"acme:{held.id}",
                held.not_after,
            )
            for held in self.certificates()
        ]

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
            f" Warning below {WARN_DAYS:.0f} days left, bad below"
            f" {BAD_DAYS:.0f}.",
            empty="none received from the origin yet",
        )
