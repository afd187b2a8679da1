"""The origin's ACME client against Pebble, without edges: a wildcard through
DNS-01 (pebble-challtestsrv as the DNS provider), the account key and the
certificates on disk (modes), the account kept across a restart, renewal
information (ARI) moving the renewal, and a CA outage retried with backoff."""

from __future__ import annotations

import asyncio
import stat
import time
from pathlib import Path

from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store

from origin.acme.broadcast import EdgeReply
from origin.acme.config import AcmeCertificateConfig, AcmeConfig, DnsConfig
from origin.acme.manager import AcmeManager
from tests.acme_env import Outage, Pebble, pebble
from tests.conftest import PkiFiles, run_async, scaled


class NoEdges:
    """An origin with no edge connected: every broadcast reaches nobody."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    async def __call__(self, kind: int, body: bytes, timeout_s: float) -> list[EdgeReply]:
        self.sent.append(kind)
        return []


def acme_config(ca: Pebble, tmp: Path, **overrides: object) -> AcmeConfig:
    values: dict[str, object] = {
        "directory_url": ca.directory_url,
        "ca_bundle": ca.ca,
        "agree_to_terms": True,
        "contact": ("mailto:ops@geoedge.test",),
        "state_dir": tmp / "origin-acme",
        "challenge_types": ("dns-01",),
        "dns": DnsConfig(
            provider="challtestsrv", challtestsrv_url=f"http://127.0.0.1:{ca.challtestsrv_port}"
        ),
        "certificates": (
            AcmeCertificateConfig("wild", ("*.wild.geoedge.test", "wild.geoedge.test")),
        ),
        "retry_base_s": 0.2,
        "retry_cap_s": 0.5,
    }
    values.update(overrides)
    return AcmeConfig(**values)  # type: ignore[arg-type]


def verify(chain_pem: str, root_pem: str, name: str) -> x509.Certificate:
    """The leaf, once the chain verifies up to Pebble's root for ``name``."""
    chain = x509.load_pem_x509_certificates(chain_pem.encode())
    root = x509.load_pem_x509_certificate(root_pem.encode())
    verifier = PolicyBuilder().store(Store([root])).build_server_verifier(x509.DNSName(name))
    verifier.verify(chain[0], chain[1:])
    return chain[0]


async def wait_for(condition: object, timeout_s: float) -> None:
    deadline = time.monotonic() + scaled(timeout_s)
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def test_a_wildcard_through_dns_01_and_the_account_kept_across_a_restart(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with pebble(test_pki, tmp_path) as ca:
        config = acme_config(ca, tmp_path)

        async def first() -> tuple[str, int, str]:
            manager = AcmeManager(config, NoEdges())
            await manager.start()
            state = manager.states["wild"]
            await wait_for(lambda: state.issued is not None, 60)
            assert state.issued is not None
            await manager.close()
            assert manager.account_url is not None
            return manager.account_url, state.issued.leaf.serial_number, state.issued.chain

        account_url, serial, chain = run_async(first(), 90)
        leaf = verify(chain, ca.root_pem(), "a.wild.geoedge.test")
        assert leaf.serial_number == serial
        state_dir = config.state_dir
        assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
        files = [p for p in state_dir.rglob("*") if p.is_file()]
        assert {p.name for p in files} >= {"key.pem", "account.json", "wild.pem"}
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        key_before = next(p for p in files if p.name == "key.pem").read_bytes()

        async def second() -> tuple[str | None, int]:
            manager = AcmeManager(config, NoEdges())
            await manager.start()  # the stored certificate is not due: no new order
            state = manager.states["wild"]
            assert state.issued is not None
            forced = await manager.renew("wild")  # geoedge acme renew --force
            await manager.close()
            assert forced[0]["failures"] == 0, forced
            assert state.issued is not None
            return manager.account_url, state.issued.leaf.serial_number

        again_url, new_serial = run_async(second(), 90)
        assert again_url == account_url  # the same key: the same account
        assert next(p for p in files if p.name == "key.pem").read_bytes() == key_before
        assert new_serial != serial


def test_a_ca_outage_is_retried_with_backoff_and_the_old_certificate_kept(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with pebble(test_pki, tmp_path) as ca:
        acme_port = int(ca.directory_url.rsplit(":", 1)[1].split("/")[0])
        relay = Outage(acme_port)
        try:
            config = acme_config(ca, tmp_path, directory_url=f"https://127.0.0.1:{relay.port}/dir")

            async def scenario() -> None:
                manager = AcmeManager(config, NoEdges())
                await manager.start()
                try:
                    await outage(manager)
                finally:
                    await manager.close()

            async def outage(manager: AcmeManager) -> None:
                state = manager.states["wild"]
                await wait_for(lambda: state.issued is not None, 60)
                assert state.issued is not None
                old_serial = state.issued.leaf.serial_number
                relay.down = True
                outcome = await manager.renew("wild")
                assert outcome[0]["failures"] == 1 and "unreachable" in outcome[0]["last_error"]
                assert state.issued.leaf.serial_number == old_serial  # still the one served
                # The manager retries on its own, with backoff, while the CA is down...
                await wait_for(lambda: state.failures >= 3, 30)
                assert relay.refused >= 3
                relay.down = False
                # ...and once it is back, the next retry renews.
                await wait_for(lambda: state.issued.leaf.serial_number != old_serial, 60)
                assert state.failures == 0

            run_async(scenario(), 150)
        finally:
            relay.close()


def test_a_certificate_from_another_ca_is_replaced_at_once(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    """Staging first, then production: the stored certificate names the
    directory it came from, and one from another directory is issued again at
    start instead of being served until its renewal (here the "other CA" is
    the same Pebble behind another URL: a relay in front of it)."""
    with pebble(test_pki, tmp_path) as ca:
        acme_port = int(ca.directory_url.rsplit(":", 1)[1].split("/")[0])
        relay = Outage(acme_port)
        try:
            staging = acme_config(ca, tmp_path, directory_url=f"https://127.0.0.1:{relay.port}/dir")
            production = acme_config(ca, tmp_path)

            async def issue(config: AcmeConfig, other_than: int | None) -> int:
                manager = AcmeManager(config, NoEdges())
                await manager.start()
                state = manager.states["wild"]
                try:
                    await wait_for(
                        lambda: (
                            state.issued is not None
                            and state.issued.leaf.serial_number != other_than
                        ),
                        60,
                    )
                finally:
                    await manager.close()
                assert state.issued is not None
                return int(state.issued.leaf.serial_number)

            first = run_async(issue(staging, None), 90)
            second = run_async(issue(production, first), 90)
            assert second != first
            # And with the same directory again, nothing is issued at start.

            async def unchanged() -> None:
                manager = AcmeManager(production, NoEdges())
                await manager.start()
                state = manager.states["wild"]
                assert state.issued is not None and not state.due(time.time())
                await manager.close()
                assert state.issued.leaf.serial_number == second

            run_async(unchanged(), 30)
        finally:
            relay.close()
