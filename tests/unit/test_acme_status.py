"""What the daemons show of their ACME certificates, without a CA: the edge's
held certificates in the fleet-wide expiry metric and table
(geoedge/cert_expiry.py) and in their own table (an expired one stays
listed), and the origin's per-certificate rows (expiry, renewal due, the
edges' answers, the last error)."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from edge.acme_status import HeldCertificates
from edge.acme_store import AcmeStore
from geoedge import pki
from geoedge.cert_expiry import METRIC, CertificateWatch, certificates_table
from origin.acme.config import AcmeCertificateConfig, AcmeConfig
from origin.acme.files import IssuedCertificate
from origin.acme_service import AcmeService
from origin.metrics import ControlMetrics
from tests.conftest import PkiFiles

DAY = 86400.0


def issue(
    test_pki: PkiFiles, tmp: Path, cid: str, names: list[str], days: int
) -> IssuedCertificate:
    paths = pki.issue_server_cert(test_pki.dir / "ca", tmp, cid, names, days=days)
    return IssuedCertificate(cid, paths.cert.read_text(), paths.key.read_text())


def test_the_edge_exports_and_lists_what_its_store_holds(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    store = AcmeStore(tmp_path / "store")
    store.prepare()
    web = issue(test_pki, tmp_path, "web", ["web.example.com", "www.example.com"], 90)
    api = issue(test_pki, tmp_path, "api", ["api.example.com"], 10)
    for cert in (web, api):
        store.save(cert.id, cert.chain, cert.key, b"\x30\x03\x0a\x01\x00", time.time())
    (store.directory / "broken.pem").write_text("not a certificate")
    held = HeldCertificates(store.directory)

    watch = CertificateWatch([], held.expiries)  # as the edge's parent has it
    registry = CollectorRegistry(auto_describe=False)
    registry.register(watch)
    text = generate_latest(registry).decode()
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith(METRIC + "{")
    }
    assert samples == {
        f'{METRIC}{{name="api.example.com",role="served",source="acme:api"}}': api.not_after,
        f'{METRIC}{{name="web.example.com",role="served",source="acme:web"}}': web.not_after,
    }

    # The fleet-wide table lists them too.
    listed = [[c.text for c in row.cells[:3]] for row in certificates_table(watch).rows]
    assert listed == [
        ["served", "api.example.com", "acme:api"],
        ["served", "web.example.com", "acme:web"],
    ]

    table = held.table()
    assert [row.cells[0].text for row in table.rows] == ["api", "web"]  # soonest first
    api_row, web_row = table.rows
    assert web_row.cells[1].text == "web.example.com, www.example.com"
    assert (web_row.cells[3].tone, api_row.cells[3].tone) == ("ok", "warn")
    assert web_row.cells[4].text == f"{web.leaf.serial_number:x}"
    assert web_row.cells[5].text == "yes"  # its OCSP response is stored beside it

    # Past its end it stays listed, as expired (its alert must not resolve).
    later = held.table(now=api.not_after + DAY)
    assert later.rows[0].cells[3].text == "expired" and later.rows[0].cells[3].tone == "bad"

    # A renewal shows at the next read (the file changed).
    renewed = issue(test_pki, tmp_path, "api", ["api.example.com"], 60)
    store.save(renewed.id, renewed.chain, renewed.key, None, time.time() + 1)
    api_row = next(row for row in held.table().rows if row.cells[0].text == "api")
    assert api_row.cells[4].text == f"{renewed.leaf.serial_number:x}"
    assert api_row.cells[5].text == "no"


def test_the_origin_lists_each_certificate_its_renewal_and_its_last_error(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    config = AcmeConfig(
        certificates=(
            AcmeCertificateConfig("web", ("web.example.com",)),
            AcmeCertificateConfig("new", ("new.example.com",)),
        ),
        state_dir=tmp_path / "state",
    )

    async def no_edges(kind: int, body: bytes, timeout_s: float) -> object:
        raise AssertionError("nothing is sent")

    service = AcmeService(config, no_edges, lambda _: None, ControlMetrics())  # type: ignore[arg-type]
    web = service.manager.states["web"]
    web.issued = issue(test_pki, tmp_path, "web", ["web.example.com"], 5)
    web.renew_at = web.issued.not_before + 60 * DAY
    web.failures = 4
    web.last_error = "new order: the CA is unreachable (ConnectionError)"
    web.next_try = time.time() + 600
    web.edges = {"edge-1": "applied", "edge-2": "timeout"}

    table = service.table()
    assert table.columns[:5] == ["id", "names", "expires", "left", "renewal due"]
    web_row, new_row = table.rows
    cells = [cell.text for cell in web_row.cells]
    assert cells[0:2] == ["web", "web.example.com"]
    assert web_row.cells[3].tone == "bad"  # 5 days left
    assert cells[5] == "1/2" and web_row.cells[5].tone == "warn"
    assert cells[6] == "-"  # no OCSP staple: none fetched
    assert "4 failed" in cells[7] and "unreachable" in cells[7]
    assert web_row.cells[7].tone == "bad"
    assert [cell.text for cell in new_row.cells][2:5] == ["not issued yet", "-", "now"]
    assert new_row.cells[7].text == ""
