"""The edge's store of certificates issued by the origin's ACME client: one
file per certificate in the service's state directory, so an edge that
restarts while its origin is unreachable still serves them.

- The directory is the edge's alone: created mode 0700, refused when others
  may enter it. Each certificate is one file, ``<id>.pem``, mode 0600:
  the chain (leaf first) then its private key. One file, so a reader never
  pairs a new chain with an old key (``load_cert_chain`` takes both from
  it). Its OCSP response, when the origin sent one, is ``<id>.ocsp``.
- Every worker of the edge receives each certificate on its own tunnel
  connections and saves it: a save takes an exclusive ``flock`` on the
  directory's lock file, keeps whichever of the stored and the incoming
  certificate was issued later (a late, older message never replaces a
  newer one), writes a temporary file (0600, fsync) and renames it over the
  old one, so a reader sees either file whole.
- A certificate is checked before it is stored: a PEM chain whose leaf the
  key matches, not expired, naming at least one DNS name.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from geoedge.private_files import write_private

__all__ = ["AcmeStore", "StoreError", "StoredCertificate", "check_certificate"]

log = logging.getLogger("geoedge.edge.acme")

_LOCK = ".lock"
_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


class StoreError(Exception):
    """A certificate that cannot be stored or served; the message says why."""


@dataclass(frozen=True, slots=True)
class StoredCertificate:
    """One certificate as the store keeps it."""

    id: str
    path: Path
    names: tuple[str, ...]
    """Its DNS names (SANs), lowercase, wildcards as ``*.example.com``."""
    not_before: float
    not_after: float
    serial: int
    ocsp_path: Path | None = None


def check_certificate(
    certificate_id: str, chain_pem: str, key_pem: str, now: float
) -> tuple[x509.Certificate, tuple[str, ...]]:
    """The leaf of ``chain_pem`` and its DNS names, once the chain parses, the
    key is the leaf's and the leaf is valid at ``now``; :class:`StoreError` otherwise."""
    if not _ID.fullmatch(certificate_id):
        raise StoreError(f"{certificate_id!r} is not a certificate id")
    try:
        chain = x509.load_pem_x509_certificates(chain_pem.encode())
    except ValueError as exc:
        raise StoreError(f"{certificate_id}: the chain is not PEM certificates ({exc})") from None
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise StoreError(f"{certificate_id}: the key is not a PEM private key ({exc})") from None
    leaf = chain[0]
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise StoreError(f"{certificate_id}: only ECDSA and RSA keys are served")
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, public) != leaf.public_key().public_bytes(der, public):
        raise StoreError(f"{certificate_id}: the key is not the leaf certificate's")
    if not leaf.not_valid_before_utc.timestamp() <= now < leaf.not_valid_after_utc.timestamp():
        raise StoreError(f"{certificate_id}: the certificate is not valid now")
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise StoreError(f"{certificate_id}: the certificate names no DNS name") from None
    names = tuple(name.lower() for name in san.get_values_for_type(x509.DNSName))
    if not names:
        raise StoreError(f"{certificate_id}: the certificate names no DNS name")
    return leaf, names


class AcmeStore:
    """The certificate files of one edge; see the module docstring."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def prepare(self) -> None:
        """Create the directory (0700) if it is missing; :class:`StoreError` if it
        cannot be, or if others may read it."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            mode = stat.S_IMODE(self.directory.stat().st_mode)
        except OSError as exc:
            raise StoreError(f"{self.directory}: {exc.strerror or exc}") from None
        if mode & 0o077:
            raise StoreError(
                f"{self.directory}: mode {mode:04o} lets others in; chmod 700 {self.directory}"
            )
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise StoreError(f"{self.directory}: not writable by this user")

    def load_all(self, now: float) -> list[StoredCertificate]:
        """Every stored certificate that can still be served; a file that cannot
        is logged and skipped (the origin sends a good one when it connects)."""
        found: list[StoredCertificate] = []
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(self.directory.glob("*.pem")):
                try:
                    found.append(self._read(path.stem, now))
                except StoreError as exc:
                    log.warning("stored certificate not served: %s", exc)
        return found

    def _read(self, certificate_id: str, now: float) -> StoredCertificate:
        path = self.directory / f"{certificate_id}.pem"
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreError(f"{path}: {exc}") from None
        chain, _, key = text.partition("-----BEGIN PRIVATE KEY-----")
        leaf, names = check_certificate(
            certificate_id, chain, "-----BEGIN PRIVATE KEY-----" + key, now
        )
        ocsp = path.with_suffix(".ocsp")
        return StoredCertificate(
            certificate_id,
            path,
            names,
            leaf.not_valid_before_utc.timestamp(),
            leaf.not_valid_after_utc.timestamp(),
            leaf.serial_number,
            ocsp if ocsp.is_file() else None,
        )

    def save(
        self, certificate_id: str, chain_pem: str, key_pem: str, ocsp: bytes | None, now: float
    ) -> StoredCertificate:
        """Store a certificate unless one issued later is stored already; the
        certificate now stored (either). :class:`StoreError` for a certificate
        that cannot be served, or a file that cannot be written."""
        leaf, _ = check_certificate(certificate_id, chain_pem, key_pem, now)
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
        # One key format (PKCS#8) in the file, whatever the origin sent: _read
        # splits chain and key at its header.
        pkcs8 = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        with self._locked():
            try:
                stored: StoredCertificate | None = self._read(certificate_id, now)
            except StoreError:
                stored = None
            if stored is not None and (
                stored.not_before > leaf.not_valid_before_utc.timestamp()
                or (stored.serial == leaf.serial_number and ocsp is None)
            ):
                return stored  # newer (or the same) already there
            path = self.directory / f"{certificate_id}.pem"
            ocsp_path = path.with_suffix(".ocsp")
            if ocsp is not None:
                self._write(ocsp_path, ocsp)
            else:
                with contextlib.suppress(FileNotFoundError):
                    ocsp_path.unlink()  # the old certificate's, not this one's
            chain_text = chain_pem if chain_pem.endswith("\n") else chain_pem + "\n"
            self._write(path, (chain_text + pkcs8).encode())
            return self._read(certificate_id, now)

    @contextlib.contextmanager
    def scratch(self, pem: str) -> Iterator[Path]:
        """A file (0600, in the store) holding ``pem`` while the block runs:
        ``load_cert_chain`` reads only files (a challenge certificate and key)."""
        fd, name = tempfile.mkstemp(dir=self.directory, prefix=".scratch-", suffix=".pem")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(pem)
            yield Path(name)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for a few file writes
            yield
        finally:
            os.close(fd)

    def _write(self, path: Path, data: bytes) -> None:
        try:
            write_private(path, data)
        except OSError as exc:
            raise StoreError(f"{path}: {exc.strerror or exc}") from None
