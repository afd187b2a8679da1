"""``make bench-edge-logic`` in a short run: both front ends serve their
requests through the real exchange and readers, and the figures are written.
It checks the harness, not the figures."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import scaled
from tests.edge_env import run_load_test


def test_short_run_measures_both_front_ends(tmp_path: Path) -> None:
    output = tmp_path / "edge_logic.json"
    args = ("--rounds", "1", "--requests", "200", "--output", str(output))
    run_load_test("loadtests.edge_logic", *args, timeout=scaled(120))
    result = json.loads(output.read_text())
    assert set(result) == {"h1", "h2"}
    for figures in result.values():
        assert figures["cpu_us_per_request"] > 0
        # A request that went through a front end, an exchange and both readers
        # takes hundreds of calls; a harness that served nothing takes a few.
        assert figures["python_calls_per_request"] > 100
    assert result["h2"]["python_calls_per_request"] > result["h1"]["python_calls_per_request"]
