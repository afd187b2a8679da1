"""The ACME messages the origin sends its edges in tunnel CONTROL frames
(``tunnel/PROTOCOL.md`` §5.14, kinds 0x0100-0x01FF): what each kind's body
holds, encoded and checked in one place for both sides.

Bodies are UTF-8 JSON objects. The origin runs ACME (:mod:`origin.acme`) and
sends, on every tunnel connection of every edge:

======  ======================  ==============================================
kind    name                    body
======  ======================  ==============================================
0x0100  ACME_CHALLENGE_SET      ``{"type": "http-01", "domain", "token",
                                "key_authorization"}`` or ``{"type":
                                "tls-alpn-01", "domain", "certificate", "key"}``
                                (the RFC 8737 certificate and its key, PEM)
0x0101  ACME_CHALLENGE_CLEAR    ``{"type", "domain", "token"}`` (``token``:
                                http-01 only)
0x0102  ACME_CERTIFICATE_SET    ``{"id", "chain", "key", "ocsp"}``: an issued
                                certificate (leaf first, PEM), its private key
                                (PEM) and an OCSP response to staple (base64
                                DER) or null
======  ======================  ==============================================

An edge ACKs APPLIED once the message is in effect on that connection's worker
(a challenge answered, a certificate served and stored), REFUSED with a reason
otherwise. The edge trusts these messages because they come over the tunnel:
mutual TLS with a certificate of the ``origin`` role from the edge's own CA
(or WireGuard). Pure data: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from tunnel.mux import ControlKind

__all__ = [
    "ACME_CERTIFICATE_SET",
    "ACME_CHALLENGE_CLEAR",
    "ACME_CHALLENGE_SET",
    "ACME_KINDS",
    "AcmeMessage",
    "CertificateSet",
    "ChallengeClear",
    "Http01Challenge",
    "MessageError",
    "TlsAlpn01Challenge",
    "decode",
    "encode",
    "is_dns_name",
]

ACME_CHALLENGE_SET = int(ControlKind.ACME_CHALLENGE_SET)
ACME_CHALLENGE_CLEAR = int(ControlKind.ACME_CHALLENGE_CLEAR)
ACME_CERTIFICATE_SET = int(ControlKind.ACME_CERTIFICATE_SET)
ACME_KINDS = (ACME_CHALLENGE_SET, ACME_CHALLENGE_CLEAR, ACME_CERTIFICATE_SET)

#: RFC 8555 §8.3: a token is base64url without padding (at least 128 bits).
_TOKEN = re.compile(r"[A-Za-z0-9_-]{22,256}")
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
#: What a certificate id may be: it names the edge's file of that certificate.
_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
#: Largest PEM text accepted in one message (a chain of four RSA-4096
#: certificates and a key fits in ~12 KiB).
MAX_PEM_CHARS = 32 * 1024


class MessageError(ValueError):
    """A body that is not the kind's JSON object; the message says what is wrong."""


def is_dns_name(name: str, *, wildcard: bool = False) -> bool:
    """A lowercase DNS name of at least two labels (``*.`` first when
    ``wildcard``), as ACME identifiers are."""
    if wildcard and name.startswith("*."):
        name = name[2:]
    labels = name.split(".")
    return len(name) <= 253 and len(labels) >= 2 and all(_LABEL.fullmatch(x) for x in labels)


@dataclass(frozen=True, slots=True)
class Http01Challenge:
    """Answer ``GET /.well-known/acme-challenge/<token>`` for ``domain`` on
    plain HTTP with ``key_authorization`` (RFC 8555 §8.3)."""

    domain: str
    token: str
    key_authorization: str


@dataclass(frozen=True, slots=True)
class TlsAlpn01Challenge:
    """Serve ``certificate`` (with ``key``) to a TLS client that offers only the
    ``acme-tls/1`` protocol for ``domain`` (RFC 8737 §3)."""

    domain: str
    certificate: str
    key: str


@dataclass(frozen=True, slots=True)
class ChallengeClear:
    """Stop answering a challenge (validated, failed or abandoned)."""

    type: Literal["http-01", "tls-alpn-01"]
    domain: str
    token: str = ""


@dataclass(frozen=True, slots=True)
class CertificateSet:
    """An issued certificate to serve for the names it holds, and to keep."""

    id: str
    chain: str
    key: str
    ocsp: bytes | None = None


AcmeMessage = Http01Challenge | TlsAlpn01Challenge | ChallengeClear | CertificateSet


def encode(message: AcmeMessage) -> tuple[int, bytes]:
    """The CONTROL kind and body of ``message``."""
    body: dict[str, Any]
    if isinstance(message, Http01Challenge):
        kind = ACME_CHALLENGE_SET
        body = {"type": "http-01", "domain": message.domain, "token": message.token}
        body["key_authorization"] = message.key_authorization
    elif isinstance(message, TlsAlpn01Challenge):
        kind = ACME_CHALLENGE_SET
        body = {"type": "tls-alpn-01", "domain": message.domain}
        body |= {"certificate": message.certificate, "key": message.key}
    elif isinstance(message, ChallengeClear):
        kind = ACME_CHALLENGE_CLEAR
        body = {"type": message.type, "domain": message.domain, "token": message.token}
    else:
        kind = ACME_CERTIFICATE_SET
        ocsp = None if message.ocsp is None else base64.b64encode(message.ocsp).decode()
        body = {"id": message.id, "chain": message.chain, "key": message.key, "ocsp": ocsp}
    return kind, json.dumps(body, separators=(",", ":")).encode()


def decode(kind: int, body: bytes) -> AcmeMessage:
    """The message a CONTROL frame of ``kind`` carries; :class:`MessageError`
    names what is wrong with a body that is not one."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MessageError(f"not UTF-8 JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MessageError("not a JSON object")
    fields = _Fields(data)
    if kind == ACME_CERTIFICATE_SET:
        ocsp_text = fields.optional("ocsp")
        try:
            ocsp = None if ocsp_text is None else base64.b64decode(ocsp_text, validate=True)
        except binascii.Error:
            raise MessageError("ocsp: not base64") from None
        certificate_id = fields.text("id")
        if not _ID.fullmatch(certificate_id):
            raise MessageError(f"id: {certificate_id!r} is not a certificate id")
        return CertificateSet(certificate_id, fields.pem("chain"), fields.pem("key"), ocsp)
    if kind not in (ACME_CHALLENGE_SET, ACME_CHALLENGE_CLEAR):
        raise MessageError(f"kind 0x{kind:04x} is not an ACME message")
    challenge = fields.text("type")
    wildcard = kind == ACME_CHALLENGE_CLEAR
    domain = fields.text("domain")
    if not is_dns_name(domain, wildcard=wildcard):
        raise MessageError(f"domain: {domain!r} is not a DNS name")
    if challenge not in ("http-01", "tls-alpn-01"):
        raise MessageError(f"type: {challenge!r} is not http-01 or tls-alpn-01")
    if kind == ACME_CHALLENGE_CLEAR:
        token = fields.optional("token") or ""
        if challenge == "http-01" and not _TOKEN.fullmatch(token):
            raise MessageError("token: not an ACME token")
        return ChallengeClear(challenge, domain, token)  # type: ignore[arg-type]
    if challenge == "http-01":
        token = fields.text("token")
        if not _TOKEN.fullmatch(token):
            raise MessageError("token: not an ACME token")
        key_authorization = fields.text("key_authorization")
        if not key_authorization.startswith(token + ".") or not key_authorization.isascii():
            raise MessageError("key_authorization: not <token>.<thumbprint>")
        return Http01Challenge(domain, token, key_authorization)
    return TlsAlpn01Challenge(domain, fields.pem("certificate"), fields.pem("key"))


class _Fields:
    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def text(self, name: str) -> str:
        value = self._data.get(name)
        if not isinstance(value, str) or not value:
            raise MessageError(f"{name}: a non-empty string is needed")
        return value

    def optional(self, name: str) -> str | None:
        value = self._data.get(name)
        if value is not None and not isinstance(value, str):
            raise MessageError(f"{name}: a string or null is needed")
        return value

    def pem(self, name: str) -> str:
        value = self.text(name)
        if len(value) > MAX_PEM_CHARS or "-----BEGIN " not in value or not value.isascii():
            raise MessageError(f"{name}: not PEM text of at most {MAX_PEM_CHARS} characters")
        return value
