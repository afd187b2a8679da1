"""Liveness and readiness are different questions (issue 28: health that does not cascade).

Real processes: Node.js, the origin balancer, an edge. When the origin goes
away, or stops admitting this edge, the edge must say "do not send me users"
(``/readyz`` on the admin listener and ``[http] readiness_path`` on its traffic
port: 503) while saying "I am alive, do not replace me" (``/livez``: 200), and
become ready again by itself, the same process, once the origin is back.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack, edge_stack, node_available

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")

READINESS_PATH = "/_geoedge/readyz"


def admin_get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(5))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def traffic_readiness(stack: Stack) -> tuple[int, bytes]:
    """The edge's own answer on its HTTPS port, as an NLB health check sees it."""
    return stack.get(READINESS_PATH)


def until(what: str, check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + scaled(timeout_s)
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def assert_ready(stack: Stack) -> None:
    status, body = admin_get(stack.admin_port, "/readyz")
    assert (status, body["ready"]) == (200, True), body
    assert admin_get(stack.admin_port, "/healthz")[0] == 200
    assert traffic_readiness(stack) == (200, b"ready\n")
    assert admin_get(stack.admin_port, "/livez")[0] == 200


def assert_not_ready_but_alive(stack: Stack) -> None:
    status, body = admin_get(stack.admin_port, "/readyz")
    assert status == 503 and body["ready"] is False, body
    assert sum(body["tunnels_up"].values()) == 0, body
    assert traffic_readiness(stack) == (503, b"not ready\n")
    live_status, live = admin_get(stack.admin_port, "/livez")
    assert live_status == 200 and live["live"] is True, live
    assert stack.edge.poll() is None, "the edge must not exit"


def edge_not_ready(stack: Stack) -> bool:
    return admin_get(stack.admin_port, "/readyz")[0] == 503


def edge_ready(stack: Stack) -> bool:
    return admin_get(stack.admin_port, "/readyz")[0] == 200


def test_an_origin_outage_makes_the_edge_not_ready_alive_and_ready_again_by_itself(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        edge_pid = stack.edge.pid
        assert_ready(stack)
        # The readiness path is the edge's own: it never reaches a backend.
        status, body = stack.get("/ip")
        assert status == 200 and b"remote_address" in body
        origin_live = admin_get(stack.origin_admin_port, "/livez")
        assert origin_live[0] == 200 and origin_live[1]["live"] is True

        stack.stop_origin()
        until("the edge reports not ready", lambda: edge_not_ready(stack))
        assert_not_ready_but_alive(stack)
        # Users who still arrive get an honest 503 after tunnel_wait_s, not a hang.
        assert stack.get("/ip")[0] == 503
        # Still alive a while later: nothing makes the edge exit or restart.
        time.sleep(1.0)
        assert_not_ready_but_alive(stack)

        stack.start_origin()
        until("the edge is ready again", lambda: edge_ready(stack))
        assert_ready(stack)
        assert stack.edge.pid == edge_pid and stack.edge.poll() is None
        assert stack.get("/ip")[0] == 200


def test_an_edge_the_origin_stops_admitting_is_not_ready_alive_and_back_once_admitted(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        edge_pid = stack.edge.pid
        assert_ready(stack)
        origin_config = tmp_path / "origin.toml"
        admitted = origin_config.read_text()
        assert 'allowed_identities = ["edge-1"]' in admitted

        # The edge taken out of the origin's allow-list (a wrong entry, say).
        stack.stop_origin()
        origin_config.write_text(
            admitted.replace('allowed_identities = ["edge-1"]', 'allowed_identities = ["edge-2"]')
        )
        stack.start_origin()
        until(
            "the origin refuses the edge",
            lambda: "not in allowed_identities" in stack.origin_log.read_text(),
        )
        until("the edge reports not ready", lambda: edge_not_ready(stack))
        assert_not_ready_but_alive(stack)
        # The origin itself is fine: alive and ready (its backends are up).
        assert admin_get(stack.origin_admin_port, "/livez")[0] == 200
        assert admin_get(stack.origin_admin_port, "/readyz")[0] == 200

        stack.stop_origin()
        origin_config.write_text(admitted)
        stack.start_origin()
        until("the edge is ready again", lambda: edge_ready(stack))
        assert_ready(stack)
        assert stack.edge.pid == edge_pid and stack.edge.poll() is None
