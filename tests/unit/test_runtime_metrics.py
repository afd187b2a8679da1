"""Metrics across processes: a real parent and forked children in a fresh
interpreter (multiprocess mode is process-global, so not in pytest's own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from geoedge.metrics import MetricSet, exposition, multiprocess_enabled

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os, sys, time
from geoedge.metrics import (
    MetricSet, cleanup_multiprocess, enable_multiprocess, exposition, multiprocess_enabled,
    process_exited,
)
directory = enable_multiprocess()
assert multiprocess_enabled()
m = MetricSet("t")
streams = m.counter("streams", "streams", ("pool",))
open_now = m.gauge("open", "open streams", mode="livesum")
rtt = m.gauge("rtt", "rtt", ("edge",), mode="livemax")
streams.labels("web").inc(1)          # the parent counts too
pids = []
for i in range(2):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        streams.labels("web").inc(10 * (i + 1))
        open_now.set(5)
        rtt.labels("e1").set(0.1 * (i + 1))
        os.write(w, b"x")
        if i == 0:
            os._exit(0)               # dies: its live gauges must go, its counts stay
        time.sleep(30)
        os._exit(0)
    os.read(r, 1)
    pids.append(pid)
os.waitpid(pids[0], 0)
process_exited(pids[0])
text = exposition()[0].decode()
os.kill(pids[1], 9)
os.waitpid(pids[1], 0)
cleanup_multiprocess(directory)
print(json.dumps({"text": text, "dir_gone": not os.path.exists(directory)}))
"""


def run_script(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter with only the checkout on its path."""
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )


def test_multiprocess_counts_are_merged_and_dead_gauges_dropped() -> None:
    out = run_script(SCRIPT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    lines = result["text"].splitlines()
    assert 't_streams_total{pool="web"} 31.0' in lines
    assert "t_open 5.0" in lines  # only the live child's 5
    assert 't_rtt{edge="e1"} 0.2' in lines
    assert result["dir_gone"]


MERGE_WHILE_A_FILE_IS_CREATED = r"""
import os
from pathlib import Path
from geoedge.metrics import (
    MetricSet, cleanup_multiprocess, enable_multiprocess, exposition, merged_families,
)
directory = enable_multiprocess()
MetricSet("t").counter("streams", "streams").inc(3)
# What a worker starting now leaves for an instant: prometheus_client opens its
# value file (0 octets) before it sizes it.
(Path(directory) / "counter_4242.db").touch()
text = exposition()[0].decode()
assert "t_streams_total 3.0" in text.splitlines(), text
assert any(f.name == "t_streams" for f in merged_families())
cleanup_multiprocess(directory)
"""


def test_a_value_file_being_created_does_not_break_the_merge() -> None:
    """/metrics and /readyz answered 500 (a struct.error) when they merged while
    a worker was starting; the empty file is left out until it holds values."""
    out = run_script(MERGE_WHILE_A_FILE_IS_CREATED)
    assert out.returncode == 0, out.stderr


def test_single_process_sets_use_their_own_registries() -> None:
    assert not multiprocess_enabled()
    one, two = MetricSet("a"), MetricSet("a")  # the same names twice: no clash
    one.counter("x", "x").inc(2)
    two.counter("x", "x").inc(5)
    shared = CollectorRegistry()
    MetricSet("b", shared).histogram("latency_seconds", "l", buckets=(0.1, 1.0)).observe(0.5)
    text = exposition([one.registry, shared])[0].decode()
    assert "a_x_total 2.0" in text and "a_x_total 5.0" not in text
    assert 'b_latency_seconds_bucket{le="1.0"} 1.0' in text
