"""The per-connection flood bounds of the HTTP/2 front end (edge/h2_floods.py)."""

from __future__ import annotations

from edge.h2_floods import FLOOD_WINDOW_S, LIMITS, FloodCounters


def test_a_kind_is_over_its_bound_on_the_frame_past_it_and_alone() -> None:
    floods = FloodCounters(now=0.0)
    assert not any(floods.over("pings") for _ in range(LIMITS["pings"]))
    assert floods.over("pings")
    assert not floods.over("settings")


def test_counts_start_again_once_the_window_is_over() -> None:
    floods = FloodCounters(now=100.0)
    for _ in range(LIMITS["resets"]):
        floods.over("resets")
    floods.roll(100.0 + FLOOD_WINDOW_S / 2)  # the same window
    assert floods.over("resets")
    floods.roll(100.0 + FLOOD_WINDOW_S)
    assert floods.window_start == 100.0 + FLOOD_WINDOW_S
    assert not any(floods.over("resets") for _ in range(LIMITS["resets"]))
