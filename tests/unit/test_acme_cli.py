"""``geoedge acme status`` and ``geoedge acme renew --force`` against a real
admin listener serving the origin's ACME routes (:class:`origin.acme_service.AcmeService`,
its manager's state set by hand, its CA a closed port): what they print,
their exit status, and where they find the admin. The renewal that succeeds
is in tests/integration/test_acme_renewal.py (through Pebble, under load)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from geoedge import cli, devstack, pki
from geoedge.acme_cli import admin_address
from geoedge.admin import AdminServer
from origin.acme.config import AcmeCertificateConfig, AcmeConfig
from origin.acme.files import IssuedCertificate
from origin.acme_service import AcmeService
from origin.config import AdminConfig
from origin.metrics import ControlMetrics
from tests.conftest import PkiFiles
from tests.tunnel_env import free_port


@contextlib.contextmanager
def origin_admin(service: AcmeService) -> Iterator[str]:
    """An admin listener with the ACME routes, on its own loop in a thread."""
    loop = asyncio.new_event_loop()
    admin = AdminServer("127.0.0.1:0", health=lambda: (True, {}), routes=service.routes())
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(admin.start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(admin.close())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"127.0.0.1:{admin.port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture
def service(test_pki: PkiFiles, tmp_path: Path) -> AcmeService:
    config = AcmeConfig(
        certificates=(
            AcmeCertificateConfig("web", ("web.example.com", "www.example.com")),
            AcmeCertificateConfig("api", ("api.example.com",)),
        ),
        directory_url=f"https://127.0.0.1:{free_port()}/dir",  # nobody listens: the CA is down
        state_dir=tmp_path / "state",
        retry_base_s=60.0,
    )

    async def no_edges(kind: int, body: bytes, timeout_s: float) -> object:
        raise AssertionError("nothing reaches the edges in these tests")

    service = AcmeService(config, no_edges, lambda _: None, ControlMetrics())  # type: ignore[arg-type]
    service.manager.files.prepare()
    paths = pki.issue_server_cert(
        test_pki.dir / "ca", tmp_path, "web", ["web.example.com", "www.example.com"], days=80
    )
    web = service.manager.states["web"]
    web.issued = IssuedCertificate("web", paths.cert.read_text(), paths.key.read_text())
    web.renew_at = time.time() + 50 * 86400
    web.edges = {"edge-1": "applied", "edge-2": "timeout"}
    return service


def test_status_shows_each_certificate_its_expiry_edges_and_errors(
    service: AcmeService, capsys: pytest.CaptureFixture[str]
) -> None:
    with origin_admin(service) as address:
        assert cli.main(["acme", "status", "--admin", address]) == 0
        out = capsys.readouterr().out
        web, api = out.split("\n\n")[1:]
        assert web.startswith("web: web.example.com, www.example.com")
        assert "(80.0 days left)" in web or "(79.9 days left)" in web
        assert "edges: edge-1 applied, edge-2 timeout" in web
        assert api.strip().splitlines() == ["api: api.example.com", "  not issued yet"]

        assert cli.main(["acme", "status", "--admin", address, "--json"]) == 0
        answer = json.loads(capsys.readouterr().out)
        assert [c["id"] for c in answer["certificates"]] == ["web", "api"]


def test_renew_force_reports_the_attempt_and_fails_when_it_fails(
    service: AcmeService, capsys: pytest.CaptureFixture[str]
) -> None:
    with origin_admin(service) as address:
        # Without --force: renewal is automatic; nothing is asked of the origin.
        assert cli.main(["acme", "renew", "--admin", address]) == 2
        assert "--force" in capsys.readouterr().err
        assert service.manager.states["web"].failures == 0

        assert cli.main(["acme", "renew", "--force", "--id", "web", "--admin", address]) == 1
        out = capsys.readouterr().out
        assert out.startswith("web: web.example.com")
        assert "FAILING: 1 attempt(s) in a row" in out and "unreachable" in out
        assert service.manager.states["web"].failures == 1
        assert service.manager.states["api"].failures == 0  # only the one asked for

        assert cli.main(["acme", "renew", "--force", "--id", "nope", "--admin", address]) == 1
        assert "no certificate 'nope'" in capsys.readouterr().err


def test_the_admin_address_comes_from_the_flag_the_config_or_the_default(
    test_pki: PkiFiles, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "origin.toml"
    config.write_text(
        devstack.origin_toml(
            test_pki,
            origin_id="origin-1",
            tunnel_port=free_port(),
            admin_port=4321,
            allowed_identities=["edge-1"],
            backends=[free_port()],
        )
    )
    assert admin_address("10.0.0.1:1", config) == "10.0.0.1:1"
    assert admin_address(None, config) == "127.0.0.1:4321"
    if not Path("/etc/geoedge/origin.toml").exists():
        assert admin_address(None, None) == AdminConfig().address
    # A config that does not load names the file and the key, and nothing is asked.
    config.write_text(config.read_text() + '\n[admn]\naddress = "127.0.0.1:1"\n')
    assert cli.main(["acme", "status", "--config", str(config)]) == 1
    error = capsys.readouterr().err
    assert str(config) in error and "admn" in error
    # Nobody at the address: said so.
    port = free_port()
    assert cli.main(["acme", "status", "--admin", f"127.0.0.1:{port}"]) == 1
    assert f"cannot reach the origin's admin at 127.0.0.1:{port}" in capsys.readouterr().err
