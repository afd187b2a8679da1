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
- ``geoedge acme renew --force [id]`` (the admin's ``POST /acme/renew``):
  :meth:`AcmeManager.renew` runs an attempt now and returns its outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from geoedge.acme_wire import CertificateSet
from origin.acme.broadcast import Broadcaster, EdgeReply, confirmed_edges, summary
from origin.acme.client import AcmeClient, AcmeError
from origin.acme.config import AcmeCertificateConfig, AcmeConfig, DnsConfig
from origin.acme.dns import ChalltestsrvProvider, DnsError, DnsProvider
from origin.acme.files import AcmeFiles, FilesError, IssuedCertificate
from origin.acme.issuer import Issuer
from origin.acme.schedule import next_attempt, renew_at
from tunnel.policy import Backoff

__all__ = ["AcmeManager", "CertificateState"]

log = logging.getLogger("geoedge.origin.acme")

#: How long ARI's answer is trusted at most before it is asked again.
ARI_RECHECK_MAX_S = 6 * 3600.0


@dataclass(slots=True)
class CertificateState:
    """What the manager knows of one configured certificate."""

    spec: AcmeCertificateConfig
    issued: IssuedCertificate | None = None
    renew_at: float | None = None
    """When it is due (ARI's time, or the lifetime fraction); None: now."""
    ari_recheck_at: float = 0.0
    next_try: float = 0.0
    """Not before this (backoff after a failure)."""
    failures: int = 0
    last_error: str = ""
    last_success: float | None = None
    edges: dict[str, str] = field(default_factory=dict)
    """Each edge's answer to the current certificate (``applied``, ...)."""
    forced: bool = False
    """A renewal was asked for (``renew --force``): due until one succeeds."""

    def due(self, now: float) -> bool:
        if now < self.next_try:
            return False
        if self.forced or self.issued is None:
            return True
        if set(self.issued.names) != set(self.spec.domains):
            return True
        return self.renew_at is None or now >= self.renew_at

    def wakes_at(self) -> float:
        if self.forced or self.issued is None or self.renew_at is None:
            return self.next_try
        return max(self.next_try, min(self.renew_at, self.ari_recheck_at or self.renew_at))


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
        return [
            CertificateSet(state.spec.id, state.issued.chain, state.issued.key)
            for state in self.states.values()
            if state.issued is not None
        ]

    # -- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            now = self._clock()
            for state in self.states.values():
                if state.due(now):
                    async with self._lock:
                        await self._attempt(state)
                elif state.issued is not None and now >= state.ari_recheck_at:
                    await self._refresh_ari(state)
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
        return [self._status_of(state) for state in chosen]

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
        log.info("ACME: %s issued, valid until %s", spec.id, _iso(issued.not_after))
        self._schedule(state, None)
        await self._refresh_ari(state)
        await self._distribute(state)
        self._on_certificates(self.messages())
        self._on_change(self)

    async def _distribute(self, state: CertificateState) -> None:
        assert self._issuer is not None and state.issued is not None
        issued = state.issued
        replies = await self._issuer.send(CertificateSet(issued.id, issued.chain, issued.key))
        state.edges = _by_edge(replies)
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
            "certificates": [self._status_of(state) for state in self.states.values()],
        }

    def _status_of(self, state: CertificateState) -> dict[str, Any]:
        issued = state.issued
        return {
            "id": state.spec.id,
            "domains": list(state.spec.domains),
            "not_after": None if issued is None else _iso(issued.not_after),
            "not_after_ts": None if issued is None else issued.not_after,
            "serial": None if issued is None else f"{issued.leaf.serial_number:x}",
            "renew_at": None if state.renew_at is None else _iso(state.renew_at),
            "failures": state.failures,
            "last_error": state.last_error,
            "next_try": None if not state.next_try else _iso(state.next_try),
            "last_success": None if state.last_success is None else _iso(state.last_success),
            "edges": dict(state.edges),
        }


def make_provider(config: DnsConfig) -> DnsProvider:
    """The DNS-01 provider ``config`` names."""
    if config.provider == "challtestsrv":
        return ChalltestsrvProvider(config.challtestsrv_url)
    from origin.acme.route53 import Route53Provider  # boto3 only where it is used

    return Route53Provider(config)


def _by_edge(replies: list[EdgeReply]) -> dict[str, str]:
    """Each edge's worst answer (one connection that failed makes it fail)."""
    edges: dict[str, str] = {}
    for reply in replies:
        if edges.get(reply.edge, "applied") == "applied":
            edges[reply.edge] = reply.status
    return edges


def _iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="seconds")


def _timestamp(moment: datetime.datetime) -> float:
    """``acme`` returns naive local times for "ask again": read them as local."""
    return moment.timestamp()
