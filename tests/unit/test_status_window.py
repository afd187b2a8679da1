"""The status page's last-minute figures (geoedge.status_window) and its
renderer (geoedge.status_page), from metric families built here."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from geoedge.status_page import Action, Cell, Row, StatusPage, Table, cell, render
from geoedge.status_window import MetricsWindow, bucket_quantile


def test_quantiles_interpolate_inside_the_bucket_as_prometheus_does() -> None:
    buckets = [(0.1, 0.0), (0.5, 60.0), (math.inf, 60.0)]
    assert bucket_quantile(0.95, buckets) == pytest.approx(0.1 + 0.4 * 0.95)
    assert bucket_quantile(0.5, [(1.0, 10.0), (2.0, 20.0), (math.inf, 20.0)]) == 1.0
    # In +Inf: the highest finite bound, as histogram_quantile says.
    assert bucket_quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)]) == 1.0
    assert bucket_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None


@given(st.lists(st.floats(0.0001, 20.0), min_size=1, max_size=200), st.floats(0.01, 0.99))
def test_a_quantile_lies_in_the_bucket_of_the_true_one(values: list[float], q: float) -> None:
    bounds = [0.001, 0.01, 0.1, 1.0, 10.0, math.inf]
    buckets = [(b, float(sum(v <= b for v in values))) for b in bounds]
    estimate = bucket_quantile(q, buckets)
    assert estimate is not None
    ordered = sorted(values)
    true = ordered[max(0, math.ceil(q * len(values)) - 1)]
    upper = next(b for b in bounds if true <= b)
    lower = max([0.0] + [b for b in bounds if b < upper])
    assert lower - 1e-9 <= estimate <= (upper if upper != math.inf else 10.0) + 1e-9


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rates_and_quantiles_cover_the_window_and_old_snapshots_drop_out() -> None:
    registry = CollectorRegistry()
    requests = Counter("req", "r", ["status"], registry=registry)
    latency = Histogram("lat_seconds", "l", ["origin"], buckets=(0.1, 1.0), registry=registry)
    up = Gauge("up", "u", ["origin", "pid"], registry=registry)
    clock = Clock()
    window = MetricsWindow(registry.collect, span_s=60, clock=clock)
    requests.labels("200").inc(1000)  # before the window: not counted
    latency.labels("a").observe(5.0)
    window.sample()
    for _ in range(120):
        requests.labels("200").inc()
        latency.labels("a").observe(0.05)
    requests.labels("502").inc(6)
    up.labels("a", "1").set(2)
    up.labels("a", "2").set(1)
    clock.now += 60
    window.sample()
    assert window.seconds == 60
    assert window.rate("req_total", ("status",)) == {("200",): 2.0, ("502",): 0.1}
    assert window.count("lat_seconds", ("origin",)) == {("a",): 120}
    (p95,) = window.quantile(0.95, "lat_seconds", ("origin",)).values()
    assert p95 == pytest.approx(0.095)
    assert window.gauge("up", ("origin",)) == {("a",): 3}
    assert window.gauge("up", ("origin",), max) == {("a",): 2}
    # A minute later with nothing new: the old traffic has left the window.
    for _ in range(12):
        clock.now += 5
        window.sample()
    assert window.seconds == 60
    assert window.rate("req_total", ("status",)) == {("200",): 0.0, ("502",): 0.0}
    assert window.quantile(0.95, "lat_seconds", ("origin",)) == {("a",): None}


def test_a_restarted_workers_counters_count_from_zero() -> None:
    registry = CollectorRegistry()
    requests = Counter("req", "r", registry=registry)
    clock = Clock()
    window = MetricsWindow(registry.collect, clock=clock)
    requests.inc(500)
    window.sample()
    requests._value.set(30)  # type: ignore[attr-defined]  # the merged sum fell: a restart
    clock.now += 10
    window.sample()
    assert window.rate("req_total", ()) == {(): 3.0}


def test_the_page_escapes_what_it_shows_and_renders_actions_as_forms() -> None:
    page = StatusPage(
        "origin <o1>",
        [("state", Cell("serving", "ok"))],
        [
            Table(
                "Backends",
                ["pool", "backend"],
                [
                    Row(
                        [Cell("<script>x</script>"), cell(0.0042, "s")],
                        [Action("drain", "/b/a%3A1/drain")],
                    )
                ],
            ),
            Table("Edges", ["edge"], [], empty="no edge connected"),
        ],
    )
    html = render(page)
    assert "<script>x</script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert "<title>origin &lt;o1&gt;</title>" in html
    assert '<form method=post action="/b/a%3A1/drain"><button>drain</button></form>' in html
    assert "<td>4.20 ms</td>" in html and "<b class=ok>serving</b>" in html
    assert "no edge connected" in html
    assert page.as_json()["tables"][0]["rows"][0]["actions"] == [
        {"label": "drain", "url": "/b/a%3A1/drain"}
    ]
