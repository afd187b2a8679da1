"""The origin's OCSP checks and refresh decisions (origin/acme/ocsp.py,
origin/acme/stapling.py) against responses built here: what is stapled,
what is refused and why, when to ask again; a real HTTP responder for the
fetch."""

from __future__ import annotations

import asyncio
import datetime
import math
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import ocsp
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID, NameOID

from geoedge.acme_wire import CertificateSet, decode
from origin.acme.broadcast import EdgeReply
from origin.acme.config import AcmeCertificateConfig, AcmeConfig
from origin.acme.files import AcmeFiles, IssuedCertificate
from origin.acme.manager import AcmeManager
from origin.acme.ocsp import OcspError, check_response, refresh_at, request_der, responder_url
from origin.acme.stapling import NO_RESPONDER, refresh
from tests.conftest import run_async, scaled
from tests.tunnel_env import free_port

NOW = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
Key = ec.EllipticCurvePrivateKey


def certificate(
    subject: str,
    key: Key,
    issuer: tuple[x509.Certificate, Key] | None,
    *,
    ca: bool = False,
    ocsp_url: str | None = None,
    ocsp_signing: bool = False,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=90))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False
        )
    if ocsp_url:
        access = x509.AccessDescription(
            AuthorityInformationAccessOID.OCSP, x509.UniformResourceIdentifier(ocsp_url)
        )
        builder = builder.add_extension(x509.AuthorityInformationAccess([access]), critical=False)
    if ocsp_signing:
        eku = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.OCSP_SIGNING])
        builder = builder.add_extension(eku, critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


class Pki:
    def __init__(self, ocsp_url: str | None = "http://ocsp.example.test/") -> None:
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = certificate("Test CA", self.ca_key, None, ca=True)
        self.leaf_key = ec.generate_private_key(ec.SECP256R1())
        self.leaf = certificate(
            "web.example.com", self.leaf_key, (self.ca, self.ca_key), ocsp_url=ocsp_url
        )

    @property
    def chain(self) -> str:
        pem = serialization.Encoding.PEM
        return (self.leaf.public_bytes(pem) + self.ca.public_bytes(pem)).decode()

    def response(
        self,
        *,
        status: ocsp.OCSPCertStatus = ocsp.OCSPCertStatus.GOOD,
        leaf: x509.Certificate | None = None,
        signer: tuple[x509.Certificate, Key] | None = None,
        this_update: datetime.datetime = NOW - datetime.timedelta(hours=1),
        next_update: datetime.datetime | None = NOW + datetime.timedelta(days=3),
    ) -> bytes:
        signer_cert, signer_key = signer or (self.ca, self.ca_key)
        revoked = status == ocsp.OCSPCertStatus.REVOKED
        builder = (
            ocsp.OCSPResponseBuilder()
            .add_response(
                leaf or self.leaf, self.ca, hashes.SHA1(), status, this_update, next_update,
                NOW - datetime.timedelta(hours=2) if revoked else None, None,
            )
            .responder_id(ocsp.OCSPResponderEncoding.HASH, signer_cert)
        )  # fmt: skip
        if signer_cert is not self.ca:
            builder = builder.certificates([signer_cert])
        return builder.sign(signer_key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def test_a_good_response_from_the_issuer_is_kept_and_refreshed_halfway() -> None:
    pki = Pki()
    assert responder_url(pki.chain) == "http://ocsp.example.test/"
    request = ocsp.load_der_ocsp_request(request_der(pki.chain))
    assert request.serial_number == pki.leaf.serial_number
    answer = check_response(pki.response(), pki.chain, NOW.timestamp())
    assert answer.status == "good"
    # Valid from an hour ago for three days more: asked again halfway, 35.5 hours from now.
    assert refresh_at(answer, NOW.timestamp()) == NOW.timestamp() + 35.5 * 3600
    no_next = check_response(pki.response(next_update=None), pki.chain, NOW.timestamp())
    assert refresh_at(no_next, NOW.timestamp()) == NOW.timestamp() + 12 * 3600


def test_a_delegated_responder_needs_the_issuers_signature_and_ocsp_signing() -> None:
    pki = Pki()
    key = ec.generate_private_key(ec.SECP256R1())
    delegated = certificate("responder", key, (pki.ca, pki.ca_key), ocsp_signing=True)
    ok = pki.response(signer=(delegated, key))
    assert check_response(ok, pki.chain, NOW.timestamp()).status == "good"
    plain = certificate("not a responder", key, (pki.ca, pki.ca_key))
    with pytest.raises(OcspError, match="not for OCSP signing"):
        check_response(pki.response(signer=(plain, key)), pki.chain, NOW.timestamp())
    self_signed = certificate("responder", key, None, ocsp_signing=True)
    with pytest.raises(OcspError, match="does not verify"):
        check_response(pki.response(signer=(self_signed, key)), pki.chain, NOW.timestamp())


@pytest.mark.parametrize(
    ("mangle", "error"),
    [
        (lambda pki: pki.response(leaf=Pki().leaf), "not about serial"),
        (lambda pki: Pki().response(), "not about serial"),
        (
            lambda pki: pki.response(next_update=NOW - datetime.timedelta(minutes=1)),
            "not current",
        ),
        (
            lambda pki: pki.response(this_update=NOW + datetime.timedelta(hours=1)),
            "not current",
        ),
        (
            lambda pki: ocsp.OCSPResponseBuilder.build_unsuccessful(
                ocsp.OCSPResponseStatus.TRY_LATER
            ).public_bytes(serialization.Encoding.DER),
            "TRY_LATER",
        ),
        (lambda pki: b"<html>", "not a DER OCSP response"),
    ],
)
def test_responses_that_are_not_this_certificates_are_refused(
    mangle: Callable[[Pki], bytes], error: str
) -> None:
    pki = Pki()
    with pytest.raises(OcspError, match=error):
        check_response(mangle(pki), pki.chain, NOW.timestamp())


def test_a_response_whose_signature_was_changed_is_refused() -> None:
    pki = Pki()
    forged = bytearray(pki.response())
    forged[-1] ^= 0x01  # the signature's last octet
    with pytest.raises(OcspError, match="does not verify"):
        check_response(bytes(forged), pki.chain, NOW.timestamp())


@asynccontextmanager
async def responder(answer: Callable[[bytes], bytes]) -> AsyncIterator[str]:
    seen: list[bytes] = []

    async def handle(request: web.Request) -> web.Response:
        assert request.content_type == "application/ocsp-request"
        body = await request.read()
        seen.append(body)
        return web.Response(body=answer(body), content_type="application/ocsp-response")

    app = web.Application()
    app.router.add_post("/", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        await runner.cleanup()


def test_refresh_staples_good_renews_revoked_and_retries_the_rest() -> None:
    rng = random.Random(1)

    async def scenario() -> None:
        none = await refresh("web", Pki(ocsp_url=None).chain, 0, 0.0, 5, rng)
        assert (none.answer, none.next_at, none.note) == (None, math.inf, NO_RESPONDER)
        statuses = iter(
            [ocsp.OCSPCertStatus.GOOD, ocsp.OCSPCertStatus.REVOKED, ocsp.OCSPCertStatus.UNKNOWN]
        )
        holder: list[Pki] = []
        async with responder(lambda _: holder[0].response(status=next(statuses))) as url:
            pki = Pki(ocsp_url=url)
            holder.append(pki)
            now = NOW.timestamp()
            good = await refresh("web", pki.chain, 0, now, 5, rng)
            assert good.answer is not None and good.note == "good" and not good.revoked
            assert good.next_at == refresh_at(good.answer, now)
            revoked = await refresh("web", pki.chain, 0, now, 5, rng)
            assert revoked.revoked and revoked.answer is None
            unknown = await refresh("web", pki.chain, 3, now, 5, rng)
            assert unknown.answer is None and not unknown.revoked
            assert "unknown" in unknown.note and now < unknown.next_at <= now + 3600
        # The responder gone: an error, retried with backoff.
        down = await refresh("web", pki.chain, 0, now, 5, rng)
        assert down.answer is None and down.note.startswith("error:")
        assert now < down.next_at <= now + 60

    run_async(scenario(), 30)


def test_a_restarted_origin_fetches_and_sends_a_staple_without_asking_the_ca(
    tmp_path: Path,
) -> None:
    """A stored certificate without a stored response (and ARI off, the CA
    unreachable): the manager fetches the response and sends the certificate
    with it to the edges, without an ACME connection to the CA."""
    sent: list[CertificateSet] = []

    async def edges(kind: int, body: bytes, timeout_s: float) -> list[EdgeReply]:
        message = decode(kind, body)
        assert isinstance(message, CertificateSet)
        sent.append(message)
        return [EdgeReply("edge-1", "c1", "applied")]

    async def scenario() -> None:
        holder: list[Pki] = []
        async with responder(lambda _: holder[0].response()) as url:
            pki = Pki(ocsp_url=url)
            holder.append(pki)
            config = AcmeConfig(
                certificates=(AcmeCertificateConfig("web", ("web.example.com",)),),
                directory_url=f"https://127.0.0.1:{free_port()}/dir",  # nobody: the CA down
                state_dir=tmp_path / "state",
                use_ari=False,
            )
            files = AcmeFiles(config.state_dir, config.directory)
            files.prepare()
            key = pki.leaf_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ).decode()
            files.save_certificate(IssuedCertificate("web", pki.chain, key))
            manager = AcmeManager(config, edges)
            await manager.start()
            try:
                deadline = asyncio.get_running_loop().time() + scaled(10)
                while not sent and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.02)
            finally:
                await manager.close()
            assert sent and sent[0].ocsp is not None
            assert check_response(sent[0].ocsp, pki.chain, NOW.timestamp()).status == "good"
            assert files.ocsp("web") == sent[0].ocsp  # stored for the next start
            assert manager.states["web"].as_json()["ocsp"] == "good"
            assert manager.states["web"].failures == 0  # no attempt at the CA

    run_async(scenario(), 30)
