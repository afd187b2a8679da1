"""Which edges were turned away, and why: logs and a metric for every refusal.

Two places refuse an edge:

- the TLS handshake, when its certificate is not from our CA (or it speaks
  no TLS at all). asyncio and uvloop drop such connections silently (an
  ``OSError`` in the handshake is only logged in debug mode), so
  :class:`TlsAudit` installs an ``SSLObject`` subclass on the listener's
  context (``SSLContext.sslobject_class``, the documented hook for this) whose
  ``do_handshake`` reports the failure before re-raising it;
- the transport's authorizer, when the certificate is not an edge's (its
  ``geoedge://<role>/<id>`` URI SAN names another role, or none) or its
  identity (inside WireGuard, the peer address) is not allowed. It logs the reason itself and
  fails the connection's ``established`` future with
  :class:`~tunnel.aio.connection.PeerRefused`; :func:`refusal_reason` maps that to
  a short label for the metric.

The context is built in the parent before forking, so the audit's sink is a
plain attribute each worker sets to its own callback after the fork.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable

from geoedge.logs import log_event

__all__ = ["TlsAudit", "refusal_reason"]

log = logging.getLogger("geoedge.origin")

RefusalSink = Callable[[str], None]


class TlsAudit:
    """Reports failed TLS handshakes of a server context to ``sink(reason)``."""

    def __init__(self) -> None:
        self.sink: RefusalSink | None = None

    def install(self, context: ssl.SSLContext) -> ssl.SSLContext:
        audit = self

        class AuditedSSLObject(ssl.SSLObject):
            def do_handshake(self) -> None:
                try:
                    super().do_handshake()
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    raise
                except ssl.SSLError as exc:
                    audit.report(exc)
                    raise

        context.sslobject_class = AuditedSSLObject
        return context

    def report(self, exc: ssl.SSLError) -> None:
        reason = "tls_" + str(exc.reason or type(exc).__name__).lower()
        detail = getattr(exc, "verify_message", None) or str(exc)
        log_event(log, "warning", "edge refused in the TLS handshake", reason=reason, detail=detail)
        if self.sink is not None:
            self.sink(reason)


def refusal_reason(exc: BaseException) -> str:
    """A metric label for the authorizer's refusal message."""
    text = str(exc)
    if "expected role" in text:
        return "wrong_role"
    if "allowed_identities" in text:
        return "identity_not_allowed"
    if "allowed_peers" in text:
        return "peer_not_allowed"
    if "no geoedge identity" in text:
        return "no_identity"
    return "other"
