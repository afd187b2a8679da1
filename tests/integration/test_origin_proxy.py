"""The client address reaches Node.js in a PROXY header (v1 or v2) taken from the
stream metadata, not from the origin's own socket (real TLS tunnel, real
``node server.js --proxy-protocol`` backends)."""

from __future__ import annotations

from pathlib import Path

import pytest

from geoedge.proxy import ProxyHeaderParser, TlvType
from origin.forward import proxy_preamble
from tests.conftest import PkiFiles, run_async
from tests.integration.origin_harness import (
    http_get,
    needs_node,
    node_backends,
    origin_config,
    origin_in_process,
    pool,
)
from tests.tunnel_env import connect, dial_config
from tunnel.mux import StreamMetadata

pytestmark = needs_node


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_proxy_header_carries_the_true_client_address(
    test_pki: PkiFiles, tmp_path: Path, version: str
) -> None:
    with node_backends(tmp_path, 1, proxy_protocol=True) as nodes:
        config = origin_config(test_pki, [pool([nodes[0].address], proxy_protocol=version)])
        port = int(config.tunnel_listener.address.rpartition(":")[2])

        async def main() -> list[dict[str, object]]:
            async with origin_in_process(config):
                connection = await connect(dial_config(test_pki, port))
                out = []
                for client in (("203.0.113.7", 40001), ("2001:db8::7", 40002)):
                    result = await http_get(
                        connection,
                        "/ip",
                        client=client,
                        server_name="app.test",
                        alpn="http/1.1",
                        tls_version="TLSv1.3",
                        request_id="req-1",
                    )
                    out.append(result.json())
                connection.abort()
                return out

        v4, v6 = run_async(main(), 30)
    assert v4["proxy_protocol_address"] == "203.0.113.7:40001"
    assert v6["proxy_protocol_address"] == "[2001:db8::7]:40002"
    for seen in (v4, v6):
        assert seen["remote_address"] == "127.0.0.1"  # the origin's socket
        assert seen["x_forwarded_for"] is None  # headers are the edge's job


def test_v2_tlvs_and_fallbacks() -> None:
    metadata = StreamMetadata(
        client_address=("203.0.113.7", 40001),
        server_address=("198.51.100.10", 443),
        server_name="app.test",
        alpn="h2",
        tls_version="TLSv1.3",
        tls_cipher="TLS_AES_128_GCM_SHA256",
        request_id="r" * 200,
    )
    parser = ProxyHeaderParser()
    header = parser.feed(proxy_preamble("v2", metadata))
    assert header is not None
    assert header.source == ("203.0.113.7", 40001)
    assert header.destination == ("198.51.100.10", 443)
    assert header.alpn == b"h2" and header.authority == "app.test"
    assert header.unique_id == b"r" * 128  # the spec's cap
    assert header.ssl is not None and header.ssl.version == "TLSv1.3"
    assert header.ssl.cipher == "TLS_AES_128_GCM_SHA256"
    assert dict(header.tlvs).keys() >= {TlvType.ALPN, TlvType.AUTHORITY, TlvType.SSL}
    assert proxy_preamble("off", metadata) == b""
    assert proxy_preamble("v1", StreamMetadata()) == b"PROXY UNKNOWN\r\n"
    no_server = proxy_preamble("v1", StreamMetadata(client_address=("2001:db8::1", 5)))
    assert no_server == b"PROXY TCP6 2001:db8::1 :: 5 0\r\n"
    unspec = ProxyHeaderParser().feed(proxy_preamble("v2", None))
    assert unspec is not None and unspec.source is None
