"""``make bench-edge-logic`` in a short run: both front ends serve their
requests through the real exchange and readers (and HTTP/1.1 from the cache),
and the figures are written, for the pure-Python build and (where this run is
compiled) the compiled one.
It checks the harness, not the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.compiled import expected_build_mode
from tests.conftest import scaled
from tests.edge_env import run_load_test

pytestmark = pytest.mark.harness


def test_short_run_measures_both_front_ends(tmp_path: Path) -> None:
    output = tmp_path / "edge_logic.json"
    args = ("--rounds", "1", "--requests", "200", "--output", str(output))
    run_load_test("loadtests.edge_logic", *args, timeout=scaled(120))
    results = json.loads(output.read_text())
    assert set(results) == {expected_build_mode(), "pure Python"}
    for result in results.values():
        assert set(result) == {"h1", "h2", "h1_hit"}
        assert all(figures["cpu_us_per_request"] > 0 for figures in result.values())
    # A request that went through a front end, an exchange and both readers
    # takes hundreds of Python calls; a harness that served nothing takes a
    # few. (Compiled functions are not counted: only the pure build is checked.)
    pure = results["pure Python"]
    assert pure["h1"]["python_calls_per_request"] > 100
    assert pure["h2"]["python_calls_per_request"] > pure["h1"]["python_calls_per_request"]
    # A hit skips the exchange and the tunnel: fewer calls than a request that went up.
    assert 10 < pure["h1_hit"]["python_calls_per_request"] < pure["h1"]["python_calls_per_request"]
