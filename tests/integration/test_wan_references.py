"""``make cold-burst`` and ``make zero-delay``, one short run each: their
figures must respect physics (nothing under its floor on the WAN; with
every delay 0 well under what the WAN takes), the cold bursts must not
trail the steady ones by a long round trip (the first burst after a start
or reload once waited one behind a collapsed request), and no namespace
may be left behind. Skipped where ``make wan``'s stack cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.wan import netns
from tests.integration.test_wan_quick import run_module, skip_reason

pytestmark = [pytest.mark.harness, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
#: The emulated long link's round trip: a request that waited behind another's
#: fetch paid this much more than one that did not.
LONG_RTT_MS = 265.0


def run_script(module: str, results: Path, *args: str) -> tuple[int, str, int]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return run_module(module, "--results", str(results), *args, timeout_s=380)


def test_cold_bursts_are_as_fast_as_steady_ones_and_above_their_floor(tmp_path: Path) -> None:
    results = tmp_path / "cold_burst.json"
    code, output, pid = run_script("loadtests.cold_burst", results, "--rounds", "1")
    assert code in (0, 1), output[-3000:]  # 1: the 30 ms bar missed, the run complete
    cases = json.loads(results.read_text())["cases"]
    for tls in ("13", "12"):
        steady = cases[f"steady_tls{tls}"]["p50_ms"]
        for case in ("after_start", "after_reload", "steady"):
            row = cases[f"{case}_tls{tls}"]
            assert row["samples"] == 20 and row["over_floor_ms"] > 0, (case, row)
            assert row["p50_ms"] < steady + LONG_RTT_MS / 2, (case, row, steady)
        assert cases[f"zero_delay_tls{tls}"]["p50_ms"] < steady - LONG_RTT_MS, cases
    assert not [ns for ns in netns.namespaces() if f"reload{pid}" in ns], output[-2000:]


def test_zero_delay_pages_take_less_than_the_wan_and_the_wan_its_floor(tmp_path: Path) -> None:
    results = tmp_path / "zero_delay.json"
    code, output, pid = run_script("loadtests.zero_delay", results, "--count", "2")
    assert code == 0, output[-3000:]
    cases = json.loads(results.read_text())["cases"]
    assert set(cases) == {
        f"{s}/{p}" for s in ("edge", "nginx") for p in ("page30_cached_tls13", "page30_tls13")
    }
    for name, row in cases.items():
        assert row["p50_ms"] > row["floor_ms"], (name, row)
        assert 0 < row["zero_delay_p50_ms"] < row["p50_ms"], (name, row)
    # The cached page is the edge's own: no long round trip in it.
    assert cases["edge/page30_cached_tls13"]["p50_ms"] < LONG_RTT_MS, cases
    assert not [ns for ns in netns.namespaces() if f"zd{pid}" in ns], output[-2000:]
