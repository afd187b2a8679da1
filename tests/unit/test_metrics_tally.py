"""The tallies (the worker's, the edge's per request, the origin's per backend)
add up to what the same events would have made one by one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram

from edge.metrics import EdgeMetrics, RequestTally
from geoedge.metrics import Tally
from origin.backend_counts import BackendCounts
from origin.metrics import WorkerMetrics

BUCKETS = (0.001, 0.01, 0.1, 1.0)
SECONDS = [0.0005, 0.001, 0.002, 0.05, 0.05, 0.5, 3.0]


def families(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def declare(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    counter = Counter("t_requests", "requests", ["status"], registry=registry)
    histogram = Histogram("t_seconds", "seconds", ["route"], buckets=BUCKETS, registry=registry)
    return counter, histogram


def test_published_tally_equals_direct_updates() -> None:
    direct, tallied = CollectorRegistry(), CollectorRegistry()
    d_counter, d_histogram = declare(direct)
    t_counter, t_histogram = declare(tallied)
    tally = Tally()
    child = t_counter.labels("500")
    for seconds in SECONDS:
        d_counter.labels("200").inc()
        tally.add(t_counter, "200")
        d_counter.labels("500").inc(2)
        tally.inc(child, 2)
        d_histogram.labels("/a").observe(seconds)
        tally.observe(t_histogram, ("/a",), seconds)
        d_histogram.labels("/b").observe(seconds * 2)
        tally.observe_child(t_histogram.labels("/b"), seconds * 2)
    assert families(tallied) != families(direct)  # nothing until published
    tally.publish()
    assert families(tallied) == families(direct)
    tally.publish()  # a second publish adds nothing twice
    assert families(tallied) == families(direct)


def test_a_value_on_a_bucket_bound_counts_in_that_bucket() -> None:
    registry = CollectorRegistry()
    _, histogram = declare(registry)
    tally = Tally()
    tally.observe(histogram, ("/",), 0.01)
    tally.publish()
    values = families(registry)
    assert values[("t_seconds_bucket", (("le", "0.001"), ("route", "/")))] == 0
    assert values[("t_seconds_bucket", (("le", "0.01"), ("route", "/")))] == 1


REQUESTS = st.lists(
    st.tuples(
        st.sampled_from([200, 204, 304, 404, 502]),
        st.sampled_from(["o1", "o2"]),
        st.sampled_from(["h1", "h2", "ws"]),
        st.integers(0, 10**6),
        st.integers(0, 10**7),
        st.floats(0, 100, allow_nan=False),
        st.none() | st.floats(0, 100, allow_nan=False),
        st.floats(0, 100, allow_nan=False),
    ),
    max_size=30,
)


@given(REQUESTS)
def test_the_edge_request_tally_equals_each_request_counted_directly(
    requests: list[tuple[int, str, str, int, int, float, float | None, float]],
) -> None:
    """RequestTally sums a request into one list; published, the series are
    what each request's six updates would have made."""
    direct, tallied = EdgeMetrics(CollectorRegistry()), EdgeMetrics(CollectorRegistry())
    request_tally, tally = RequestTally(tallied), Tally()
    for status, origin, protocol, bytes_in, sent, duration, ttfb, transfer in requests:
        direct.requests.labels(str(status)).inc()
        direct.bytes.labels("in").inc(bytes_in)
        direct.bytes.labels("out").inc(sent)
        status_class = f"{status // 100}xx"
        direct.request_seconds.labels(origin, status_class, protocol).observe(duration)
        if ttfb is not None:
            direct.first_byte_seconds.labels(origin, protocol).observe(ttfb)
            direct.transfer_seconds.labels(protocol).observe(transfer)
        request_tally.add(status, origin, protocol, bytes_in, sent, duration, ttfb, transfer)
    request_tally.flush(tally)
    tally.publish()
    expected, got = families(direct.registry), families(tallied.registry)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
    request_tally.flush(tally)  # nothing twice
    tally.publish()
    assert families(tallied.registry) == got


STREAMS = st.lists(
    st.tuples(
        st.booleans(),  # reused
        st.integers(0, 10**6),
        st.integers(0, 10**7),
        st.none() | st.floats(0, 100, allow_nan=False),
        st.floats(0, 100, allow_nan=False),
    ),
    max_size=30,
)


@given(STREAMS, st.integers(1, 3))
def test_the_origin_backend_counts_equal_each_stream_counted_directly(
    streams: list[tuple[bool, int, int, float | None, float]], publishes: int
) -> None:
    """BackendCounts sums a backend's streams on its own object; published
    (once or more), the series are what each stream's updates would have made."""
    direct, summed = WorkerMetrics(CollectorRegistry()), WorkerMetrics(CollectorRegistry())
    children = [
        (m.streams.labels("p", "b"), m.reused.labels("p", "b"),
         m.bytes.labels("p", "b", "to_backend"), m.bytes.labels("p", "b", "from_backend"),
         m.first_byte_seconds.labels("p", "b"), m.stream_seconds.labels("p", "b"))
        for m in (direct, summed)
    ]  # fmt: skip
    d_streams, d_reused, d_up, d_down, d_first, d_seconds = children[0]
    counts, tally = BackendCounts(children[1][4], children[1][5]), Tally()
    for index, (reused, up, down, first_byte, seconds) in enumerate(streams):
        d_streams.inc()
        counts.streams += 1
        if reused:
            d_reused.inc()
            counts.reused += 1
        d_up.inc(up)
        d_down.inc(down)
        if first_byte is not None:
            d_first.observe(first_byte)
        d_seconds.observe(seconds)
        counts.finished(up, down, first_byte, seconds)
        if index % publishes == 0:
            counts.publish(tally, *children[1])
            tally.publish()
    counts.publish(tally, *children[1])
    tally.publish()
    expected, got = families(direct.registry), families(summed.registry)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
