"""Certificates the origin's ACME client issued, served beside the files of
``[[tls.certificates]]``, and the TLS-ALPN-01 challenges it asks the edge
to answer.

- Each issued certificate gets one context per ALPN list the listeners offer,
  made when it first arrives. A renewal loads into the same contexts
  (``load_cert_chain`` replaces the chain of that key type): connections
  already established keep theirs, the next handshake gets the new one, no
  listener stops. Contexts made after the workers forked do not break
  session resumption: OpenSSL encrypts tickets and caches sessions with the
  context a connection *started* on (the listener's, made before the fork),
  not with the one the SNI callback switched to.
- Precedence (:meth:`AcmeCertificates.exact`, ``wildcard``): the SNI callback
  of :mod:`edge.tls` asks the files first, then these, for an exact name,
  then the files, then these, for a wildcard. A name a file serves is
  never taken over by ACME; an exact ACME name beats a file's wildcard, as
  an exact name beats a wildcard anywhere.
- TLS-ALPN-01 (RFC 8737): while a challenge is pending, a client-hello
  callback (:class:`edge.openssl.ClientHelloAlpn`) on the listeners'
  contexts marks connections that offer ``acme-tls/1``; for those, and only
  those, the SNI callback switches to the challenge's context (its
  certificate, ALPN ``acme-tls/1`` only). Users of the same name meanwhile
  get the real certificate. With no challenge pending the callback is
  removed: ordinary handshakes pay nothing for it.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from edge import openssl
from edge.acme_store import AcmeStore, StoredCertificate
from edge.ocsp import OcspError, StapleTable, leaf_der, load_staple

__all__ = ["ACME_TLS_ALPN", "AcmeCertificates"]

log = logging.getLogger("geoedge.edge.acme")

#: RFC 8737 §6.2: the ALPN protocol of TLS-ALPN-01 validation.
ACME_TLS_ALPN = "acme-tls/1"

NewContext = Callable[[tuple[str, ...]], ssl.SSLContext]


@dataclass(slots=True)
class _Issued:
    stored: StoredCertificate
    contexts: dict[tuple[str, ...], ssl.SSLContext] = field(default_factory=dict)


class AcmeCertificates:
    """The issued certificates and pending TLS-ALPN-01 challenges of one
    process; see the module docstring. ``new_context(alpn)`` makes a server
    context configured as the file certificates' are."""

    def __init__(
        self, store: AcmeStore, alpn_lists: Iterable[tuple[str, ...]], new_context: NewContext
    ) -> None:
        self.store = store
        self._alpn_lists = tuple(dict.fromkeys(alpn_lists))
        self._new_context = new_context
        self._issued: dict[str, _Issued] = {}
        self._exact: dict[str, _Issued] = {}
        self._wildcard: dict[str, _Issued] = {}
        self._challenges: dict[str, ssl.SSLContext] = {}
        self._listener_contexts: list[ssl.SSLContext] = []
        self._hello: openssl.ClientHelloAlpn | None = None
        self._staples = StapleTable()
        self._status: openssl.StatusCallback | None = None

    def __len__(self) -> int:
        return len(self._issued)

    def certificates(self) -> list[StoredCertificate]:
        return [issued.stored for issued in self._issued.values()]

    def attach_listeners(self, contexts: Iterable[ssl.SSLContext]) -> None:
        """The contexts handshakes start on (the SNI callbacks' own), where the
        TLS-ALPN-01 client-hello callback goes while a challenge is pending."""
        self._listener_contexts = list(contexts)

    # -- issued certificates ----------------------------------------------------------

    def load_stored(self, now: float | None = None) -> int:
        """Serve every certificate in the store (start, SIGHUP, a worker's start);
        how many are served."""
        for stored in self.store.load_all(time.time() if now is None else now):
            try:
                self.install(stored)
            except (ssl.SSLError, OSError) as exc:
                log.warning("stored certificate %s not served: %s", stored.path, exc)
        return len(self._issued)

    def install(self, stored: StoredCertificate) -> None:
        """Serve ``stored`` from now on (a new certificate, or a renewal into the
        contexts already serving its id). Raises ``ssl.SSLError`` / ``OSError``
        when OpenSSL refuses the file: nothing changes then."""
        issued = self._issued.get(stored.id)
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        probe.load_cert_chain(stored.path)  # a bad file fails here, before any live context
        staple = None
        if stored.ocsp_path is not None:
            try:
                staple = load_staple(stored.ocsp_path, stored.path)
            except OcspError as exc:
                log.warning("OCSP response not stapled: %s", exc)
        if issued is None:
            issued = _Issued(stored)
            for alpn in self._alpn_lists:
                issued.contexts[alpn] = self._new_context(alpn)
        for context in issued.contexts.values():
            context.load_cert_chain(stored.path)
        issued.stored = stored
        self._issued[stored.id] = issued
        self._index()
        self._set_staple(issued, staple)
        log.info(
            "serving ACME certificate %s for %s (serial %x)",
            stored.id,
            ", ".join(stored.names),
            stored.serial,
        )

    def _set_staple(self, issued: _Issued, staple: object) -> None:
        staples = dict(self._staples.items())
        leaf = leaf_der(issued.stored.path)
        if staple is None:
            staples.pop(leaf, None)
        else:
            if self._status is None:
                try:
                    self._status = openssl.StatusCallback(self._staples.lookup)
                except openssl.OpenSslUnavailable as exc:
                    log.warning("OCSP responses of ACME certificates not stapled: %s", exc)
                    return
            for context in issued.contexts.values():
                self._status.install(context)
            staples[leaf] = staple  # type: ignore[assignment]
        if self._status is not None:
            self._status.forget_certificates()
        self._staples.replace(staples)

    def _index(self) -> None:
        self._exact.clear()
        self._wildcard.clear()
        for certificate_id in sorted(self._issued):
            issued = self._issued[certificate_id]
            for name in issued.stored.names:
                if name.startswith("*."):
                    self._wildcard.setdefault(name[2:], issued)
                else:
                    self._exact.setdefault(name, issued)

    def exact(self, name: str, alpn: tuple[str, ...]) -> ssl.SSLContext | None:
        issued = self._exact.get(name)
        return None if issued is None else issued.contexts.get(alpn)

    def wildcard(self, parent: str, alpn: tuple[str, ...]) -> ssl.SSLContext | None:
        issued = self._wildcard.get(parent)
        return None if issued is None else issued.contexts.get(alpn)

    def default(self, alpn: tuple[str, ...]) -> ssl.SSLContext | None:
        """The context for a client naming nothing we serve, when no file
        certificate is configured: the first issued certificate's (by id)."""
        if not self._issued:
            return None
        return self._issued[min(self._issued)].contexts.get(alpn)

    # -- TLS-ALPN-01 --------------------------------------------------------------------

    def set_challenge(self, domain: str, certificate_pem: str, key_pem: str) -> None:
        """Answer TLS-ALPN-01 for ``domain`` with this certificate until cleared.
        Raises ``ssl.SSLError`` for a certificate OpenSSL refuses, and
        :class:`edge.openssl.OpenSslUnavailable` where the callback cannot be set."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols([ACME_TLS_ALPN])
        with self.store.scratch(certificate_pem + "\n" + key_pem) as path:
            context.load_cert_chain(path)
        if self._hello is None:
            self._hello = openssl.ClientHelloAlpn(ACME_TLS_ALPN)
        if not self._challenges:
            for listener in self._listener_contexts:
                self._hello.install(listener)
        self._challenges[domain] = context

    def clear_challenge(self, domain: str) -> None:
        self._challenges.pop(domain, None)
        if not self._challenges and self._hello is not None:
            for listener in self._listener_contexts:
                self._hello.uninstall(listener)

    def challenge(self, ssl_object: object, server_name: str) -> ssl.SSLContext | None:
        """The challenge context for a handshake that offered ``acme-tls/1`` for
        ``server_name`` (marked by the client-hello callback), else None."""
        if not self._challenges or not getattr(ssl_object, "geoedge_acme_tls", False):
            return None
        return self._challenges.get(server_name)

    @property
    def challenges(self) -> tuple[str, ...]:
        return tuple(self._challenges)

    def stored_path(self, certificate_id: str) -> Path | None:
        issued = self._issued.get(certificate_id)
        return None if issued is None else issued.stored.path
