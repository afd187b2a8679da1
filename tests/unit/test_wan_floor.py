"""The physical floors of ``make wan`` (loadtests.wan.scenarios): pure arithmetic on delays."""

from __future__ import annotations

import pytest

from loadtests.wan.scenarios import (
    MEASUREMENTS,
    SCENARIOS,
    PathRtts,
    floor_ms,
    handshake_round_trips,
    path_rtts,
    percentile,
    summarize,
)
from loadtests.wan.topology import build_links, rtt_ms

#: The keys the issue asks for in wan.json.
KEYS = {
    "new_small_tls13", "new_small_tls12", "new_large_tls13", "idle30_large_tls13",
    "close_large_tls13", "close_large_tls12",
    "keepalive_small", "ws_open_tls13", "ws_echo_tls13", "burst20_small_tls13",
    "first_burst20_small_tls13", "loss1_small_tls13",
    "first_large_tls13", "page30_tls13", "page30_h1_tls13",
    "page30_cached_tls13", "page30_swr_tls13",  # the edge's cache (issue 30)
}  # fmt: skip


def delays(**overrides: float) -> dict[tuple[str, str], float]:
    return {pair: p.delay_ms for pair, p in build_links(overrides or None).items()}


def floors(scenario: str, one_way: dict[tuple[str, str], float]) -> dict[str, float]:
    rtts = path_rtts(SCENARIOS[scenario], one_way)
    return {key: floor_ms(m, rtts) for key, m in MEASUREMENTS.items()}


def test_the_measurements_are_the_ones_the_issue_names() -> None:
    assert set(MEASUREMENTS) == KEYS
    assert {m.tls for k, m in MEASUREMENTS.items() if k.endswith("tls12")} == {"1.2"}


def test_default_path_round_trips() -> None:
    direct = path_rtts(SCENARIOS["direct"], delays())
    edge = path_rtts(SCENARIOS["edge"], delays())
    assert direct == PathRtts(client_ms=265.0, upstream_ms=0.0, backend_ms=0.5)
    assert edge == PathRtts(client_ms=10.0, upstream_ms=265.0, backend_ms=0.5)
    # The same numbers as the emulator's own floor_ms (its rtt_ms).
    links = build_links()
    assert direct.client_ms == rtt_ms(links, "user", "origin")
    assert edge.client_ms == rtt_ms(links, "user", "edge")
    assert edge.upstream_ms == rtt_ms(links, "edge", "origin")


def test_default_floors_direct() -> None:
    f = floors("direct", delays())
    # TCP + TLS 1.3 + request: three long round trips and the app's.
    assert f["new_small_tls13"] == pytest.approx(3 * 265 + 0.5)
    assert f["new_small_tls12"] == pytest.approx(4 * 265 + 0.5)
    assert f["keepalive_small"] == f["ws_echo_tls13"] == pytest.approx(265.5)
    assert f["ws_open_tls13"] == pytest.approx(795.5)


def test_default_floors_edge() -> None:
    f = floors("edge", delays())
    # Two short handshakes, then one short + one long + the app's round trip.
    assert f["new_small_tls13"] == pytest.approx(10 + 10 + (10 + 265 + 0.5))
    assert f["new_small_tls12"] == pytest.approx(10 + 20 + (10 + 265 + 0.5))
    assert f["keepalive_small"] == f["ws_echo_tls13"] == pytest.approx(275.5)
    assert f["ws_open_tls13"] == pytest.approx(295.5)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_large_bursts_and_loss_share_the_small_new_connection_floor(scenario: str) -> None:
    f = floors(scenario, delays())
    same = ("new_large_tls13", "idle30_large_tls13", "burst20_small_tls13",
            "first_burst20_small_tls13", "loss1_small_tls13", "first_large_tls13")  # fmt: skip
    assert {f[key] for key in same} == {f["new_small_tls13"]}


def test_a_page_over_six_http1_connections_pays_five_request_round_trips() -> None:
    direct, edge = floors("direct", delays()), floors("edge", delays())
    # Two short handshakes, the requests, and one more short round of slow start
    # for 30 KB of responses on one connection.
    assert edge["page30_tls13"] == pytest.approx(10 + 10 + (10 + 265 + 0.5) + 10)
    assert direct["page30_tls13"] == pytest.approx(265 + 265 + 265.5 + 265)
    assert edge["page30_h1_tls13"] == pytest.approx(10 + 10 + 5 * (10 + 265 + 0.5))
    assert direct["page30_h1_tls13"] == pytest.approx(2 * 265 + 5 * 265.5)
    # One h2 connection through the edge against six HTTP/1.1 ones direct.
    assert direct["page30_h1_tls13"] / edge["page30_tls13"] > 6


def test_a_cached_page_through_the_edge_pays_the_user_s_round_trips_alone() -> None:
    direct, edge = floors("direct", delays()), floors("edge", delays())
    # TCP, TLS 1.3, the requests and one round of slow start: all on the short link.
    assert edge["page30_cached_tls13"] == pytest.approx(4 * 10)
    assert edge["page30_swr_tls13"] == edge["page30_cached_tls13"]
    assert direct["page30_cached_tls13"] == direct["page30_tls13"]  # HAProxy caches nothing


def test_the_floor_ratio_beats_the_seed_only_where_handshakes_are_involved() -> None:
    direct, edge = floors("direct", delays()), floors("edge", delays())
    assert direct["new_small_tls13"] / edge["new_small_tls13"] > 1322 / 557
    assert direct["new_small_tls12"] / edge["new_small_tls12"] > 3.4
    # On an open connection the edge's detour costs its short round trip.
    assert edge["keepalive_small"] - direct["keepalive_small"] == pytest.approx(10.0)


def test_floors_follow_asymmetric_and_changed_delays() -> None:
    one_way = delays(**{"user>edge": 20.0, "edge>user": 2.0, "edge-origin": 50.0})
    rtts = path_rtts(SCENARIOS["edge"], one_way)
    assert rtts.client_ms == pytest.approx(22.0)
    assert rtts.upstream_ms == pytest.approx(100.0)
    f = floors("edge", one_way)
    assert f["new_small_tls12"] == pytest.approx(3 * 22 + 22 + 100 + 0.5)
    # The direct path does not cross the edge: unchanged.
    assert floors("direct", one_way)["new_small_tls13"] == pytest.approx(795.5)


def test_missing_delay_and_unknown_tls_version_are_named() -> None:
    one_way = delays()
    del one_way[("app", "origin")]
    with pytest.raises(ValueError, match="app"):
        path_rtts(SCENARIOS["direct"], one_way)
    with pytest.raises(ValueError, match=r"1\.1"):
        handshake_round_trips("1.1")  # type: ignore[arg-type]


def test_percentiles_interpolate_like_numpy() -> None:
    values = [10.0, 40.0, 20.0, 30.0]
    assert percentile(values, 50) == pytest.approx(25.0)
    assert percentile(values, 90) == pytest.approx(37.0)
    assert percentile(values, 0) == 10.0 and percentile(values, 100) == 40.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_summary_has_the_json_fields_even_without_samples() -> None:
    row = summarize([300.0, 310.0, 320.0], 295.5)
    assert row == {"p50_ms": 310.0, "p90_ms": 318.0, "p99_ms": 319.8, "floor_ms": 295.5, "n": 3}
    empty = summarize([], 295.5)
    assert empty["n"] == 0 and empty["p50_ms"] is None and empty["floor_ms"] == 295.5
