"""The origin's ACME state on disk (``[acme] state_dir``, mode 0700):

- ``accounts/<host>-<hash>/key.pem``: the account key (ECDSA P-256, 0600),
  one per ACME directory, so staging and production never share one; made
  once, kept across restarts (the key *is* the account); ``account.json``
  beside it holds the account's URL.
- ``certificates/<id>.pem``: each issued certificate, chain then key, 0600
  (the format the edges store too), so a restarted origin sends the edges
  what it has instead of issuing again; ``certificates/<id>.json`` the ACME
  directory it came from (a certificate from staging is replaced at once
  when the config names production); ``certificates/<id>.ocsp`` its
  current OCSP response (DER), where the CA offers OCSP.

Files are written whole (a temporary file, fsync, rename), never group- or
world-readable.
"""

from __future__ import annotations

import hashlib
import json
import stat
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from josepy.jwk import JWKEC

from geoedge.private_files import write_private

__all__ = ["AcmeFiles", "FilesError", "IssuedCertificate"]

_KEY_HEADER = "-----BEGIN PRIVATE KEY-----"


class FilesError(Exception):
    """The state directory or one of its files cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    """One certificate the origin holds: the chain (leaf first) and its key, PEM."""

    id: str
    chain: str
    key: str

    @property
    def leaf(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.chain.encode())

    @property
    def not_before(self) -> float:
        return self.leaf.not_valid_before_utc.timestamp()

    @property
    def not_after(self) -> float:
        return self.leaf.not_valid_after_utc.timestamp()

    @property
    def names(self) -> tuple[str, ...]:
        san = self.leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return tuple(san.get_values_for_type(x509.DNSName))


class AcmeFiles:
    """The state directory; see the module docstring."""

    def __init__(self, directory: Path, directory_url: str) -> None:
        self.directory = directory
        self.directory_url = directory_url
        host = urllib.parse.urlsplit(directory_url).hostname or "acme"
        digest = hashlib.sha256(directory_url.encode()).hexdigest()[:12]
        self.account_dir = directory / "accounts" / f"{host}-{digest}"
        self.certificate_dir = directory / "certificates"

    def prepare(self) -> None:
        """Create the directories (0700); :class:`FilesError` if they cannot be
        made or others may enter the state directory."""
        try:
            for path in (self.directory, self.account_dir, self.certificate_dir):
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
            mode = stat.S_IMODE(self.directory.stat().st_mode)
        except OSError as exc:
            raise FilesError(f"{self.directory}: {exc.strerror or exc}") from None
        if mode & 0o077:
            raise FilesError(
                f"{self.directory}: mode {mode:04o} lets others in; chmod 700 {self.directory}"
            )

    # -- the account ---------------------------------------------------------------------

    @property
    def account_key_path(self) -> Path:
        return self.account_dir / "key.pem"

    def account_key(self) -> JWKEC:
        """The account key, made (and written, 0600) the first time."""
        path = self.account_key_path
        try:
            pem = path.read_bytes()
        except FileNotFoundError:
            key = ec.generate_private_key(ec.SECP256R1())
            pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            self._write(path, pem)
        except OSError as exc:
            raise FilesError(f"{path}: {exc.strerror or exc}") from None
        try:
            loaded = serialization.load_pem_private_key(pem, password=None)
        except ValueError as exc:
            raise FilesError(f"{path}: not a PEM private key ({exc})") from None
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise FilesError(f"{path}: the account key must be an ECDSA key")
        return JWKEC(key=loaded)

    def account_url(self) -> str | None:
        try:
            data = json.loads((self.account_dir / "account.json").read_text())
        except (OSError, ValueError):
            return None
        url = data.get("url") if isinstance(data, dict) else None
        return url if isinstance(url, str) else None

    def save_account_url(self, url: str) -> None:
        self._write(self.account_dir / "account.json", json.dumps({"url": url}).encode())

    # -- issued certificates -------------------------------------------------------------

    def certificate(self, certificate_id: str) -> IssuedCertificate | None:
        """The stored certificate ``certificate_id``, or None (none, or unreadable)."""
        path = self.certificate_dir / f"{certificate_id}.pem"
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise FilesError(f"{path}: {exc}") from None
        chain, _, key = text.partition(_KEY_HEADER)
        if not key:
            raise FilesError(f"{path}: no private key after the chain")
        issued = IssuedCertificate(certificate_id, chain, _KEY_HEADER + key)
        try:
            issued.leaf  # noqa: B018 - parses, or raises
        except ValueError as exc:
            raise FilesError(f"{path}: not a PEM chain ({exc})") from None
        return issued

    def save_certificate(self, issued: IssuedCertificate) -> None:
        chain = issued.chain if issued.chain.endswith("\n") else issued.chain + "\n"
        self._write(self.certificate_dir / f"{issued.id}.pem", (chain + issued.key).encode())
        issuer = json.dumps({"directory": self.directory_url}).encode()
        self._write(self.certificate_dir / f"{issued.id}.json", issuer)
        try:  # the previous certificate's response
            (self.certificate_dir / f"{issued.id}.ocsp").unlink(missing_ok=True)
        except OSError as exc:
            raise FilesError(f"{issued.id}.ocsp: {exc.strerror or exc}") from None

    def issued_by(self, certificate_id: str) -> str | None:
        """The ACME directory a stored certificate came from (None: not recorded)."""
        try:
            data = json.loads((self.certificate_dir / f"{certificate_id}.json").read_text())
        except (OSError, ValueError):
            return None
        directory = data.get("directory") if isinstance(data, dict) else None
        return directory if isinstance(directory, str) else None

    def ocsp(self, certificate_id: str) -> bytes | None:
        """The stored OCSP response of a certificate, or None."""
        try:
            return (self.certificate_dir / f"{certificate_id}.ocsp").read_bytes()
        except OSError:
            return None

    def save_ocsp(self, certificate_id: str, der: bytes) -> None:
        self._write(self.certificate_dir / f"{certificate_id}.ocsp", der)

    def _write(self, path: Path, data: bytes) -> None:
        try:
            write_private(path, data)
        except OSError as exc:
            raise FilesError(f"{path}: {exc.strerror or exc}") from None
