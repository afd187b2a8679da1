"""``make bench-tls-floor`` in a short run: the do-nothing TLS server, HAProxy and
the geoedge chain all answer full handshakes, and the figures add up. It checks
the harness (and that the floor server really serves TLS), not the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import scaled
from tests.edge_env import load_test_marks, run_load_test

pytestmark = load_test_marks(wrk=False)


def test_short_run_measures_every_chain(tmp_path: Path) -> None:
    output = tmp_path / "tls_floor.json"
    args = ("--rounds", "1", "--seconds", "1", "--output", str(output))
    printed = run_load_test("loadtests.tls_floor", *args, timeout=scaled(200))
    result = json.loads(output.read_text())
    for chain in ("floor", "haproxy", "geoedge"):
        (run,) = result["details"]["runs"][chain]
        assert run["per_s"] > 0 and run["errors"] == 0, (chain, run)
        assert run["server_cpu_us_per_connection"]["total"] > 0, (chain, run)
    geoedge = result["details"]["runs"]["geoedge"][0]["server_cpu_us_per_connection"]
    assert set(geoedge) == {"total", "edge", "origin", "node"}
    assert result["floor_chain_us"] == pytest.approx(
        result["floor_us"] + result["geoedge_origin_us"] + result["geoedge_node_us"], abs=0.2
    )
    assert result["budget_us"] == pytest.approx(result["haproxy_chain_us"] / 0.85, abs=0.2)
    assert "floor + origin + Node" in printed
