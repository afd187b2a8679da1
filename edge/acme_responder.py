"""An edge worker's part in ACME: it applies the origin's ACME messages
(:mod:`geoedge.acme_wire`, tunnel CONTROL kinds 0x0100-0x0102) and answers
HTTP-01 challenges on the plain-HTTP listener.

- HTTP-01 (RFC 8555 §8.3): ``GET /.well-known/acme-challenge/<token>`` on a
  plain-HTTP listener (``[redirect]``) for the challenge's domain is
  answered by the edge itself with the key authorization. Any other token
  or name goes on as before (passed through to the origin: a backend may
  run its own ACME client). An edge without a plain-HTTP listener refuses
  HTTP-01 challenges, so the origin knows that validation cannot land here.
- TLS-ALPN-01 challenges and issued certificates go to the worker's
  :class:`edge.tls_acme.AcmeCertificates`; a certificate is stored
  (:class:`edge.acme_store.AcmeStore`) before it is reported applied, so an
  edge that restarts serves it without its origin.

Every worker of an edge receives every message on its own tunnel
connections (the origin sends on all of them), so each worker applies it to
its own tables; the store's lock makes their saves of one certificate safe.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from edge.acme_store import StoreError
from edge.tls_acme import AcmeCertificates
from geoedge.acme_wire import (
    CertificateSet,
    ChallengeClear,
    Http01Challenge,
    MessageError,
    TlsAlpn01Challenge,
    decode,
)

__all__ = ["ACME_CHALLENGE_PREFIX", "AcmeResponder", "Applied"]

log = logging.getLogger("geoedge.edge.acme")

ACME_CHALLENGE_PREFIX = "/.well-known/acme-challenge/"


@dataclass(frozen=True, slots=True)
class Applied:
    """What became of one message: the CONTROL ACK's status and reason."""

    applied: bool
    reason: str = ""


class AcmeResponder:
    """One worker's ACME tables; see the module docstring. ``on_event(name)``
    counts what happened (``challenge_set``, ``certificate_set``,
    ``http01_answered``, ``refused``...)."""

    def __init__(
        self,
        certificates: AcmeCertificates,
        *,
        plain_http: bool,
        on_event: Callable[[str], None] = lambda _: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.certificates = certificates
        self._plain_http = plain_http
        self._on_event = on_event
        self._clock = clock
        self._http01: dict[str, Http01Challenge] = {}

    def apply(self, kind: int, body: bytes) -> Applied:
        """Apply one CONTROL message of an ACME kind."""
        try:
            message = decode(kind, body)
        except MessageError as exc:
            return self._refuse(f"malformed: {exc}")
        if isinstance(message, Http01Challenge):
            if not self._plain_http:
                return self._refuse("no plain-HTTP listener ([redirect]) for HTTP-01")
            self._http01[message.token] = message
            self._on_event("challenge_set")
            log.info("answering HTTP-01 for %s", message.domain)
            return Applied(True)
        if isinstance(message, TlsAlpn01Challenge):
            try:
                self.certificates.set_challenge(message.domain, message.certificate, message.key)
            except (ssl.SSLError, OSError, ValueError) as exc:
                return self._refuse(f"TLS-ALPN-01 certificate not usable: {exc}")
            self._on_event("challenge_set")
            log.info("answering TLS-ALPN-01 for %s", message.domain)
            return Applied(True)
        if isinstance(message, ChallengeClear):
            if message.type == "http-01":
                self._http01.pop(message.token, None)
            else:
                self.certificates.clear_challenge(message.domain)
            self._on_event("challenge_cleared")
            return Applied(True)
        return self._install(message)

    def _install(self, message: CertificateSet) -> Applied:
        store = self.certificates.store
        try:
            stored = store.save(message.id, message.chain, message.key, message.ocsp, self._clock())
            self.certificates.install(stored)
        except StoreError as exc:
            return self._refuse(str(exc))
        except (ssl.SSLError, OSError) as exc:
            return self._refuse(f"{message.id}: OpenSSL refused the certificate ({exc})")
        self._on_event("certificate_set")
        return Applied(True)

    def _refuse(self, reason: str) -> Applied:
        log.warning("ACME message refused: %s", reason)
        self._on_event("refused")
        return Applied(False, reason)

    def http01_answer(self, host: str | None, path: str) -> str | None:
        """The key authorization for a plain-HTTP request of ``path`` on
        ``host`` (its Host field), or None when it is no challenge of ours."""
        if not self._http01 or not path.startswith(ACME_CHALLENGE_PREFIX):
            return None
        challenge = self._http01.get(path[len(ACME_CHALLENGE_PREFIX) :])
        if challenge is None or host is None:
            return None
        name = host.lower()
        if not name.startswith("["):
            name = name.partition(":")[0]
        if name.rstrip(".") != challenge.domain:
            return None
        self._on_event("http01_answered")
        return challenge.key_authorization

    @property
    def pending(self) -> int:
        """Challenges this worker answers now (both types)."""
        return len(self._http01) + len(self.certificates.challenges)
