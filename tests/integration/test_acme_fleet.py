"""Two edges and one origin against Pebble: the origin runs ACME, the edges
answer the challenges it sends them over the tunnels and serve what it issues
(tests/acme_fleet_env.py has the layout).

The HTTP-01 name is pointed at edge B and the TLS-ALPN-01 name at edge A:
the origin sends every challenge to every edge, so whichever edge the CA
reaches answers. The wildcard goes through DNS-01 (challtestsrv as the
provider)."""

from __future__ import annotations

import http.client
import json
import stat
from pathlib import Path

from tests.acme_fleet_env import EDGES, acme_fleet, handshake_serial
from tests.conftest import PkiFiles, scaled

CERTIFICATES = """
[[acme.certificates]]
id = "web"
domains = ["web.geoedge.test"]
challenge_types = ["http-01"]
[[acme.certificates]]
id = "alpn"
domains = ["alpn.geoedge.test"]
challenge_types = ["tls-alpn-01"]
[[acme.certificates]]
id = "wild"
domains = ["*.wild.geoedge.test"]
"""


def admin_get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(10))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200, (path, response.status)
        return response.read()
    finally:
        conn.close()


def status_rows(port: int, title: str) -> list[list[str]]:
    """The cells' text of one table of a daemon's /status.json."""
    page = json.loads(admin_get(port, "/status.json"))
    table = next(t for t in page["tables"] if t["title"] == title)
    return [[cell["text"] for cell in row["cells"]] for row in table["rows"]]


def test_two_edges_answer_every_challenge_and_serve_the_issued_chains(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with acme_fleet(test_pki, tmp_path) as fleet:
        fleet.ca.point("web.geoedge.test", "127.0.0.3")  # HTTP-01 lands on edge B
        fleet.ca.point("alpn.geoedge.test", "127.0.0.2")  # TLS-ALPN-01 on edge A
        for name in EDGES:
            fleet.start_edge(name)
        fleet.start_origin(CERTIFICATES)
        serials = {cid: fleet.wait_applied(cid, ("a", "b"), 120) for cid in ("web", "alpn", "wild")}
        root = fleet.ca.root_pem()
        for edge in EDGES:
            for cid, name in (
                ("web", "web.geoedge.test"),
                ("alpn", "alpn.geoedge.test"),
                ("wild", "x.wild.geoedge.test"),
            ):
                # Verifies up to Pebble's root, and is the one the origin holds.
                served = handshake_serial(fleet.address(edge), fleet.https, name, root)
                assert served == serials[cid], (edge, name)

        # What the status pages and the metrics say: the origin's rows, and each
        # edge's certificates with their expiry (the fleet-wide family).
        origin_rows = status_rows(fleet.origin_admin, "ACME certificates")
        assert {row[0] for row in origin_rows} == {"web", "alpn", "wild"}
        assert all(row[2] != "not issued yet" and row[5] == "2/2" for row in origin_rows)
        for edge, port in fleet.edge_admins.items():
            rows = status_rows(port, "ACME certificates")
            assert {row[0]: row[4] for row in rows} == {c: f"{s:x}" for c, s in serials.items()}
            metrics = admin_get(port, "/metrics").decode()
            for cid in serials:
                not_after = fleet.certificate(cid)["not_after_ts"]
                domain = fleet.certificate(cid)["domains"][0]
                series = (
                    "geoedge_certificate_expiry_timestamp_seconds"
                    f'{{name="{domain}",role="served",source="acme:{cid}"}} '
                )
                line = next(x for x in metrics.splitlines() if x.startswith(series))
                assert float(line.split(" ")[1]) == not_after, (edge, line)

        code, output = fleet.geoedge_acme("status", "--admin", fleet.admin_address)
        assert code == 0, output
        for cid, serial in serials.items():
            block = next(b for b in output.split("\n\n") if b.startswith(f"{cid}: "))
            assert f"serial {serial:x}" in block and "days left" in block, block
            assert "edges: edge-1 applied, edge-2 applied" in block, block
            assert "FAILING" not in block

        # No private key readable by others, on the origin or on the edges.
        for directory in (fleet.state, *fleet.stores.values()):
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
            for path in directory.rglob("*"):
                if path.is_file():
                    assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
