"""TLS termination at the edge: contexts, SNI selection and certificate reload.

- One ``SSLContext`` per configured certificate; the listener's context picks
  among them in its SNI callback (exact name, then ``*.parent`` wildcard, else
  the first certificate).
- Contexts are built in the supervisor *before* the workers fork, so every
  worker shares the same session-ticket keys and a ticket issued by one worker
  resumes on any other (Python's ``ssl`` has no API to set ticket keys;
  DESIGN.md). The session-ID cache of TLS 1.2 stays per worker: OpenSSL keeps
  it in process memory and Python cannot plug in a shared one.
- :meth:`CertificateStore.reload` reloads certificates *into the same context
  objects* (``load_cert_chain`` replaces the chain of that key type), so
  ticket keys survive a reload, and connections already established are not
  touched. A certificate that fails to load leaves the old one in place.
- ECDSA and RSA: certificates for the same names share one context, and
  OpenSSL serves the one the client's signature algorithms allow. X25519 is
  OpenSSL's first key-exchange group already; Python offers no call to
  reorder groups.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass

from cryptography import x509

from edge.config import CertificateConfig, TlsConfig

log = logging.getLogger("geoedge.edge.tls")

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class TlsConfigError(Exception):
    """A certificate or key could not be loaded; the message names the file."""


def certificate_names(path: object) -> list[str]:
    """The DNS SANs of a certificate (its CN when it has none)."""
    with open(path, "rb") as f:  # type: ignore[call-overload]
        cert = x509.load_pem_x509_certificate(f.read())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [n.lower() for n in san.get_values_for_type(x509.DNSName)]
        names += [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        names = []
    if not names:
        names = [a.value for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
    return [str(n) for n in names]


@dataclass
class _Entry:
    configs: list[CertificateConfig]
    context: ssl.SSLContext
    names: tuple[str, ...]


class CertificateStore:
    """The edge's server contexts and the SNI choice between them."""

    def __init__(self, config: TlsConfig) -> None:
        self._config = config
        self._entries = self._build_all(config.certificates)
        self._exact: dict[str, ssl.SSLContext] = {}
        self._wildcard: dict[str, ssl.SSLContext] = {}
        self._index()
        self.context = self._entries[0].context
        self.context.sni_callback = self._select

    def _new_context(self) -> ssl.SSLContext:
        config = self._config
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = _VERSIONS[config.min_version]
        context.maximum_version = _VERSIONS[config.max_version]
        context.set_ciphers(config.ciphers)
        context.set_alpn_protocols(["http/1.1"])
        # No client-initiated renegotiation (TLS 1.2): a CPU sink for the peer,
        # and HAProxy and nginx refuse it too.
        context.options |= (
            ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
        )
        if not config.session_tickets:
            context.options |= ssl.OP_NO_TICKET
        return context

    def _build_all(self, certificates: tuple[CertificateConfig, ...]) -> list[_Entry]:
        """One context per set of names: certificates for the same names (an
        ECDSA and an RSA one) share a context, and OpenSSL serves whichever the
        client's signature algorithms allow."""
        entries: dict[tuple[str, ...], _Entry] = {}
        for cert in certificates:
            names = tuple(sorted(n.lower() for n in (cert.names or certificate_names(cert.cert))))
            entry = entries.get(names)
            if entry is None:
                entry = entries[names] = _Entry([], self._new_context(), names)
            self._load(entry.context, cert)
            entry.configs.append(cert)
        return list(entries.values())

    @staticmethod
    def _load(context: ssl.SSLContext, cert: CertificateConfig) -> None:
        try:
            context.load_cert_chain(cert.cert, cert.key)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise TlsConfigError(f"{cert.cert} / {cert.key}: {exc}") from exc

    def _index(self) -> None:
        self._exact.clear()
        self._wildcard.clear()
        for entry in self._entries:
            for name in entry.names:
                if name.startswith("*."):
                    self._wildcard.setdefault(name[2:], entry.context)
                else:
                    self._exact.setdefault(name, entry.context)

    def context_for(self, server_name: str | None) -> ssl.SSLContext:
        """The context serving ``server_name`` (pure lookup, used by the callback)."""
        if server_name:
            name = server_name.lower().rstrip(".")
            context = self._exact.get(name)
            if context is not None:
                return context
            _, _, parent = name.partition(".")
            context = self._wildcard.get(parent)
            if context is not None:
                return context
        return self._entries[0].context

    def _select(self, ssl_object: ssl.SSLObject, server_name: str | None, _: object) -> None:
        # Python exposes the client's SNI to servers only here: keep it for metadata.
        ssl_object.geoedge_server_name = server_name  # type: ignore[attr-defined]
        context = self.context_for(server_name)
        if context is not self.context:
            ssl_object.context = context

    def reload(self) -> None:
        """Reload every certificate from disk into its existing context. Every
        file is checked first in a scratch context, so a bad file raises
        :class:`TlsConfigError` and changes nothing. Names are fixed at start
        (a certificate whose SANs change needs a restart to be indexed anew)."""
        for entry in self._entries:
            probe = self._new_context()
            for cert in entry.configs:
                self._load(probe, cert)  # validate before touching the live context
        for entry in self._entries:
            for cert in entry.configs:
                self._load(entry.context, cert)
        self._index()
        log.info("reloaded %d certificate(s)", len(self._entries))
