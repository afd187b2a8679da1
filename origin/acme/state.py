"""What the origin's ACME manager knows of one configured certificate: what
is held, when it is due, how its attempts went, what the edges said, its
OCSP staple; and how that is shown (``GET /acme``, ``geoedge acme status``)
and sent (the edges' CONTROL message)."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from typing import Any

from geoedge.acme_wire import CertificateSet
from origin.acme.config import AcmeCertificateConfig
from origin.acme.files import IssuedCertificate
from origin.acme.ocsp import OcspAnswer

__all__ = ["CertificateState", "iso"]


@dataclass(slots=True)
class CertificateState:
    """What the manager knows of one configured certificate."""

    spec: AcmeCertificateConfig
    issued: IssuedCertificate | None = None
    renew_at: float | None = None
    """When it is due (ARI's time, or the lifetime fraction); None: now."""
    ari_recheck_at: float = 0.0
    next_try: float = 0.0
    """Not before this (backoff after a failure)."""
    failures: int = 0
    last_error: str = ""
    last_success: float | None = None
    edges: dict[str, str] = field(default_factory=dict)
    """Each edge's answer to the current certificate (``applied``, ...)."""
    forced: bool = False
    """A renewal was asked for (``renew --force``), or the stored certificate
    came from another CA (staging, before production): due until one succeeds."""
    ocsp: OcspAnswer | None = None
    """The OCSP response stapled with it (:mod:`origin.acme.stapling`)."""
    ocsp_at: float = math.inf
    """When to fetch the next OCSP response (``inf``: never)."""
    ocsp_failures: int = 0
    ocsp_note: str = ""

    def due(self, now: float) -> bool:
        if now < self.next_try:
            return False
        if self.forced or self.issued is None:
            return True
        if set(self.issued.names) != set(self.spec.domains):
            return True
        return self.renew_at is None or now >= self.renew_at

    def wakes_at(self) -> float:
        if self.forced or self.issued is None or self.renew_at is None:
            return self.next_try
        renewal = max(self.next_try, min(self.renew_at, self.ari_recheck_at or self.renew_at))
        return min(renewal, self.ocsp_at)

    def message(self) -> CertificateSet | None:
        """What the edges are sent of it: the certificate, its key, its staple."""
        if self.issued is None:
            return None
        ocsp = None if self.ocsp is None else self.ocsp.der
        return CertificateSet(self.spec.id, self.issued.chain, self.issued.key, ocsp)

    def as_json(self) -> dict[str, Any]:
        """For ``geoedge acme status``, ``GET /acme`` and ``renew``'s answer."""
        issued = self.issued
        return {
            "id": self.spec.id,
            "domains": list(self.spec.domains),
            "not_after": None if issued is None else iso(issued.not_after),
            "not_after_ts": None if issued is None else issued.not_after,
            "serial": None if issued is None else f"{issued.leaf.serial_number:x}",
            "renew_at": None if self.renew_at is None else iso(self.renew_at),
            "failures": self.failures,
            "last_error": self.last_error,
            "next_try": None if not self.next_try else iso(self.next_try),
            "last_success": None if self.last_success is None else iso(self.last_success),
            "edges": dict(self.edges),
            "ocsp": self.ocsp_note or None,
            "ocsp_next_update": None
            if self.ocsp is None or self.ocsp.next_update is None
            else iso(self.ocsp.next_update),
        }


def iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="seconds")
