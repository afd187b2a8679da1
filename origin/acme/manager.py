"""The origin's ACME manager: keeps every configured certificate issued,
renewed and on every edge. It runs in the origin's parent process (one ACME
client for the whole fleet: one account, one order per certificate, whatever
the number of edges and workers).

- Start: the state directory and the account key (made once, kept), the
  stored certificates published at once (the workers hand them to every edge
  that connects), then one task that renews what is due, one certificate at
  a time.
- Due (:mod:`origin.acme.schedule`): no certificate yet, names changed in
  the config, the CA's ARI window has come, or two thirds of the lifetime
  have passed. A failed attempt (the CA unreachable, a validation refused, no
  edge answering) is retried after full-jitter backoff; meanwhile the old
  certificate goes on being served everywhere.
- Issued (:mod:`origin.acme.issuer`): stored (0600) first, then sent to every
  connected edge, whose ACKs are kept per edge for the status page, and
  published to the workers for edges that connect later.
- OCSP (:mod:`origin.acme.stapling`), where the CA names a responder: a
  response fetched with each new certificate and halfway through each
  response's validity, stored, and sent with the certificate for the edges
  to staple; a revoked certificate is renewed at once.
- ``geoedge acme renew --force [id]`` (the admin's ``POST /acme/renew``):
  :meth:`AcmeManager.renew` runs an attempt now and returns its outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any

from geoedge.acme_wire import CertificateSet
from geoedge.acme_wire import encode as encode_message
from origin.acme import stapling
from origin.acme.broadcast import Broadcaster, by_edge, confirmed_edges, summary
from origin.acme.client import AcmeClient, AcmeError
from origin.acme.config import AcmeConfig, DnsConfig
from origin.acme.dns import ChalltestsrvProvider, DnsError, DnsProvider
from origin.acme.files import AcmeFiles, FilesError
from origin.acme.issuer import Issuer
from origin.acme.ocsp import OcspError, check_response, refresh_at
from origin.acme.schedule import next_attempt, renew_at
from origin.acme.state import CertificateState, iso
from tunnel.policy import Backoff

__all__ = ["AcmeManager", "CertificateState"]

log = logging.getLogger("geoedge.origin.acme")

#: How long ARI's answer is trusted at most before it is asked again.
ARI_RECHECK_MAX_S = 6 * 3600.0


class AcmeManager:
    """See the module docstring. ``on_certificates(messages)`` publishes the
    current set to the workers (for edges that connect later);
    ``on_change()`` tells the metrics something changed."""

    def __init__(
        self,
        config: AcmeConfig,
        broadcaster: Broadcaster,
        *,
        on_certificates: Callable[[list[CertificateSet]], None] = lambda _: None,
        on_change: Callable[[AcmeManager], None] = lambda _: None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.files = AcmeFiles(config.state_dir, config.directory)
        self._broadcaster = broadcaster
        self._on_certificates = on_certificates
        self._on_change = on_change
        self._clock = clock
        self._rng = rng or random.Random()
        self._backoff = Backoff(config.retry_base_s, config.retry_cap_s)
        self.states = {spec.id: CertificateState(spec) for spec in config.certificates}
        self._client: AcmeClient | None = None
        self._issuer: Issuer | None = None
        self.account_url: str | None = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Prepare the state, publish the stored certificates, start renewing.
        Raises :class:`FilesError` when the state directory cannot be used."""
        await asyncio.to_thread(self.files.prepare)
        await asyncio.to_thread(self.files.account_key)  # made now, not at the first order
        for state in self.states.values():
            try:
                state.issued = await asyncio.to_thread(self.files.certificate, state.spec.id)
            except FilesError as exc:
                log.warning("stored ACME certificate ignored: %s", exc)
            if state.issued is not None:
                self._schedule(state, None)
                self._load_ocsp(state)
                issuer = self.files.issued_by(state.spec.id)
                if issuer is not None and issuer != self.config.directory:
                    log.info("ACME: %s came from %s: issuing it from %s", state.spec.id,
                             issuer, self.config.directory)  # fmt: skip
                    state.forced = True
        self._on_certificates(self.messages())
        self._on_change(self)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def messages(self) -> list[CertificateSet]:
        """The current certificates, as sent to the edges."""
        return [m for m in (state.message() for state in self.states.values()) if m is not None]

    # -- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._turn()
            except Exception:  # a bug here must not end every renewal for good
                log.exception("ACME: the renewal loop failed; going on in a minute")
                await asyncio.sleep(60.0)

    async def _turn(self) -> None:
        """Renew what is due, refresh ARI and OCSP, then sleep until the next due time."""
        now = self._clock()
        for state in self.states.values():
            if state.due(now):
                async with self._lock:
                    await self._attempt(state)
            else:
                if state.issued is not None and now >= state.ari_recheck_at:
                    await self._refresh_ari(state)
                if state.issued is not None and now >= state.ocsp_at:
                    await self._refresh_ocsp(state, distribute=True)
        wake = min(state.wakes_at() for state in self.states.values())
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(0.05, wake - self._clock()))

    async def renew(self, certificate_id: str | None = None) -> list[dict[str, Any]]:
        """Renew now (``geoedge acme renew --force``): one attempt for the named
        certificate (or each), whatever their schedule; their status after it."""
        chosen = [
            state
            for state in self.states.values()
            if certificate_id is None or state.spec.id == certificate_id
        ]
        if not chosen:
            raise KeyError(certificate_id)
        for state in chosen:
            state.forced = True
            async with self._lock:
                await self._attempt(state)
        self._wake.set()
        return [state.as_json() for state in chosen]

    async def _connected(self) -> Issuer:
        if self._issuer is not None:
            return self._issuer
        config = self.config
        key = await asyncio.to_thread(self.files.account_key)
        bundle = str(config.ca_bundle) if config.ca_bundle else None
        client = AcmeClient(config.directory, key, ca_bundle=bundle)
        url = await asyncio.to_thread(client.connect, config.contact, config.agree_to_terms)
        if url != self.files.account_url():
            await asyncio.to_thread(self.files.save_account_url, url)
        self.account_url = url
        log.info("ACME account %s at %s", url, config.directory)
        dns = None if config.dns is None else make_provider(config.dns)
        self._client = client
        self._issuer = Issuer(client, self._broadcaster, config, dns)
        return self._issuer

    async def _attempt(self, state: CertificateState) -> None:
        spec = state.spec
        log.info("ACME: issuing %s for %s", spec.id, ", ".join(spec.domains))
        try:
            issuer = await self._connected()
            issued = await issuer.issue(spec)
            await asyncio.to_thread(self.files.save_certificate, issued)
        except (AcmeError, DnsError, FilesError, OSError) as exc:
            now = self._clock()
            state.failures += 1
            state.last_error = str(exc)
            not_after = None if state.issued is None else state.issued.not_after
            state.next_try = next_attempt(state.failures, now, not_after, self._backoff, self._rng)
            log.warning(
                "ACME: %s failed (attempt %d, next in %.0f s; the current certificate stays): %s",
                spec.id,
                state.failures,
                state.next_try - now,
                exc,
            )
            self._on_change(self)
            return
        state.issued = issued
        state.forced = False
        state.failures = 0
        state.last_error = ""
        state.next_try = 0.0
        state.last_success = self._clock()
        log.info("ACME: %s issued, valid until %s", spec.id, iso(issued.not_after))
        self._schedule(state, None)
        await self._refresh_ari(state)
        state.ocsp, state.ocsp_failures = None, 0
        await self._refresh_ocsp(state, distribute=False)
        await self._distribute(state)
        self._on_certificates(self.messages())
        self._on_change(self)

    async def _distribute(self, state: CertificateState) -> None:
        message = state.message()
        assert state.issued is not None and message is not None
        issued = state.issued
        kind, body = encode_message(message)
        replies = await self._broadcaster(kind, body, self.config.edge_ack_timeout_s)
        state.edges = by_edge(replies)
        problems = summary(replies)
        confirmed = sorted(confirmed_edges(replies))
        log.info("ACME: %s on edges %s", issued.id, ", ".join(confirmed) or "(none connected)")
        if problems:
            log.warning("ACME: %s not applied by: %s", issued.id, problems)

    async def _refresh_ari(self, state: CertificateState) -> None:
        """Ask the CA's renewal information (ARI) for the current certificate."""
        if not self.config.use_ari or state.issued is None:
            return
        now = self._clock()
        try:
            await self._connected()
            assert self._client is not None
            suggested, recheck = await asyncio.to_thread(
                self._client.renewal_window, state.issued.chain
            )
        except AcmeError as exc:
            log.info("ACME renewal information for %s unavailable: %s", state.spec.id, exc)
            state.ari_recheck_at = now + min(ARI_RECHECK_MAX_S, self.config.retry_cap_s)
            return
        self._schedule(state, None if suggested is None else suggested.timestamp())
        recheck_at = _timestamp(recheck)
        state.ari_recheck_at = min(max(recheck_at, now + 60.0), now + ARI_RECHECK_MAX_S)

    def _load_ocsp(self, state: CertificateState) -> None:
        """The stored OCSP response, when it is still good for the stored certificate."""
        if not self.config.ocsp_stapling or state.issued is None:
            return
        state.ocsp_at = self._clock()  # fetch at the first turn of the loop, unless...
        der = self.files.ocsp(state.spec.id)
        if der is None:
            return
        try:
            answer = check_response(der, state.issued.chain, self._clock())
        except OcspError as exc:
            log.info("stored OCSP response of %s not used: %s", state.spec.id, exc)
            return
        if answer.status == "good":
            state.ocsp, state.ocsp_note = answer, "good"
            state.ocsp_at = refresh_at(answer, self._clock())

    async def _refresh_ocsp(self, state: CertificateState, *, distribute: bool) -> None:
        """Fetch a new OCSP response (:mod:`origin.acme.stapling`); keep, store and
        (``distribute``) send a good one; renew a revoked certificate at once."""
        if not self.config.ocsp_stapling or state.issued is None:
            return
        now = self._clock()
        outcome = await stapling.refresh(
            state.spec.id, state.issued.chain, state.ocsp_failures, now,
            self.config.edge_ack_timeout_s, self._rng,
        )  # fmt: skip
        state.ocsp_at, state.ocsp_note = outcome.next_at, outcome.note
        if outcome.revoked:  # renewed at once; again and again only with backoff
            state.ocsp, state.forced = None, True
            state.failures += 1
            state.last_error = "the CA's OCSP responder says the certificate is revoked"
            not_after = state.issued.not_after
            state.next_try = next_attempt(state.failures, now, not_after, self._backoff, self._rng)
            self._wake.set()
        if outcome.answer is None:
            state.ocsp_failures += not math.isinf(outcome.next_at)
            if state.ocsp is not None and not state.ocsp.valid_at(now):
                state.ocsp = None  # expired: no staple beats a stale one
            self._on_change(self)
            return
        state.ocsp, state.ocsp_failures = outcome.answer, 0
        try:
            await asyncio.to_thread(self.files.save_ocsp, state.spec.id, outcome.answer.der)
        except FilesError as exc:
            log.warning("OCSP response of %s not stored: %s", state.spec.id, exc)
        if distribute:
            await self._distribute(state)
            self._on_certificates(self.messages())
        self._on_change(self)

    def _schedule(self, state: CertificateState, ari_time: float | None) -> None:
        assert state.issued is not None
        issued = state.issued
        state.renew_at = renew_at(
            issued.not_before, issued.not_after, self.config.renew_at_lifetime_fraction, ari_time
        )

    # -- views ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """For ``geoedge acme status``, the status page and ``/acme``."""
        return {
            "directory": self.config.directory,
            "account": self.account_url or self.files.account_url(),
            "certificates": [state.as_json() for state in self.states.values()],
        }


def make_provider(config: DnsConfig) -> DnsProvider:
    """The DNS-01 provider ``config`` names."""
    if config.provider == "challtestsrv":
        return ChalltestsrvProvider(config.challtestsrv_url)
    from origin.acme.route53 import Route53Provider  # boto3 only where it is used

    return Route53Provider(config)


def _timestamp(moment: datetime.datetime) -> float:
    """``acme`` returns naive local times for "ask again": read them as local."""
    return moment.timestamp()
