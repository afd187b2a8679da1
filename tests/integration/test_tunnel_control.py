"""CONTROL across real daemons (PROTOCOL.md §5.14, IMPLEMENTATION.md §N11).

First, one origin with two workers, two edges with two workers each and two
tunnel connections per worker, all real processes over mutual TLS. ``POST
/tunnel/echo`` on the origin's admin must come back with every edge worker's
every connection confirmed: the admin process asked both origin workers
through their pipes, each sent the ECHO on its edge connections, and each edge
worker's handler table answered it. Which edge worker holds which connection
is read from ``/proc`` (each worker's sockets, and their ports in
``/proc/net/tcp``), not from anything the daemons say.

Then, with the origin in process, every outcome a broadcast reports: applied,
refused, unknown kind, and a connection that ends while its ACK is awaited.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from geoedge import devstack
from tests.conftest import PkiFiles, run_async, scaled
from tests.edge_env import ROOT, Processes, start_edge, wait_port
from tests.integration.origin_harness import (
    admin_request as async_admin_request,
)
from tests.integration.origin_harness import (
    origin_config,
    origin_in_process,
    pool,
)
from tests.tunnel_env import connect, dial_config, free_port
from tunnel.aio.control import ControlHandlers, ControlReply, echo
from tunnel.mux import ControlKind, ControlStatus

EDGES = ("edge-1", "edge-2")
EDGE_WORKERS = 2
CONNECTIONS_PER_WORKER = 2


def admin_request(port: int, method: str, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(30))
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(name))
    return found


def tunnel_ports(pid: int, origin_port: int) -> set[int]:
    """The local ports of ``pid``'s TCP connections to ``origin_port`` on loopback."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if match := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(match.group(1))
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if inode in inodes and int(remote.split(":")[1], 16) == origin_port:
            ports.add(int(local.split(":")[1], 16))
    return ports


def edges_connected(metrics: str) -> dict[str, float]:
    return {
        match.group(1): float(match.group(2))
        for match in re.finditer(
            r'^geoedge_origin_edges_connected\{edge="([^"]+)"\} (\S+)$', metrics, re.MULTILINE
        )
    }


def test_an_echo_reaches_every_connection_of_every_edge_worker(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    procs = Processes()
    origin_port, origin_admin = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    (tmp_path / "origin.toml").write_text(
        devstack.origin_toml(
            test_pki,
            origin_id="origin-1",
            tunnel_port=origin_port,
            admin_port=origin_admin,
            allowed_identities=EDGES,
            backends=[free_port()],  # no backend: the streams are not the point
            workers=2,
            log_json=False,
            tunnel={"ping_interval_s": 0.5, "ping_timeout_s": 2.0},
        )
    )
    try:
        with (tmp_path / "origin.log").open("wb") as log:
            origin = procs.start(
                [sys.executable, "-m", "origin", "--config", str(tmp_path / "origin.toml")],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=log,
            )
        wait_port(origin_admin, scaled(15))
        edges = {}
        for identity, cert in zip(EDGES, (test_pki.edge, test_pki.edge2), strict=True):
            config = tmp_path / f"{identity}.toml"
            config.write_text(
                devstack.edge_toml(
                    dataclasses.replace(test_pki, edge=cert),
                    edge_id=identity,
                    https_port=free_port(),
                    admin_port=free_port(),
                    origins=[("origin-1", origin_port)],
                    workers=EDGE_WORKERS,
                    tunnel={"ping_interval_s": 0.5, "ping_timeout_s": 2.0},
                    origin_tunnel={"connections": CONNECTIONS_PER_WORKER},
                )
            )
            edges[identity] = start_edge(procs, config, tmp_path / f"{identity}.log")
        per_edge = EDGE_WORKERS * CONNECTIONS_PER_WORKER
        deadline = time.monotonic() + scaled(30)
        connected: dict[str, float] = {}
        while connected != {identity: per_edge for identity in EDGES}:
            assert time.monotonic() < deadline, (
                f"edges connected: {connected}\n{devstack.tail(tmp_path / 'origin.log')}"
            )
            assert origin.poll() is None, devstack.tail(tmp_path / "origin.log")
            time.sleep(0.1)
            connected = edges_connected(admin_request(origin_admin, "GET", "/metrics")[1])

        status, body = admin_request(
            origin_admin, "POST", f"/tunnel/echo?text=hello%20edges&timeout_s={scaled(5)}"
        )
        assert status == 200, body
        report: dict[str, Any] = json.loads(body)

        assert report["text"] == "hello edges"
        assert [w["answered"] for w in report["origin_workers"]] == [True, True]
        outcomes = report["outcomes"]
        assert report["confirmed"] == len(outcomes) == len(EDGES) * per_edge, report
        assert all(o["status"] == "applied" and o["confirmed"] for o in outcomes), outcomes
        assert report["counts"] == {"applied": len(EDGES) * per_edge}
        for identity, edge in edges.items():
            confirmed = {
                int(o["connection"].rpartition(":")[2])
                for o in outcomes
                if o["edge_id"] == identity
            }
            workers = children(edge.pid)
            assert len(workers) == EDGE_WORKERS
            held = {pid: tunnel_ports(pid, origin_port) for pid in workers}
            # Every worker of this edge holds its connections, and each of
            # them confirmed: no more, no fewer.
            assert all(len(ports) == CONNECTIONS_PER_WORKER for ports in held.values()), held
            assert set().union(*held.values()) == confirmed, (held, confirmed)

        status, body = admin_request(origin_admin, "POST", "/tunnel/echo?timeout_s=0")
        assert status == 400 and "timeout_s" in json.loads(body)["error"]
    finally:
        procs.stop_all()


PURGE = 0x0201


def test_a_broadcast_reports_every_connections_outcome(test_pki: PkiFiles) -> None:
    release = asyncio.Event()

    async def purge(body: bytes) -> ControlReply:
        if body == b"wait":
            await release.wait()
        if body == b"bad":
            raise ValueError("not a purge")
        return ControlReply(ControlStatus.APPLIED, "purged")

    async def main() -> None:
        config = origin_config(test_pki, [pool([f"127.0.0.1:{free_port()}"], health=False)])
        async with origin_in_process(config) as daemon:
            port = int(config.tunnel_listener.address.rpartition(":")[2])
            knows_purge = await connect(
                dial_config(test_pki, port),
                control_handlers=ControlHandlers({ControlKind.ECHO: echo, PURGE: purge}),
            )
            echo_only = await connect(
                dial_config(test_pki, port, cert=test_pki.edge2.cert, key=test_pki.edge2.key),
                control_handlers=ControlHandlers({ControlKind.ECHO: echo}),
            )
            assert daemon.worker is not None
            deadline = time.monotonic() + scaled(10)
            while len(daemon.worker.edges) < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)

            result = await daemon.broadcast_control(PURGE, b"{}", scaled(5))
            assert [(o.edge_id, o.status, o.reason) for o in result.outcomes] == [
                ("edge-1", "applied", "purged"),
                ("edge-2", "unknown_kind", ""),
            ]
            refused = await daemon.broadcast_control(PURGE, b"bad", scaled(5))
            assert [(o.status, o.reason) for o in refused.outcomes] == [
                ("refused", "ValueError"),
                ("unknown_kind", ""),
            ]
            # edge-1's handler waits; its connection ends meanwhile: "lost".
            pending = asyncio.ensure_future(daemon.broadcast_control(PURGE, b"wait", scaled(30)))
            while not knows_purge.session._control.unanswered:
                await asyncio.sleep(0.01)
            knows_purge.abort("gone")
            lost = await pending
            assert [(o.edge_id, o.status) for o in lost.outcomes] == [
                ("edge-1", "lost"),
                ("edge-2", "unknown_kind"),
            ]
            with pytest.raises(ValueError):
                await daemon.broadcast_control(PURGE, b"", 0)

            admin = f"http://{config.admin.address}"
            status, report = await async_admin_request("POST", f"{admin}/tunnel/echo?text=hi")
            assert status == 200
            assert [(o["edge_id"], o["status"], o["confirmed"]) for o in report["outcomes"]] == [
                ("edge-2", "applied", True)
            ]
            assert report["confirmed"] == 1 and report["origin_workers"][0]["answered"]
            status, report = await async_admin_request(
                "POST", f"{admin}/tunnel/echo?text={'x' * 257}"
            )
            assert status == 400 and "text" in report["error"]
            release.set()
            echo_only.abort()

    run_async(main(), 60)
