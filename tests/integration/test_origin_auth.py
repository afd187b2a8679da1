"""Edges are admitted by certificate: an unknown certificate (another CA) is
refused in the TLS handshake, a known one whose identity is not allowed is
refused after it; both are logged and counted (``python -m origin``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PkiFiles, run_async
from tests.integration.origin_harness import (
    admin_request,
    http_get,
    metric_values,
    needs_node,
    node_backends,
    origin_config,
    origin_process,
    pool,
)
from tests.polling import wait_until_async
from tests.tunnel_env import connect, dial_config
from tunnel.aio.errors import TunnelHandshakeError

pytestmark = needs_node


async def refusals_counted(admin_url: str, count: int) -> str:
    """The origin's /metrics once it counted ``count`` refused edges: the client
    may see a refusal before the origin has counted it."""

    async def metrics() -> str:
        _, text = await admin_request("GET", f"{admin_url}/metrics")
        refused = metric_values(str(text), "geoedge_origin_edges_refused_total")
        return str(text) if sum(refused.values()) >= count else ""

    return await wait_until_async(metrics, f"{count} refusals not counted")


def test_unknown_and_unlisted_edges_are_refused_logged_and_counted(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with node_backends(tmp_path, 1) as nodes:
        config = origin_config(test_pki, [pool([nodes[0].address])], allowed_identities=("edge-1",))
        with origin_process(tmp_path, config) as origin:

            async def main() -> tuple[int, str]:
                await origin.wait_ready()
                rogue = dial_config(
                    test_pki,
                    origin.port,
                    cert=test_pki.rogue_edge.cert,
                    key=test_pki.rogue_edge.key,
                )
                unlisted = dial_config(
                    test_pki, origin.port, cert=test_pki.edge2.cert, key=test_pki.edge2.key
                )
                for refused in (rogue, unlisted):
                    with pytest.raises((TunnelHandshakeError, OSError)):
                        connection = await connect(refused)
                        await http_get(connection, "/ip")  # must not get this far
                good = await connect(dial_config(test_pki, origin.port))
                status = (await http_get(good, "/ip")).status
                good.abort()
                return status, await refusals_counted(origin.admin_url, 2)

            status, text = run_async(main(), 30)
    assert status == 200
    refused = metric_values(text, "geoedge_origin_edges_refused_total")
    assert refused['{reason="identity_not_allowed"}'] == 1.0
    tls = {k: v for k, v in refused.items() if k.startswith('{reason="tls_')}
    assert list(tls.values()) == [1.0], refused
    logs = origin.logs()
    handshake = [r for r in logs if r.get("msg") == "edge refused in the TLS handshake"]
    assert len(handshake) == 1 and "certificate" in handshake[0]["detail"].lower()
    assert any("'edge-2' is not in allowed_identities" in r["msg"] for r in logs)


def test_an_origin_certificate_is_refused_as_an_edge_logged_and_counted(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    """``allowed_identities = ["*"]`` admits any identity, never another role."""
    with node_backends(tmp_path, 1) as nodes:
        config = origin_config(test_pki, [pool([nodes[0].address])], allowed_identities=("*",))
        with origin_process(tmp_path, config) as origin:

            async def main() -> str:
                await origin.wait_ready()
                posing = dial_config(
                    test_pki, origin.port, cert=test_pki.origin.cert, key=test_pki.origin.key
                )
                with pytest.raises((TunnelHandshakeError, OSError)):
                    connection = await connect(posing)
                    await http_get(connection, "/ip")  # must not get this far
                good = await connect(dial_config(test_pki, origin.port))
                assert (await http_get(good, "/ip")).status == 200
                good.abort()
                return await refusals_counted(origin.admin_url, 1)

            text = run_async(main(), 30)
    refused = metric_values(text, "geoedge_origin_edges_refused_total")
    assert refused == {'{reason="wrong_role"}': 1.0}, refused
    assert any(
        "certificate of 'origin-1' has role 'origin', expected role 'edge'" in r["msg"]
        for r in origin.logs()
    )
