"""One OCSP refresh for one issued certificate (:mod:`origin.acme.ocsp`): what
to staple, when to ask again, and what to tell the operator. The manager
applies the outcome (stores it, sends it to the edges, renews a revoked
certificate)."""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass

from origin.acme.ocsp import (
    OcspAnswer,
    OcspError,
    check_response,
    fetch,
    refresh_at,
    request_der,
    responder_url,
)
from tunnel.policy import Backoff

__all__ = ["NO_RESPONDER", "StapleOutcome", "refresh"]

log = logging.getLogger("geoedge.origin.acme")

#: What the status says of a certificate that names no OCSP responder (Let's
#: Encrypt's since May 2025): nothing to fetch, nothing to staple.
NO_RESPONDER = "none: the certificate names no OCSP responder"
#: Failed fetches are retried after full-jitter backoff from a minute to an hour.
RETRY = Backoff(60.0, 3600.0)


@dataclass(frozen=True, slots=True)
class StapleOutcome:
    answer: OcspAnswer | None
    """A good response to staple, or None (keep the current one, if still valid)."""
    next_at: float
    """When to refresh again (``inf``: never, no responder)."""
    note: str
    """For the status: ``good until ...``, or why there is no staple."""
    revoked: bool = False


async def refresh(
    certificate_id: str,
    chain_pem: str,
    failures: int,
    now: float,
    timeout_s: float,
    rng: random.Random,
) -> StapleOutcome:
    """Fetch and check the OCSP response of ``chain_pem``'s leaf; ``failures``
    counts the failed refreshes before this one (for the backoff)."""
    url = responder_url(chain_pem)
    if url is None:
        return StapleOutcome(None, math.inf, NO_RESPONDER)
    retry_at = now + RETRY.delay(failures, rng)
    try:
        der = await fetch(url, request_der(chain_pem), timeout_s)
        answer = check_response(der, chain_pem, now)
    except (OcspError, ValueError) as exc:
        log.warning("OCSP for ACME certificate %s: %s (retry in %.0f s)", certificate_id, exc,
                    retry_at - now)  # fmt: skip
        return StapleOutcome(None, retry_at, f"error: {exc}")
    if answer.status == "revoked":
        log.error("ACME certificate %s is REVOKED (OCSP, %s): renewing it now", certificate_id, url)
        return StapleOutcome(None, retry_at, "REVOKED: renewing", revoked=True)
    if answer.status != "good":
        return StapleOutcome(None, retry_at, f"the responder says {answer.status}")
    next_at = refresh_at(answer, now)
    log.info("OCSP response for ACME certificate %s: good", certificate_id)
    return StapleOutcome(answer, next_at, "good")
