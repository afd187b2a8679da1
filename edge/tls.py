"""TLS termination at the edge: contexts, SNI selection, certificate reload,
the key-exchange groups and OCSP stapling.

- One ``SSLContext`` per configured certificate; the listener's context picks
  among them in its SNI callback (exact name, then ``*.parent`` wildcard, else
  the first certificate). Certificates issued by the origin's ACME client
  (``[acme]``, :mod:`edge.tls_acme`) come after the files at each step, and
  the TLS-ALPN-01 challenge certificate goes to clients offering ``acme-tls/1``.
- Contexts are built in the supervisor *before* the workers fork, so every
  worker shares the same session-ticket keys and a ticket issued by one worker
  resumes on any other (Python's ``ssl`` has no API to set ticket keys;
  DESIGN.md). The session-ID cache of TLS 1.2 stays per worker: OpenSSL keeps
  it in process memory and Python cannot plug in a shared one.
- :meth:`CertificateStore.reload` reloads certificates (and their OCSP
  responses) *into the same context objects* (``load_cert_chain`` replaces
  the chain of that key type), so ticket keys survive a reload, and
  connections already established are not touched. A file that fails to load
  leaves everything as it was. (A worker does this on a SIGHUP of its own; the
  daemon's reload, :mod:`geoedge.reload`, builds new contexts in a fresh
  supervisor instead, whose workers share new ticket keys.)
- ECDSA and RSA: certificates for the same names share one context, and
  OpenSSL serves the one the client's signature algorithms allow.
- Key-exchange groups: Mozilla "intermediate" (X25519, P-256, P-384) by
  default; OpenSSL's own list adds X448 and P-521. Python offers only
  ``set_ecdh_curve`` (a single curve, and never X25519), so the list is set
  with ``SSL_CTX_set1_groups_list`` through ctypes (:mod:`edge.openssl`, which
  says why that and how it is made safe). That it took effect is checked once
  per context: a TLS 1.3 client offering only a curve outside the list must
  fail to shake hands with it, in memory, before the edge serves anyone.
- A client that closes without close_notify (most browsers, ``curl``) ends
  the connection like one that sends it (``OP_IGNORE_UNEXPECTED_EOF``):
  OpenSSL 3 otherwise makes that a fatal error and evicts the session from
  the cache, and TLS 1.2 clients could never resume (0 of 10). Truncation
  cannot hide behind it: every request the edge reads is framed by
  Content-Length or chunked encoding, and a short one is an error of the
  HTTP reader.
- OCSP stapling from response files (:mod:`edge.ocsp`), through the status
  callback of :class:`edge.openssl.StatusCallback`, installed only when some
  certificate names a response.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from edge import openssl
from edge.acme_store import AcmeStore, StoreError
from edge.config import CertificateConfig, TlsConfig
from edge.ocsp import OcspError, OcspStaple, StapleTable, leaf_der, load_staple
from edge.tls_acme import AcmeCertificates

log = logging.getLogger("geoedge.edge.tls")

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
#: ssl.OP_IGNORE_UNEXPECTED_EOF (Python 3.10+ built against OpenSSL 3), by value otherwise.
_OP_IGNORE_UNEXPECTED_EOF = getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0x80)
#: Curves a probe client can offer alone (``set_ecdh_curve``), by group name.
_PROBE_CURVES = {"P-256": "prime256v1", "P-384": "secp384r1", "P-521": "secp521r1"}
_GROUP_ALIASES = {"prime256v1": "P-256", "secp256r1": "P-256", "secp384r1": "P-384"}
_GROUP_ALIASES["secp521r1"] = "P-521"


class TlsConfigError(Exception):
    """A certificate, key, OCSP response or TLS setting could not be used; the
    message names the file or the setting."""


def certificate_names(path: Path) -> list[str]:
    """The DNS and IP SANs of a certificate (its CN when it has none)."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TlsConfigError(f"{path}: not a readable PEM certificate ({reason})") from exc
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [n.lower() for n in san.get_values_for_type(x509.DNSName)]
        names += [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        names = []
    if not names:
        names = [
            str(a.value) for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        ]
    return [str(n) for n in names]


@dataclass
class _Entry:
    configs: list[CertificateConfig]
    context: ssl.SSLContext
    names: tuple[str, ...]


class _Variant:
    """The contexts of one ALPN list: one per set of names, and the SNI choice
    between them (OpenSSL picks the ALPN protocol with the context the SNI
    callback chose, so each ALPN list needs its own contexts). ``context`` is
    the one handshakes start on: the first file certificate's, or, with none
    configured, one without a certificate until ACME brings one."""

    def __init__(
        self,
        entries: list[_Entry],
        alpn: tuple[str, ...],
        context: ssl.SSLContext,
        acme: AcmeCertificates | None,
    ) -> None:
        self.entries = entries
        self.alpn = alpn
        self.acme = acme
        self._exact: dict[str, ssl.SSLContext] = {}
        self._wildcard: dict[str, ssl.SSLContext] = {}
        self.index()
        self.context = context
        self.context.sni_callback = self._select

    def index(self) -> None:
        self._exact.clear()
        self._wildcard.clear()
        for entry in self.entries:
            for name in entry.names:
                if name.startswith("*."):
                    self._wildcard.setdefault(name[2:], entry.context)
                else:
                    self._exact.setdefault(name, entry.context)

    def context_for(self, server_name: str | None) -> ssl.SSLContext:
        """Files before ACME at each step: exact name, then wildcard (edge.tls_acme)."""
        acme = self.acme
        if server_name:
            name = server_name.lower().rstrip(".")
            context = self._exact.get(name) or (acme and acme.exact(name, self.alpn))
            if context:
                return context
            _, _, parent = name.partition(".")
            context = self._wildcard.get(parent) or (acme and acme.wildcard(parent, self.alpn))
            if context:
                return context
        if self.entries:
            return self.entries[0].context
        return (acme and acme.default(self.alpn)) or self.context

    def _select(self, ssl_object: ssl.SSLObject, server_name: str | None, _: object) -> None:
        # Python exposes the client's SNI to servers only here: keep it for metadata.
        ssl_object.geoedge_server_name = server_name  # type: ignore[attr-defined]
        acme = self.acme
        if acme is not None and server_name:
            challenge = acme.challenge(ssl_object, server_name.lower().rstrip("."))
            if challenge is not None:  # TLS-ALPN-01: this client offered acme-tls/1
                ssl_object.context = challenge
                return
        context = self.context_for(server_name)
        if context is not self.context:
            ssl_object.context = context


class CertificateStore:
    """The edge's server contexts and the SNI choice between them, for each ALPN
    list a listener offers (``alpn_lists``; the first is :attr:`context`'s)."""

    def __init__(
        self,
        config: TlsConfig,
        alpn_lists: tuple[tuple[str, ...], ...] = (("h2", "http/1.1"),),
        acme_store: AcmeStore | None = None,
    ) -> None:
        self._config = config
        self._staples = StapleTable()
        self._status: openssl.StatusCallback | None = None
        if any(cert.ocsp_response for cert in config.certificates):
            try:
                self._status = openssl.StatusCallback(self._staples.lookup)
            except openssl.OpenSslUnavailable as exc:
                raise TlsConfigError(f"[[tls.certificates]] ocsp_response: {exc}") from exc
        alpns = tuple(dict.fromkeys(alpn_lists))
        #: Certificates from the origin's ACME client (None: [acme] is off).
        self.acme = (
            None if acme_store is None else AcmeCertificates(acme_store, alpns, self._new_context)
        )
        self._variants: dict[tuple[str, ...], _Variant] = {}
        for alpn in alpns:
            entries = self._build_all(config.certificates, alpn)
            start = entries[0].context if entries else self._new_context(alpn)
            self._variants[alpn] = _Variant(entries, alpn, start, self.acme)
        self._entries = next(iter(self._variants.values())).entries
        self._staples.replace(self._load_staples())
        self.context = next(iter(self._variants.values())).context
        if self.acme is not None:
            self.acme.attach_listeners(v.context for v in self._variants.values())
            self.load_acme()

    def load_acme(self) -> None:
        """Serve what the ACME store holds (start, reload, a worker's start)."""
        if self.acme is None:
            return
        try:
            self.acme.store.prepare()
        except StoreError as exc:
            raise TlsConfigError(f"[acme] store_dir: {exc}") from exc
        self.acme.load_stored()

    def context_for_alpn(self, alpn: tuple[str, ...]) -> ssl.SSLContext:
        """The default context of listeners that offer ``alpn``."""
        return self._variants[alpn].context

    def _new_context(self, alpn: tuple[str, ...]) -> ssl.SSLContext:
        config = self._config
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = _VERSIONS[config.min_version]
        context.maximum_version = _VERSIONS[config.max_version]
        context.set_ciphers(config.ciphers)
        context.set_alpn_protocols(list(alpn))
        # No client-initiated renegotiation (TLS 1.2): a CPU sink for the peer,
        # and HAProxy and nginx refuse it too. A missing close_notify is an
        # ordinary end (module docstring).
        context.options |= (
            ssl.OP_NO_COMPRESSION
            | ssl.OP_CIPHER_SERVER_PREFERENCE
            | ssl.OP_NO_RENEGOTIATION
            | _OP_IGNORE_UNEXPECTED_EOF
        )
        if not config.session_tickets:
            context.options |= ssl.OP_NO_TICKET
        context.num_tickets = config.tickets_per_handshake
        if config.groups:
            try:
                openssl.set_groups(context, config.groups)
            except openssl.OpenSslUnavailable as exc:
                raise TlsConfigError(
                    f"[tls] groups: cannot be set here ({exc}); "
                    "groups = [] keeps OpenSSL's defaults"
                ) from exc
            except ValueError as exc:
                raise TlsConfigError(f"[tls] groups: {exc}") from exc
        if self._status is not None:
            self._status.install(context)
        return context

    def _build_all(
        self, certificates: tuple[CertificateConfig, ...], alpn: tuple[str, ...]
    ) -> list[_Entry]:
        """One context per set of names: certificates for the same names (an
        ECDSA and an RSA one) share a context, and OpenSSL serves whichever the
        client's signature algorithms allow."""
        entries: dict[tuple[str, ...], _Entry] = {}
        for cert in certificates:
            names = tuple(sorted(n.lower() for n in (cert.names or certificate_names(cert.cert))))
            entry = entries.get(names)
            if entry is None:
                entry = entries[names] = _Entry([], self._new_context(alpn), names)
            self._load(entry.context, cert)
            entry.configs.append(cert)
        if self._config.groups:
            for entry in entries.values():
                _verify_groups(entry.context, self._config.groups)
        return list(entries.values())

    @staticmethod
    def _load(context: ssl.SSLContext, cert: CertificateConfig) -> None:
        try:
            context.load_cert_chain(cert.cert, cert.key)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise TlsConfigError(f"{cert.cert} / {cert.key}: {exc}") from exc

    def _load_staples(self) -> dict[bytes, OcspStaple]:
        """Every configured OCSP response, checked against its certificate."""
        staples: dict[bytes, OcspStaple] = {}
        for entry in self._entries:
            for cert in entry.configs:
                if cert.ocsp_response is None:
                    continue
                try:
                    staples[leaf_der(cert.cert)] = load_staple(cert.ocsp_response, cert.cert)
                except OcspError as exc:
                    raise TlsConfigError(str(exc)) from exc
        return staples

    def context_for(self, server_name: str | None) -> ssl.SSLContext:
        """The context serving ``server_name`` for the first ALPN list (pure lookup)."""
        return next(iter(self._variants.values())).context_for(server_name)

    @property
    def staples(self) -> int:
        """How many certificates have an OCSP response loaded."""
        return len(self._staples)

    def reload(self) -> None:
        """Reload every certificate and OCSP response from disk into the
        existing contexts. Every file is checked first (certificates in a
        scratch context), so a bad file raises :class:`TlsConfigError` and
        changes nothing. Names are fixed at start (a certificate whose SANs
        change needs a restart to be indexed anew)."""
        for entry in self._entries:
            probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            for cert in entry.configs:
                self._load(probe, cert)  # validate before touching the live context
        staples = self._load_staples()
        for variant in self._variants.values():
            for entry in variant.entries:
                for cert in entry.configs:
                    self._load(entry.context, cert)
        if self._status is not None:
            self._status.forget_certificates()  # before the new X509s serve anyone
        self._staples.replace(staples)
        for variant in self._variants.values():
            variant.index()
        self.load_acme()
        log.info(
            "reloaded %d certificate(s), %d OCSP response(s), %d ACME certificate(s)",
            sum(len(e.configs) for e in self._entries),
            len(staples),
            0 if self.acme is None else len(self.acme),
        )


def _verify_groups(context: ssl.SSLContext, groups: tuple[str, ...]) -> None:
    """Prove the groups list took effect on ``context``: a TLS 1.3 client that
    offers only a curve outside it must not complete a handshake (in memory)."""
    if context.maximum_version != ssl.TLSVersion.TLSv1_3:
        return  # TLS 1.2 ties the client's curves to the certificate's: no clean probe
    configured = {_GROUP_ALIASES.get(g, g) for g in groups}
    outside = next((c for g, c in _PROBE_CURVES.items() if g not in configured), None)
    if outside is None:
        return
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    client.minimum_version = ssl.TLSVersion.TLSv1_3
    client.set_ecdh_curve(outside)
    if _handshake_in_memory(client, context):
        raise TlsConfigError(
            f"[tls] groups: set to {':'.join(groups)}, yet a client offering only "
            f"{outside} completed a handshake; this OpenSSL ignored the list"
        )


def _handshake_in_memory(client: ssl.SSLContext, server: ssl.SSLContext) -> bool:
    """True when ``client`` and ``server`` complete a handshake over memory BIOs."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    sides = (
        (client.wrap_bio(c_in, c_out, server_hostname="probe.invalid"), c_out, s_in),
        (server.wrap_bio(s_in, s_out, server_side=True), s_out, c_in),
    )
    for _ in range(8):
        done = 0
        for tls, outgoing, peer_incoming in sides:
            try:
                tls.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                return False
            peer_incoming.write(outgoing.read())
        if done == 2:
            return True
    return False
