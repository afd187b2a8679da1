"""The edge's and the origin's access logs join by request id: one line per
request at the edge, one per stream at the origin, the id echoed to the
client; so an operator follows one request across both hops."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack, edge_stack, node_available
from tests.tunnel_env import free_port


def access_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith('{"ts"') and '"request_id"' in line:
            lines.append(json.loads(line))
    return lines


def joined(stack: Stack, request_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The edge's line for ``request_id`` and the origin's (one per stream: a
    request the edge retried on a new stream has one per attempt)."""
    deadline = time.monotonic() + scaled(10)
    while True:
        edge = [line for line in access_lines(stack.log) if line["request_id"] == request_id]
        origin = [
            line for line in access_lines(stack.origin_log) if line["request_id"] == request_id
        ]
        if edge and origin:
            assert len(edge) == 1, edge
            return edge[0], origin
        assert time.monotonic() < deadline, f"no joined lines for {request_id}: {edge} {origin}"
        time.sleep(0.2)


def request(stack: Stack, path: str) -> tuple[int, str]:
    conn = stack.https()
    try:
        conn.request("GET", path, headers={"User-Agent": "join-test/1"})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("X-Request-Id") or ""
    finally:
        conn.close()


@pytest.mark.skipif(not node_available(), reason="run `make node` first")
def test_a_request_has_one_line_at_each_hop_sharing_its_id(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        status, request_id = request(stack, "/bytes?n=5000")
        assert status == 200 and request_id
        edge, (origin,) = joined(stack, request_id)
        node = f"127.0.0.1:{stack.node_port}"
    assert (edge["status"], edge["outcome"], edge["user_agent"]) == (200, "ok", "join-test/1")
    assert origin["status"] == 200 and origin["outcome"] == "ok"
    assert (origin["pool"], origin["backend"]) == ("app", node)
    assert origin["edge_id"] == edge["edge_id"] == "test-edge"
    assert (origin["method"], origin["path"], origin["origin"]) == (
        "GET",
        "/bytes?n=5000",
        "origin-1",
    )
    assert origin["client_ip"] == edge["client_ip"] == "127.0.0.1"
    # What the origin had from the backend (head + 5000) is what the edge passed
    # on, less Node's fields about the origin's pooled connection to it, plus
    # the request id the edge adds to the head.
    dropped = len(b"Connection: keep-alive\r\nKeep-Alive: timeout=5\r\n")
    added = len(f"X-Request-Id: {request_id}\r\n")
    assert origin["bytes_out"] > 5000
    assert edge["bytes_out"] == origin["bytes_out"] - dropped + added
    # Phases nest: the backend's first byte, counted from the stream's arrival at
    # the origin, comes within the edge's time to first byte (tunnel + origin).
    assert 0 < origin["upstream_ms"] <= edge["upstream_ms"] <= edge["duration_ms"]
    assert origin["upstream_ms"] <= origin["duration_ms"]
    assert origin["connect_ms"] is not None or origin["reused"] is True


def test_a_failed_connect_is_logged_at_both_hops_under_one_id(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    nothing_listens = free_port()
    with edge_stack(test_pki, tmp_path, backend_port=nothing_listens) as stack:
        status, request_id = request(stack, "/")
        assert status == 502 and request_id
        edge, attempts = joined(stack, request_id)
    assert edge["status"] == 502 and edge["outcome"] != "ok"
    assert 1 <= len(attempts) <= 2, attempts  # a GET is retried once on a new stream
    for origin in attempts:
        assert origin["outcome"] == "connect_failed" and origin["backend"] is None
        assert origin["status"] == 0 and origin["upstream_ms"] is None
