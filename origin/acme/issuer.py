"""One issuance, start to end (RFC 8555 §7.4): order, prove control of each
name, finalize, download.

The order of steps is the point:

1. A new key and CSR for the certificate's names, and a new order.
2. For each authorization still pending, one challenge: the first of the
   configured types the CA offers (a wildcard: dns-01 only). Its proof goes
   where the CA will look *before* the CA is told to look: HTTP-01 tokens
   and TLS-ALPN-01 certificates to every connected edge (with latency-based
   DNS the CA, and its other vantage points, can reach any region), DNS-01
   records to the DNS provider. The edges' ACKs are awaited; validation goes
   ahead when at least one edge applied the challenge, and the edges that
   did not are named in the log (they would fail a validation that lands on
   them). No edge: the attempt fails before the CA is asked.
3. Every challenge answered, the authorizations polled to valid, the order
   finalized, the chain downloaded.
4. Always, success or not: the edges told to forget the challenges, the TXT
   records removed.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from acme import challenges, messages

from geoedge.acme_wire import AcmeMessage, ChallengeClear, Http01Challenge, TlsAlpn01Challenge
from geoedge.acme_wire import encode as encode_message
from origin.acme.broadcast import Broadcaster, EdgeReply, confirmed_edges, summary
from origin.acme.client import AcmeClient, AcmeError
from origin.acme.config import AcmeCertificateConfig, AcmeConfig, ChallengeType
from origin.acme.dns import DnsError, DnsProvider, challenge_name
from origin.acme.files import IssuedCertificate
from origin.acme.material import (
    TLSALPN01,
    make_csr,
    make_key,
    private_key_pem,
    tls_alpn_certificate,
)

__all__ = ["Issuer", "NoEdgeAnswered"]

log = logging.getLogger("geoedge.origin.acme")

Cleanup = Callable[[], Awaitable[None]]


class NoEdgeAnswered(AcmeError):
    """No connected edge applied a challenge: the CA was not asked to validate."""


class Issuer:
    """Issues certificates for one account; see the module docstring."""

    def __init__(
        self,
        client: AcmeClient,
        broadcaster: Broadcaster,
        config: AcmeConfig,
        dns: DnsProvider | None = None,
    ) -> None:
        self._client = client
        self._broadcaster = broadcaster
        self._config = config
        self._dns = dns
        #: The edges' answers to the last message sent, for the status page.
        self.last_replies: list[EdgeReply] = []

    async def send(self, message: AcmeMessage) -> list[EdgeReply]:
        """``message`` to every edge; their replies."""
        kind, body = encode_message(message)
        replies = await self._broadcaster(kind, body, self._config.edge_ack_timeout_s)
        self.last_replies = replies
        return replies

    async def issue(self, spec: AcmeCertificateConfig) -> IssuedCertificate:
        client = self._client
        key = make_key(spec.key_type)
        order = await asyncio.to_thread(client.new_order, make_csr(key, spec.domains))
        answers: list[tuple[messages.ChallengeBody, Any]] = []
        cleanups: list[Cleanup] = []
        try:
            for authorization in order.authorizations:
                body = authorization.body
                if body.status == messages.STATUS_VALID:
                    continue  # the CA remembers a recent validation of this name
                domain = body.identifier.value
                challenge = self._choose(body, bool(body.wildcard), spec.challenge_types)
                response = challenge.chall.response(client.account_key)
                cleanups.append(await self._prove(challenge, domain, spec.id))
                answers.append((challenge, response))
            for challenge, response in answers:
                await asyncio.to_thread(client.answer, challenge, response)
            deadline = datetime.datetime.now() + datetime.timedelta(
                seconds=self._config.validation_timeout_s
            )
            order = await asyncio.to_thread(client.poll_authorizations, order, deadline)
            order = await asyncio.to_thread(client.finalize, order, deadline)
        finally:
            for cleanup in cleanups:
                try:
                    await cleanup()
                except (DnsError, OSError) as exc:
                    log.warning("ACME challenge clean-up failed: %s", exc)
        return IssuedCertificate(spec.id, order.fullchain_pem, private_key_pem(key))

    def _choose(
        self, body: messages.Authorization, wildcard: bool, types: tuple[ChallengeType, ...]
    ) -> messages.ChallengeBody:
        wanted: tuple[ChallengeType, ...] = (
            ("dns-01",) if wildcard else types or self._config.challenge_types
        )
        offered = {challenge.chall.typ: challenge for challenge in body.challenges}
        for kind in wanted:
            if kind in offered and (kind != "dns-01" or self._dns is not None):
                return offered[kind]
        raise AcmeError(
            f"{body.identifier.value}: the CA offers {', '.join(sorted(offered))}; "
            f"configured: {', '.join(wanted)}"
        )

    async def _prove(self, challenge: messages.ChallengeBody, domain: str, cid: str) -> Cleanup:
        """Put the proof where the CA will look; the step that takes it away."""
        chall = challenge.chall
        account_key = self._client.account_key
        if isinstance(chall, challenges.DNS01):
            assert self._dns is not None
            dns = self._dns
            name, value = challenge_name(domain), chall.validation(account_key)
            await dns.add_txt(name, value)
            log.info("dns-01 for %s (%s): TXT record set at %s", domain, cid, name)
            return lambda: dns.remove_txt(name, value)
        key_authorization = chall.key_authorization(account_key)
        message: AcmeMessage
        if isinstance(chall, TLSALPN01):
            now = datetime.datetime.now(datetime.UTC)
            certificate, key = tls_alpn_certificate(domain, key_authorization, now)
            message = TlsAlpn01Challenge(domain, certificate, key)
            clear = ChallengeClear("tls-alpn-01", domain)
        else:
            token = chall.encode("token")
            message = Http01Challenge(domain, token, key_authorization)
            clear = ChallengeClear("http-01", domain, token)
        replies = await self.send(message)
        confirmed = confirmed_edges(replies)
        problems = summary(replies)
        if not confirmed:
            raise NoEdgeAnswered(
                f"{domain} {chall.typ}: no edge applied the challenge"
                + (f" ({problems})" if problems else " (no edge connected)")
            )
        if problems:
            log.warning("%s %s: some edges cannot answer: %s", domain, chall.typ, problems)
        log.info(
            "%s for %s (%s): confirmed by %s", chall.typ, domain, cid, ", ".join(sorted(confirmed))
        )

        async def forget() -> None:
            await self.send(clear)

        return forget
