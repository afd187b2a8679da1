"""``python -m loadtests.wan.run --quick``: the whole WAN proof, a few samples of each.

Real namespaces and the NFQUEUE delay router, the real Node.js app, HAProxy, the
origin balancer, the edge, the nginx edge, the measuring agent and locust; one
lossy phase (1% on the long links). The samples must
respect physics (none below its floor: a missing handshake or a resumed session
would show up there), the edge must win where handshakes dominate, the files
must be written, and nothing may be left behind. Skipped where the emulator,
HAProxy, Node's modules or the load extras are missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.wan import netns
from loadtests.wan.emulator import unsupported_reason
from loadtests.wan.scenarios import MEASUREMENTS, SCENARIOS

pytestmark = [pytest.mark.harness, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {"p50_ms", "p90_ms", "p99_ms", "floor_ms", "n"}


def skip_reason() -> str | None:
    reason = unsupported_reason()
    if reason is not None:
        return f"WAN emulator unavailable: {reason}"
    for tool in ("haproxy", "nginx"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (make venv installs it)"
    if not (ROOT / "deploy" / "node-app" / "node_modules").is_dir():
        return "deploy/node-app/node_modules missing (make node)"
    for module in ("locust", "matplotlib", "websocket", "websockets"):
        # Looked up, never imported: importing locust monkey-patches threading
        # and signals (gevent) in the pytest process and breaks other tests.
        if importlib.util.find_spec(module) is None:
            return f"{module} not installed (pip install -e '.[load]')"
    return None


def run_module(module: str, *args: str, timeout_s: float) -> tuple[int, str, int]:
    """``python -m module args`` from the checkout, killed after ``timeout_s``:
    (exit status, its output, its PID, which tags the emulator it made)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, output, proc.pid


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("wan")
    args = ["--quick", "--results", str(out), "--loss-rates", "0.01"]
    _, output, pid = run_module("loadtests.wan.run", *args, timeout_s=400)
    return out, pid, output


def test_quick_run_writes_every_measurement_within_physics(
    quick_run: tuple[Path, int, str],
) -> None:
    out, _, output = quick_run
    assert "speedup" in output, output[-3000:]
    results = json.loads((out / "wan.json").read_text())
    for scenario in SCENARIOS:
        for key in MEASUREMENTS:
            row = results[scenario][key]
            assert set(row) >= FIELDS, (scenario, key, row)
            assert row["n"] >= 1 and row["failed"] == 0, (scenario, key, row)
            assert row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
            # Propagation is a hard floor; the emulator only ever adds to it.
            assert min(row["samples_ms"]) >= row["floor_ms"] - 0.5, (scenario, key, row)
    # The lossy phase measured what it says, every body whole (a short or wrong
    # body is a failed sample), nothing below physics, the loss really applied.
    phase = results["lossy"]["loss_1%"]
    assert phase["loss"] == 0.01
    assert {"new_small_tls13", "new_large_tls13", "ws_echo_tls13"} <= set(phase["measured"])
    for scenario in SCENARIOS:
        for key in phase["measured"]:
            row = phase[scenario][key]
            assert row["n"] >= 1 and row["failed"] == 0, (scenario, key, row)
            assert min(row["samples_ms"]) >= row["floor_ms"] - 0.5, (scenario, key, row)
    links = results["config"]["emulator"]["links"]
    assert links["edge>origin"]["dropped_loss"] + links["origin>edge"]["dropped_loss"] > 0
    # Every Connection: close body arrived whole (a short one is a failed sample,
    # above), and the edge logged exactly the octets each client received.
    check = results["config"]["edge_access_log_check"]
    assert check["samples"] >= 2 and check["matched"] == check["samples"], check
    direct, edge = results["direct"], results["edge"]
    assert direct["new_small_tls13"]["floor_ms"] == pytest.approx(795.5)
    assert edge["new_small_tls13"]["floor_ms"] == pytest.approx(295.5)
    # Where handshakes dominate, the edge wins by more than the seed's 2.37x.
    assert results["speedup_p50"]["new_small_tls13"] > 2.37, results["speedup_p50"]
    assert results["speedup_p50"]["new_small_tls12"] > 3.0, results["speedup_p50"]
    # Small requests come close to their floors (a few ms of overhead, not round trips).
    for scenario in SCENARIOS:
        for key in ("new_small_tls13", "keepalive_small", "ws_echo_tls13"):
            row = results[scenario][key]
            assert row["p50_ms"] < row["floor_ms"] + 40, (scenario, key, row)


def test_quick_run_writes_chart_and_locust_csvs_and_cleans_up(
    quick_run: tuple[Path, int, str],
) -> None:
    out, pid, output = quick_run
    assert (out / "wan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "wan.json").read_text())
    for scenario in SCENARIOS:
        stats = (out / f"locust_{scenario}_stats.csv").read_text()
        assert "visit /" in stats and "open" in stats, stats
        requests = results["locust"][scenario]["requests"]
        assert requests["GET visit /"]["requests"] >= 1, requests
        assert requests["Aggregated"]["failures"] == 0, requests
    # The emulator instance of the run (tagged by its PID) is gone with its processes.
    assert not [ns for ns in netns.namespaces() if ns.startswith(f"gewan-{pid}n")], output[-2000:]
