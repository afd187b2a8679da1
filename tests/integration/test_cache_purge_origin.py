"""A purge through the origin's admin API reaches every worker of every
connected edge (issue 30): one origin, two edges of two workers each, the
real tunnels and CONTROL frames (PROTOCOL.md §5.14, CACHE_PURGE)."""

from __future__ import annotations

import dataclasses
import http.client
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geoedge import devstack
from tests.cache_env import BACKEND, CACHE_ON
from tests.conftest import PkiFiles, scaled
from tests.edge_env import ROOT, Processes, node_available, start_edge, wait_port, write_edge_config
from tests.tunnel_env import free_port

pytestmark = [
    pytest.mark.timeout(scaled(180)),
    pytest.mark.skipif(not node_available(), reason="needs Node.js (make node)"),
]

TAGGED = "/product/42?cc=public,max-age=600&tag=product-42%20catalogue"


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(p) for p in (task / "children").read_text().split()}
    return found


def fetch(port: int, ca: Path, path: str) -> tuple[int, str]:
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": "localhost"})
        response = conn.getresponse()
        response.read()
        return response.status, response.headers.get("Cache-Status", "")
    finally:
        conn.close()


def post(port: int, path: str, body: bytes) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=body)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_purge_by_tag_through_the_origin_reaches_every_worker_of_two_edges(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    procs = Processes()
    try:
        backend = free_port()
        procs.start(["node", str(BACKEND), str(backend)], stdout=subprocess.DEVNULL)
        wait_port(backend)
        tunnel_port, origin_admin = free_port(), free_port()
        origin_toml = tmp_path / "origin.toml"
        origin_toml.write_text(
            devstack.origin_toml(
                test_pki,
                origin_id="origin-1",
                tunnel_port=tunnel_port,
                admin_port=origin_admin,
                allowed_identities=["edge-1", "edge-2"],
                backends=[backend],
                workers=2,
                log_json=False,
            )
        )
        origin_log = open(tmp_path / "origin.log", "wb")  # noqa: SIM115 - the child holds it
        procs.start(
            [sys.executable, "-m", "origin", "--config", str(origin_toml)],
            cwd=ROOT,
            stdout=origin_log,
            stderr=subprocess.STDOUT,
        )
        wait_port(tunnel_port)
        edges = []
        for name, keys in (
            ("a", test_pki),
            ("b", dataclasses.replace(test_pki, edge=test_pki.edge2)),
        ):
            https_port, admin_port = free_port(), free_port()
            config = write_edge_config(
                tmp_path / f"edge-{name}.toml",
                keys,
                https_port=https_port,
                admin_port=admin_port,
                origins=[("origin", tunnel_port)],
                workers=2,
                extra=CACHE_ON.format(
                    max_bytes=16 * 2**20, cache_keys="", compression="false", hit_for_pass_s=1.0
                ),
            )
            edge = start_edge(procs, config, tmp_path / f"edge-{name}.log")
            edges.append((edge, https_port, admin_port))
        for _, https_port, admin_port in edges:
            wait_port(https_port, timeout=scaled(30))
            devstack.wait_healthy(admin_port, time.monotonic() + scaled(30), "edge")
        # Every worker of both edges stores the tagged response: new connections
        # land on a worker the kernel picks, so ask often enough (2 workers:
        # the chance one is never picked in 40 tries is 2**-39).
        workers: dict[int, set[int]] = {}
        for edge, https_port, _ in edges:
            for _ in range(40):
                assert fetch(https_port, test_pki.ca, TAGGED)[0] == 200
            workers[edge.pid] = children(edge.pid)
            assert len(workers[edge.pid]) == 2
        assert "hit" in fetch(edges[0][1], test_pki.ca, TAGGED)[1]

        status, report = post(origin_admin, "/cache/purge?timeout_s=1", b'{"tag": "product-42"}')
        assert status == 200, report
        # Every connection of both edges ACKed within the 1 s the origin waited.
        assert report["complete"] is True, report
        assert report["unconfirmed"] == []
        edges_seen = report["edges"]
        assert isinstance(edges_seen, dict) and set(edges_seen) == {"edge-1", "edge-2"}
        purged_by_worker: dict[int, int] = {}
        for outcome in report["outcomes"]:  # type: ignore[union-attr]
            match = re.fullmatch(r"purged (\d+) in worker (\d+)", outcome["reason"])
            assert match is not None, outcome
            pid = int(match[2])
            purged_by_worker[pid] = purged_by_worker.get(pid, 0) + int(match[1])
        every_worker = set().union(*workers.values())
        assert set(purged_by_worker) == every_worker
        assert all(
            purged_by_worker[pid] == 1 for pid in every_worker
        )  # once, whatever the connections
        for _, https_port, _ in edges:
            assert "fwd=uri-miss" in fetch(https_port, test_pki.ca, TAGGED)[1]

        status, report = post(origin_admin, "/cache/purge", b'{"tag": ""}')
        assert status == 400 and "non-empty" in str(report["error"])
    finally:
        procs.stop_all()
