"""An edge with two origins: streams spread over both, and when one dies the
other takes every new stream without restarting the edge."""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PkiFiles
from tests.edge_env import (
    ROOT,
    Processes,
    node_available,
    start_edge,
    wait_port,
    write_edge_config,
    write_origin_config,
)
from tests.tunnel_env import free_port

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")


def _healthy(admin_port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=2)
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False


def test_streams_spread_over_origins_and_survive_losing_one(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    procs = Processes()
    try:
        node_a, node_b = free_port(), free_port()
        procs.node(node_a)
        procs.node(node_b)
        origins = {}
        for name, node in (("origin-a", node_a), ("origin-b", node_b)):
            port = free_port()
            config = write_origin_config(
                tmp_path / f"{name}.toml", test_pki, port=port, backends=[node]
            )
            origins[name] = (
                port,
                procs.start([sys.executable, "-m", "origin", "--config", str(config)], cwd=ROOT),
            )
            wait_port(port)
        https_port, admin_port = free_port(), free_port()
        edge_config = write_edge_config(
            tmp_path / "edge.toml",
            test_pki,
            https_port=https_port,
            admin_port=admin_port,
            origins=[(name, port) for name, (port, _) in origins.items()],
        )
        start_edge(procs, edge_config, tmp_path / "edge.log")
        wait_port(https_port)
        deadline = time.monotonic() + 15
        while not _healthy(admin_port) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # let both pools connect and measure their RTT
        context = ssl.create_default_context(cafile=str(test_pki.ca))

        def backends(count: int) -> list[int]:
            seen = []
            for _ in range(count):
                conn = http.client.HTTPSConnection(
                    "127.0.0.1", https_port, context=context, timeout=10
                )
                conn.request("GET", "/ip")
                response = conn.getresponse()
                assert response.status == 200
                seen.append(json.loads(response.read())["backend"])
                conn.close()
            return seen

        before = backends(60)
        assert set(before) == {node_a, node_b}, "both origins are equally close: both serve"

        origins["origin-a"][1].send_signal(signal.SIGKILL)
        origins["origin-a"][1].wait()
        time.sleep(0.5)  # the tunnels to origin-a see their TCP connections close
        after = backends(40)
        assert set(after) == {node_b}, "new streams must all go to the surviving origin"
        assert _healthy(admin_port)
    finally:
        procs.stop_all()
