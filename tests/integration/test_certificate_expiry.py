"""Certificate lifetimes as a metric, on the status page and in the alerts (issue 28).

A real edge serves a certificate 10 days from expiry: its ``/metrics`` says
when every certificate it serves or trusts expires (served, tunnel,
tunnel_ca), its status page shows the 10 days as a warning, and the series
it exported, fed to ``promtool test rules``, fires GeoedgeCertificateExpiresSoon
(and a 60-day one does not). The origin lists its own tunnel certificate and CA.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from geoedge import pki
from tests.conftest import PkiFiles, scaled
from tests.edge_env import edge_stack, node_available

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
METRIC = "geoedge_certificate_expiry_timestamp_seconds"
_SAMPLE = re.compile(rf"^{METRIC}{{(?P<labels>[^}}]*)}} (?P<value>\S+)$", re.MULTILINE)


def get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(10))
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def expiries(port: int) -> dict[tuple[str, str, str], float]:
    found = {}
    for match in _SAMPLE.finditer(get(port, "/metrics").decode()):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        found[(labels["role"], labels["name"], labels["source"])] = float(match.group("value"))
    return found


def certificates_table(port: int) -> list[list[dict[str, Any]]]:
    page = json.loads(get(port, "/status.json"))
    [table] = [t for t in page["tables"] if t["title"] == "Certificates"]
    return [row["cells"] for row in table["rows"]]


def test_a_certificate_ten_days_from_expiry_shows_and_fires_its_alert(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    short = pki.issue_server_cert(
        test_pki.dir / "ca", tmp_path, "short", ["localhost", "127.0.0.1"], days=10
    )
    (tmp_path / "stack").mkdir()
    with edge_stack(test_pki, tmp_path / "stack", certificate=short) as stack:
        now = time.time()
        found = expiries(stack.admin_port)
        served = found[("served", "localhost", str(short.cert))]
        assert 9.9 < (served - now) / 86400 <= 10.0
        tunnel = found[("tunnel", "edge/edge-1", str(test_pki.edge.cert))]
        assert (tunnel - now) / 86400 > 800  # 825 days
        [(_, ca_name, _)] = [key for key in found if key[0] == "tunnel_ca"]
        assert ca_name == "geoedge private CA"

        rows = certificates_table(stack.admin_port)
        first = rows[0]  # soonest first
        assert [c["text"] for c in first[:3]] == ["served", "localhost", str(short.cert)]
        assert (first[4]["text"], first[4]["tone"]) == ("10 days", "warn")
        assert {row[0]["text"] for row in rows} == {"served", "tunnel", "tunnel_ca"}
        assert all(row[4]["tone"] == "ok" for row in rows[1:])

        origin = expiries(stack.origin_admin_port)
        assert {role for role, _, _ in origin} == {"tunnel", "tunnel_ca"}
        assert ("tunnel", "origin/origin-1", str(test_pki.origin.cert)) in origin

    if shutil.which("promtool") is None:
        pytest.skip("promtool: Debian's prometheus package (make test)")
    # The series as scraped, at promtool's time 0 = the moment of the scrape.
    left = {key: value - now for key, value in found.items()}
    series = "\n".join(
        f'      - series: \'{METRIC}{{instance="edge-test",role="{r}",name="{n}",'
        f'source="{s}"}}\'\n        values: "{value:.0f}x30"'
        for (r, n, s), value in left.items()
    )
    test_file = tmp_path / "expiry.test.yml"
    test_file.write_text(
        f"""rule_files:
  - {MONITORING / "alerts.yml"}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
{series}
    alert_rule_test:
      - eval_time: 15m
        alertname: GeoedgeCertificateExpiresSoon
        exp_alerts:
          - exp_labels:
              severity: warning
              instance: edge-test
              role: served
              name: localhost
              source: "{short.cert}"
            exp_annotations:
              summary: "The served certificate localhost on edge-test expires in 10.0 days"
              description: >-
                {short.cert}. ACME certificates (source acme:ID): the origin renews
                them; geoedge acme status on the origin says why it has not
                (GeoedgeAcmeRenewalFailing fired weeks ago). Served certificates from
                files: renew and install them, then systemctl reload. Tunnel
                certificates: geoedge pki renew, then a restart; the CA:
                docs/operations.md, "Rotate the CA".
      - eval_time: 15m
        alertname: GeoedgeCertificateExpiresVerySoon
        exp_alerts: []
"""
    )
    result = subprocess.run(
        ["promtool", "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
