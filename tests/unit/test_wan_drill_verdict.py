"""``make drill``'s verdicts (loadtests/wan/drill.py): which hop the status pages point at.

Pure: the figures are what the drill reads from both pages. The lossy case's
figures are the ones the drill recorded at 1% loss on the tunnel's path
(loadtests/results/drill.json), where the RTT's p95 rose too (a lost PING is
answered a retransmission later), so the retransmits must be read first.
"""

from __future__ import annotations

from typing import Any

from loadtests.wan.drill import percent, verdict

BASE: dict[str, Any] = {
    "edge_rtt_p95_ms": 298.0,
    "edge_first_byte_p95_ms": 298.0,
    "edge_retransmitted_pct": 0.0,
    "origin_retransmitted_pct": 0.0,
    "origin_backend_state": "up",
    "origin_first_byte_p95_ms": 17.0,
}


def test_a_lossy_tunnel_path_is_told_apart_from_a_slow_one() -> None:
    lossy = {**BASE, "edge_rtt_p95_ms": 375.0, "edge_retransmitted_pct": 0.81,
             "origin_retransmitted_pct": 1.9, "origin_first_byte_p95_ms": 9.5}  # fmt: skip
    said = verdict(BASE, lossy)
    assert said.startswith("the tunnel path loses packets (1.90%"), said
    slow = {**BASE, "edge_rtt_p95_ms": 395.0, "origin_first_byte_p95_ms": 9.6}
    assert verdict(BASE, slow).startswith("the tunnel path (RTT +97 ms"), verdict(BASE, slow)


def test_a_slow_backend_and_a_quiet_path_are_not_called_lossy() -> None:
    slow_node = {**BASE, "origin_first_byte_p95_ms": 248.0, "edge_first_byte_p95_ms": 496.0}
    assert verdict(BASE, slow_node).startswith("Node"), verdict(BASE, slow_node)
    # A retransmit now and then (below 0.1%) is not a lossy path.
    quiet = {**BASE, "edge_retransmitted_pct": 0.02, "origin_retransmitted_pct": 0.05}
    assert verdict(BASE, quiet) == "nothing changed"


def test_status_page_ratios_are_read_as_percentages() -> None:
    assert percent("1.90 %") == 1.9
    assert percent("0.05 %") == 0.05
    assert percent("-") is None
