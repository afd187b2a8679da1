"""``make bench-edge`` in ``--quick`` mode: the whole harness runs (edge, origin,
HAProxy, Node.js, the handshake client, wrk, 200 WebSockets) and writes sane
figures. It checks the harness, not the targets: those are for the full run on a
quiet machine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.compiled import expected_build_mode
from tests.conftest import scaled
from tests.edge_env import load_test_marks, run_load_test

pytestmark = load_test_marks(wrk=True)

POSITIVE = (
    "handshakes_per_s",
    "haproxy_handshakes_per_s",
    "handshakes_ratio",
    "keepalive_rps",
    "haproxy_keepalive_rps",
    "keepalive_ratio",
    "h2_rps",
    "haproxy_h2_rps",
    "h2_ratio",
    "ws_rss_kib_per_conn",
)


def test_quick_run_writes_every_figure(tmp_path: Path) -> None:
    output = tmp_path / "edge.json"
    printed = run_load_test(
        "loadtests.bench_edge",
        *("--quick", "--output", str(output)),
        timeout=scaled(200),  # about 20 s, plus a first build of the Go client
    )
    result = json.loads(output.read_text())

    for key in POSITIVE:
        assert isinstance(result[key], float | int) and result[key] > 0, (key, result[key])
    # Latency differences may be negative by noise, but must be real numbers.
    assert math.isfinite(result["added_latency_p50_ms"])
    assert result["details"]["latency"]["geoedge"]["p50_ms"] > 0
    assert result["handshakes_ratio"] == pytest.approx(
        result["handshakes_per_s"] / result["haproxy_handshakes_per_s"], rel=1e-2
    )
    assert result["keepalive_ratio"] == pytest.approx(
        result["keepalive_rps"] / result["haproxy_keepalive_rps"], rel=1e-2
    )
    assert set(result["passed"]) == {
        "handshakes_ratio",
        "keepalive_ratio",
        "h2_ratio",
        "added_latency_p50_ms",
        "ws_rss_kib_per_conn",
        "keepalive_edge_cpu_us",
        "keepalive_origin_cpu_us",
    }
    # CPU per request at each hop, for keep-alive and HTTP/2, from /proc.
    for phase in ("keepalive", "h2"):
        assert set(result[f"{phase}_cpu_us_per_request"]) == {"total", "edge", "origin", "node"}
        assert set(result[f"haproxy_{phase}_cpu_us_per_request"]) == {"total", "haproxy", "node"}
        hops = result[f"{phase}_cpu_us_per_request"]
        assert hops["edge"] > 0 and hops["origin"] > 0 and hops["node"] > 0, hops
    assert result["keepalive_edge_cpu_us"] == result["keepalive_cpu_us_per_request"]["edge"]
    assert result["environment"]["build"] == expected_build_mode()
    for chain in ("geoedge", "haproxy"):
        assert result["details"]["websockets"][chain]["held"] == 200, result["details"]
        for phase in ("handshakes", "keepalive"):
            for run in result["details"][phase]["runs"][chain]:
                assert run["errors"] == 0, (phase, chain, run)
    assert "full handshakes/s" in printed  # the table was printed
