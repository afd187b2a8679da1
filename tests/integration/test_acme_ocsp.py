"""OCSP for ACME certificates, where the CA offers it: Pebble names a
responder in what it issues (tests/acme_env.py's, signing with Pebble's
intermediate key), the origin fetches the response and sends it with the
certificate, and the edge staples it, as ``openssl s_client -status`` sees.
Let's Encrypt itself names no responder since May 2025; the other fleet
tests, whose Pebble names none, show nothing is fetched then."""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.acme_env import OcspResponder
from tests.acme_fleet_env import WEB, WEB_CERTIFICATE, acme_fleet
from tests.conftest import PkiFiles, scaled
from tests.tunnel_env import free_port

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")


def s_client_status(address: str, port: int, root: Path) -> str:
    """What ``openssl s_client -status`` shows of the edge's staple for WEB."""
    done = subprocess.run(
        ["openssl", "s_client", "-connect", f"{address}:{port}", "-servername", WEB,
         "-status", "-CAfile", str(root), "-verify_return_error"],
        input="", capture_output=True, text=True, timeout=scaled(20), check=False,
    )  # fmt: skip
    assert "Verify return code: 0 (ok)" in done.stdout, done.stdout + done.stderr
    return done.stdout


def test_the_origin_fetches_the_ocsp_response_and_the_edges_staple_it(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    ocsp_port = free_port()
    with acme_fleet(test_pki, tmp_path, ocsp_url=f"http://127.0.0.1:{ocsp_port}/") as fleet:
        responder = OcspResponder(fleet.ca, ocsp_port)
        try:
            fleet.ca.point(WEB, "127.0.0.2")
            fleet.start_edge("a")
            fleet.start_origin(WEB_CERTIFICATE)
            serial = fleet.wait_applied("web", ("a",), 120)
            entry = fleet.certificate("web")
            assert entry["ocsp"] == "good" and entry["ocsp_next_update"], entry
            assert responder.answered >= 1

            root = tmp_path / "pebble-root.pem"
            root.write_text(fleet.ca.root_pem())
            shown = s_client_status(fleet.address("a"), fleet.https, root)
            assert "OCSP Response Status: successful" in shown, shown
            assert "Cert Status: good" in shown, shown
            stapled = re.search(r"Serial Number: ([0-9A-F]+)", shown)
            assert stapled is not None and int(stapled.group(1), 16) == serial, shown

            # Stored beside the certificate on both hosts, readable by the owner only.
            for path in (
                fleet.state / "certificates" / "web.ocsp",
                fleet.stores["a"] / "web.ocsp",
            ):
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path

            # `geoedge acme status` says so.
            code, output = fleet.geoedge_acme("status", "--admin", fleet.admin_address)
            assert code == 0 and "  OCSP: good until " in output, output
        finally:
            responder.close()
