"""`geoedge demo` (what `make demo` runs): the ready line, a request through the
whole chain with the printed CA, and a clean stop that leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import scaled
from tests.edge_env import ROOT, node_available
from tests.tunnel_env import free_port

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")

READY = re.compile(r"^geoedge demo ready: edge=(https://127\.0\.0\.1:\d+) ca=(\S+)$")


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(entry.name)
            found |= {child} | _descendants(child)
    return found


def start_demo(port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "geoedge.cli", "demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def first_line(demo: subprocess.Popen[str]) -> str:
    assert demo.stdout is not None
    return demo.stdout.readline().strip()


def survivors(pids: set[int], timeout_s: float = 10.0) -> set[int]:
    """The processes of ``pids`` still alive after up to ``timeout_s``."""
    deadline = time.monotonic() + scaled(timeout_s)
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if Path(f"/proc/{pid}").exists()}
        time.sleep(0.1)
    return alive


def test_demo_prints_one_ready_line_serves_and_stops_cleanly() -> None:
    port = free_port()
    demo = start_demo(port)
    try:
        line = first_line(demo)
        match = READY.match(line)
        assert match, f"unexpected first line: {line!r}"
        url, ca = match.groups()
        assert url == f"https://127.0.0.1:{port}"
        children = _descendants(demo.pid)
        assert len(children) >= 6  # 4 Node backends, an origin, an edge (+ workers)
        context = ssl.create_default_context(cafile=ca)
        backends = set()
        for _ in range(12):
            with urllib.request.urlopen(f"{url}/ip", context=context, timeout=10) as response:
                info = json.loads(response.read())
            assert info["x_forwarded_for"] == "127.0.0.1"
            backends.add(info["backend"])
        assert len(backends) >= 2, "the origin did not spread requests over the backends"
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(30)
    alive = survivors(children)
    assert not alive, f"processes left behind: {alive}"
    assert demo.returncode == 0
    assert not Path(ca).exists(), "the throwaway CA was not removed"


def test_a_second_signal_during_the_stop_still_stops_everything() -> None:
    """``timeout geoedge demo`` under ``pkill``, or Ctrl-C pressed twice: a second
    SIGTERM or SIGINT while the demo stops its processes must not interrupt
    that, leaving Node.js backends behind with a traceback."""
    demo = start_demo(free_port())
    try:
        line = first_line(demo)
        assert READY.match(line), f"unexpected first line: {line!r}"
        children = _descendants(demo.pid)
        assert len(children) >= 6
    finally:
        # Back to back, as pkill -f delivers to the demo and to a `timeout`
        # wrapper that forwards it: the second lands while the first is handled.
        for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT):
            if demo.poll() is None:
                demo.send_signal(sig)
            time.sleep(0.01)
        _, stderr = demo.communicate(timeout=scaled(30))
    alive = survivors(children)
    assert not alive, f"processes left behind: {alive}"
    assert "Traceback" not in stderr, stderr[-2000:]
    assert demo.returncode == 0
