"""A private certificate authority for geoedge: the CA, server and tunnel-peer certificates.

Why a module of our own rather than a shell script around ``openssl``: the
edge and the origin must agree on *where* a peer's identity lives in its
certificate (a ``geoedge://<role>/<identity>`` URI SAN, see
:func:`issue_peer_cert`), and the code that writes it and the code that reads it
(:func:`peer_identity`) belong side by side. The cryptography itself is
``cryptography``'s; this module only chooses the profile:

- ECDSA P-256 keys by default: a P-256 signature costs about 1/17 of an
  RSA-2048 one, and the edge signs once per full TLS handshake. RSA-2048 is
  available for server certificates because old clients still need it (an
  edge can serve both, and OpenSSL picks per client).
- The CA is constrained (``pathlen=0``): it signs leaves only.
- Leaves carry SubjectKeyIdentifier/AuthorityKeyIdentifier and critical
  BasicConstraints/KeyUsage so that strict verifiers (OpenSSL's
  ``X509_STRICT``, the default from Python 3.13) accept them.
- Validity starts five minutes in the past to tolerate clock skew between
  the host that issues and the hosts that verify.
- Private keys are written with mode 0600 from the start (created with that
  mode, never chmod-ed after the fact), through a temporary file and a rename
  so that a crash never leaves half a key behind.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tunnel.peer_name import (
    IDENTITY_RE,
    PEER_ROLES,
    PEER_URI_SCHEME,
    PeerName,
    PeerRole,
    extension_value,
    parse_peer_name,
    peer_identity,
)

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "PEER_URI_SCHEME",
    "CertPaths",
    "CertificateAuthority",
    "KeyType",
    "PeerName",
    "PeerRole",
    "PkiError",
    "create_ca",
    "describe_certificate",
    "issue_peer_cert",
    "issue_server_cert",
    "load_ca",
    "parse_peer_name",
    "peer_identity",
    "renew_peer_cert",
    "write_file_atomically",
]

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"

KeyType = Literal["ecdsa", "rsa"]
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

_CLOCK_SKEW = dt.timedelta(minutes=5)
_RSA_BITS = 2048
_CN_MAX_CHARS = 64  # RFC 5280 ub-common-name
# An identity is one URI path segment and one log field: keep it boring.
_DNS_LABEL_RE = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


class PkiError(Exception):
    """A PKI request that cannot be honoured: bad name, missing or unreadable file.

    ``code`` is a stable, machine-readable reason (for the CLI's exit message and
    for tests); the message names the offending value or file.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class CertPaths:
    """Where a certificate and its private key were written."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """A loaded CA: what :func:`issue_server_cert` and :func:`issue_peer_cert` sign with."""

    cert: x509.Certificate
    key: PrivateKey
    paths: CertPaths


# --- issuing -------------------------------------------------------------------------


def create_ca(
    out_dir: str | os.PathLike[str],
    name: str = "geoedge private CA",
    days: int = 3650,
    *,
    overwrite: bool = False,
) -> CertPaths:
    """Create a self-signed ECDSA P-256 CA in ``out_dir`` (``ca.pem``, ``ca-key.pem``).

    Refuses to replace an existing CA unless ``overwrite``: a new CA silently
    invalidates every certificate issued by the old one.
    """
    directory = Path(out_dir)
    paths = CertPaths(directory / CA_CERT_FILE, directory / CA_KEY_FILE)
    if not overwrite and (paths.cert.exists() or paths.key.exists()):
        raise PkiError("ca-exists", f"a CA already exists in {directory} (refusing to replace it)")
    _check_days(days)
    key = _new_key("ecdsa")
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _common_name(name))])
    not_before = _now() - _CLOCK_SKEW
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True, rsa_key=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    _write_key(paths.key, key)
    _write_cert(paths.cert, cert)
    return paths


def load_ca(ca_dir: str | os.PathLike[str]) -> CertificateAuthority:
    """Load ``ca.pem`` and ``ca-key.pem`` from ``ca_dir`` and check that they belong together."""
    directory = Path(ca_dir)
    paths = CertPaths(directory / CA_CERT_FILE, directory / CA_KEY_FILE)
    cert = load_certificate(paths.cert)
    key_data = _read_file(paths.key)
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except (ValueError, TypeError) as exc:
        raise PkiError("bad-key", f"{paths.key}: not an unencrypted PEM private key") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise PkiError("bad-key", f"{paths.key}: unsupported key type {type(key).__name__}")
    if key.public_key() != cert.public_key():
        raise PkiError("key-mismatch", f"{paths.key} is not the key of {paths.cert}")
    return CertificateAuthority(cert=cert, key=key, paths=paths)


def issue_server_cert(
    ca: CertificateAuthority | str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    basename: str,
    names: Iterable[str],
    *,
    key_type: KeyType = "ecdsa",
    days: int = 825,
) -> CertPaths:
    """Issue a TLS server certificate for ``names`` (DNS names, ``*.`` wildcards, IPs).

    The CN is the first name (clients ignore it when SANs are present, but
    logs and ``openssl x509 -subject`` show it). Writes ``<basename>.pem`` and
    ``<basename>-key.pem`` in ``out_dir``.
    """
    name_list = list(names)
    if not name_list:
        raise PkiError("no-names", "a server certificate needs at least one name")
    sans = [_general_name(n) for n in name_list]
    return _issue(
        _as_ca(ca),
        Path(out_dir),
        basename,
        common_name=name_list[0],
        sans=sans,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        key_type=key_type,
        days=days,
    )


def issue_peer_cert(
    ca: CertificateAuthority | str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    basename: str,
    identity: str,
    *,
    role: PeerRole,
    dns_names: Iterable[str] = (),
    days: int = 825,
) -> CertPaths:
    """Issue a tunnel mutual-TLS certificate for the edge or origin called ``identity``.

    The identity is carried twice: in a URI SAN ``geoedge://<role>/<identity>``
    (the authoritative place, read by :func:`peer_identity`) and in the CN (for
    humans and for tools that only show the subject). Both client and server
    auth are allowed, since either side may dial. ``dns_names`` adds DNS SANs
    (IP addresses become IP SANs), e.g. the origin's hostname that edges verify
    when they dial it.
    """
    if role not in PEER_ROLES:
        raise PkiError("bad-role", f"peer role must be one of {PEER_ROLES}, not {role!r}")
    _check_identity(identity)
    sans: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(f"{PEER_URI_SCHEME}://{role}/{identity}")
    ]
    sans.extend(_general_name(n) for n in dns_names)
    return _issue(
        _as_ca(ca),
        Path(out_dir),
        basename,
        common_name=identity,
        sans=sans,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH],
        key_type="ecdsa",
        days=days,
    )


def renew_peer_cert(
    ca: CertificateAuthority | str | os.PathLike[str],
    cert_path: str | os.PathLike[str],
    *,
    days: int = 825,
    out_dir: str | os.PathLike[str] | None = None,
) -> CertPaths:
    """Issue ``cert_path``'s tunnel certificate again: the same identity, role
    and DNS/IP names, a new key, ``days`` from now, signed by ``ca`` (the same
    CA, or the new one during a CA rotation). Written over the same files
    (``<name>.pem`` and ``<name>-key.pem``) unless ``out_dir`` is given; each
    file is replaced atomically."""
    path = Path(cert_path)
    cert = load_certificate(path)
    peer = parse_peer_name(cert)
    if peer is None or peer.role not in PEER_ROLES:
        raise PkiError(
            "not-a-peer", f"{path}: not a tunnel certificate (no geoedge://<role>/<id> URI SAN)"
        )
    san = extension_value(cert, x509.SubjectAlternativeName)
    names: list[str] = []
    if san is not None:
        names += san.get_values_for_type(x509.DNSName)
        names += [str(a) for a in san.get_values_for_type(x509.IPAddress)]
    if not path.name.endswith(".pem"):
        raise PkiError("bad-basename", f"{path}: expected a .pem file")
    return issue_peer_cert(
        ca,
        Path(out_dir) if out_dir is not None else path.parent,
        path.name.removesuffix(".pem"),
        peer.identity,
        role=peer.role,  # type: ignore[arg-type]
        dns_names=names,
        days=days,
    )


def _issue(
    ca: CertificateAuthority,
    out_dir: Path,
    basename: str,
    *,
    common_name: str,
    sans: list[x509.GeneralName],
    usages: list[x509.ObjectIdentifier],
    key_type: KeyType,
    days: int,
) -> CertPaths:
    _check_basename(basename)
    _check_days(days)
    key = _new_key(key_type)
    not_before = _now() - _CLOCK_SKEW
    not_after = min(not_before + dt.timedelta(days=days), ca.cert.not_valid_after_utc)
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca.key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _common_name(common_name))])
        )
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False, rsa_key=key_type == "rsa"), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = CertPaths(out_dir / f"{basename}.pem", out_dir / f"{basename}-key.pem")
    _write_key(paths.key, key)
    _write_cert(paths.cert, cert)
    return paths


# --- reading -------------------------------------------------------------------------


def load_certificate(path: str | os.PathLike[str]) -> x509.Certificate:
    """Load a PEM (or DER) certificate, naming the file in the error if it is not one."""
    data = _read_file(Path(path))
    try:
        if b"-----BEGIN" in data:
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise PkiError("bad-certificate", f"{path}: not a PEM or DER certificate") from exc


def describe_certificate(path: str | os.PathLike[str]) -> str:
    """Human-readable summary of a certificate file, for ``geoedge pki show``."""
    cert = load_certificate(path)
    sans = _san_strings(cert)
    peer = parse_peer_name(cert)
    basic = extension_value(cert, x509.BasicConstraints)
    key = cert.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        key_desc = f"ECDSA {key.curve.name}"
    elif isinstance(key, rsa.RSAPublicKey):
        key_desc = f"RSA-{key.key_size}"
    else:
        key_desc = type(key).__name__
    now = _now()
    expires = cert.not_valid_after_utc
    state = "EXPIRED" if expires < now else f"{(expires - now).days} days left"
    lines = [
        f"file:        {path}",
        f"subject:     {cert.subject.rfc4514_string()}",
        f"issuer:      {cert.issuer.rfc4514_string()}",
        f"is CA:       {'yes' if basic is not None and basic.ca else 'no'}",
        f"key:         {key_desc}",
        f"SANs:        {', '.join(sans) if sans else '(none)'}",
        f"identity:    {_peer_desc(peer)}",
        f"not before:  {cert.not_valid_before_utc.isoformat()}",
        f"not after:   {expires.isoformat()} ({state})",
        f"serial:      {cert.serial_number:x}",
        f"sha256:      {cert.fingerprint(hashes.SHA256()).hex(':')}",
    ]
    return "\n".join(lines)


# --- helpers -------------------------------------------------------------------------


def _as_ca(ca: CertificateAuthority | str | os.PathLike[str]) -> CertificateAuthority:
    return ca if isinstance(ca, CertificateAuthority) else load_ca(ca)


def _new_key(key_type: KeyType) -> PrivateKey:
    if key_type == "ecdsa":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=_RSA_BITS)
    raise PkiError("bad-key-type", f"key type must be 'ecdsa' or 'rsa', not {key_type!r}")


def _key_usage(*, ca: bool, rsa_key: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        # RSA key exchange (TLS 1.2 RSA kx suites) encrypts to the key.
        key_encipherment=rsa_key,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(name: str) -> x509.GeneralName:
    """An IP address or DNS name (a wildcard only as the whole leftmost label)."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        pass
    candidate = name[:-1] if name.endswith(".") else name
    labels = candidate.split(".")
    if labels and labels[0] == "*" and len(labels) >= 3:
        labels = labels[1:]
    if len(candidate) > 253 or not labels or not all(_DNS_LABEL_RE.match(x) for x in labels):
        raise PkiError(
            "bad-name",
            f"{name!r} is neither an IP address nor a DNS name "
            "(letters, digits and hyphens; a wildcard only as '*.' under two more labels)",
        )
    return x509.DNSName(candidate.lower())


def _common_name(value: str) -> str:
    if not value or len(value) > _CN_MAX_CHARS:
        raise PkiError(
            "bad-name", f"common name must be 1..{_CN_MAX_CHARS} characters, got {value!r}"
        )
    return value


def _check_identity(identity: str) -> None:
    if not IDENTITY_RE.match(identity):
        raise PkiError(
            "bad-identity",
            f"peer identity {identity!r} must be 1..63 of [A-Za-z0-9._-] starting with a "
            "letter or digit",
        )


def _check_basename(basename: str) -> None:
    if not basename or "/" in basename or basename in (".", ".."):
        raise PkiError(
            "bad-basename", f"output basename must be a plain file name, not {basename!r}"
        )


def _check_days(days: int) -> None:
    if days < 1:
        raise PkiError("bad-days", f"validity must be at least 1 day, got {days}")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise PkiError("missing-file", f"{path}: no such file") from exc
    except OSError as exc:
        raise PkiError("unreadable-file", f"{path}: {exc.strerror}") from exc


def _write_key(path: Path, key: PrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_file_atomically(path, data, mode=0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    write_file_atomically(path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)


def write_file_atomically(path: Path, data: bytes, *, mode: int) -> None:
    """Write ``path`` through a temporary file and a rename, with ``mode`` from creation.

    Shared with :mod:`geoedge.wireguard`, whose configs hold private keys too.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed the mode of a certificate
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _san_strings(cert: x509.Certificate) -> list[str]:
    san = extension_value(cert, x509.SubjectAlternativeName)
    if san is None:
        return []
    out = [f"DNS:{v}" for v in san.get_values_for_type(x509.DNSName)]
    out += [f"IP:{v}" for v in san.get_values_for_type(x509.IPAddress)]
    out += [f"URI:{v}" for v in san.get_values_for_type(x509.UniformResourceIdentifier)]
    return out


def _peer_desc(peer: PeerName | None) -> str:
    if peer is None:
        return "(none)"
    if peer.role is None:
        return f"{peer.identity} (from CN; no {PEER_URI_SCHEME}:// URI SAN)"
    return f"{peer.identity} (role {peer.role})"
