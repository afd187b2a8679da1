"""``make soak`` in ``--quick`` mode (~20 s): the whole harness runs (Node.js
backends, origin, edge, WebSocket cycles and every kind of short connection,
the sampler, the memory reports) and writes its report. It judges what a short
run can: no connection failed, every class of both daemons is back to its
warm-up count of live instances (counted before any collection), descriptors
and tasks are back too. The RSS drift is reported but judged only by the full
run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import scaled
from tests.edge_env import node_available, run_load_test

pytestmark = [
    pytest.mark.harness,
    pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed"),
    pytest.mark.timeout(scaled(180)),
]


def test_quick_soak_gives_everything_back(tmp_path: Path) -> None:
    output = tmp_path / "soak.json"
    printed = run_load_test(
        "loadtests.soak", "--quick", "--results", str(output), timeout=scaled(150)
    )
    result = json.loads(output.read_text())

    cycles = result["cycles"]
    assert len(cycles) == 3
    for cycle in cycles:
        assert cycle["failed"] == 0, printed
        assert cycle["websockets_ok"] == result["settings"]["websockets"]
        assert cycle["short_ok"] == result["settings"]["short"]
    # A quick run does not judge the RSS drift (None: not judged), but reports it
    # as the full run computes it: the last cycle's idle RSS against the first's.
    assert result["passed"] == {"drift": None, "no_failures": True, "census": True}
    for name in ("edge", "origin"):
        first, last = (cycles[i]["idle_rss_kib"][name] for i in (0, -1))
        assert first > 0 and last > 0, cycles
        assert result["drift_pct"][name] == round(100.0 * (last - first) / first, 2)
    for name in ("edge", "origin"):
        # Descriptors: the same after the last cycle as after the first; tasks
        # (from the memory reports: the gauge may be 10 s old) as after the warm-up.
        assert cycles[-1]["idle_fds"][name] == cycles[0]["idle_fds"][name], name
        tasks = result["tasks"][name]
        assert tasks["at_end"] == tasks["after_warmup"], (name, tasks)
        assert result["census_growth"][name] == {}, result["census_growth"]
        assert result["unreachable_at_end"][name] < 100
    assert {"edge_rss_kib", "origin_rss_kib", "edge_tasks", "origin_fds"} <= set(
        result["samples"][0]
    )
