"""``make bench-request-floor`` in a short run: the byte-moving floor chain,
HAProxy and the geoedge chain all answer keep-alive requests, and the figures
add up. It checks the harness (and that the floor really carries requests to
Node.js and back over its multiplexed TLS link), not the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import scaled
from tests.edge_env import load_test_marks, run_load_test

pytestmark = load_test_marks(wrk=True)


def test_short_run_measures_every_chain(tmp_path: Path) -> None:
    output = tmp_path / "request_floor.json"
    args = ("--rounds", "1", "--seconds", "1", "--output", str(output))
    printed = run_load_test("loadtests.request_floor", *args, timeout=scaled(200))
    result = json.loads(output.read_text())
    for chain, processes in (
        ("floor", {"edge", "origin", "node"}),
        ("haproxy", {"haproxy", "node"}),
        ("geoedge", {"edge", "origin", "node"}),
    ):
        (run,) = result["details"]["runs"][chain]
        assert run["per_s"] > 0 and run["errors"] == 0, (chain, run)
        per_request = run["server_cpu_us_per_request"]
        assert set(per_request) == {"total", *processes}, (chain, run)
        assert per_request["total"] > 0 and all(v > 0 for v in per_request.values()), run
    assert result["logic_edge_us"] == pytest.approx(
        result["geoedge_edge_us"] - result["floor_edge_us"], abs=0.2
    )
    assert result["budget_us"] == pytest.approx(result["haproxy_chain_us"] / 0.42, abs=0.2)
    assert "floor chain (two byte-moving hops + Node)" in printed
