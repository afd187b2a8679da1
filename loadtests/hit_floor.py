"""The floor of a cache hit: the cheapest Python server of the edge's shape.

``make bench-edge`` (:mod:`loadtests.bench_cache`) asks for keep-alive cache
hits at >= 0.5x nginx ``proxy_cache``. This server shows what the plumbing
any Python edge pays costs: the edge's own TLS listener and transport
(:mod:`edge.tls_transport`, the edge's ``SSLContext`` from
:class:`edge.tls.CertificateStore`) on uvloop, whose protocol answers every
request head on a keep-alive connection with a fixed 1 KiB response, the
size and shape of the edge's hit (its fields, ``Age`` and ``Cache-Status``
included). No parsing beyond finding each head's end, no lookup, no log:
what is left of a hit when the edge's own logic costs nothing.

``python -m loadtests.hit_floor --serve PORT --cert C --key K`` serves until
killed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import uvloop

from edge.config import CertificateConfig, TlsConfig
from edge.listener import TlsListener
from edge.tls import CertificateStore
from geoedge.listening import bind_listener

RESPONSE = (
    b"HTTP/1.1 200 OK\r\nX-Request-Id: 0123456789abcdef-1\r\n"
    b"content-type: text/plain\r\ncache-control: public, max-age=3600\r\n"
    b'etag: W/"400-0123456789abcdef"\r\ndate: Sat, 28 Nov 2026 03:00:00 GMT\r\n'
    b"content-length: 1024\r\nage: 5\r\ncache-status: edge-floor; hit; ttl=3595\r\n\r\n"
) + b"x" * 1024


class FixedHit(asyncio.Protocol):
    """Answers each complete request head with :data:`RESPONSE`, in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        pending = self.pending + data
        answers = 0
        while (end := pending.find(b"\r\n\r\n")) >= 0:
            pending = pending[end + 4 :]
            answers += 1
        self.pending = pending
        if answers and self.transport is not None:
            self.transport.write(RESPONSE * answers)


async def serve(port: int, cert: Path, key: Path) -> None:
    store = CertificateStore(TlsConfig(certificates=(CertificateConfig(cert=cert, key=key),)))
    TlsListener(bind_listener("127.0.0.1", port), store.context, FixedHit, handshake_timeout_s=10.0)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, required=True, metavar="PORT")
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    args = parser.parse_args(argv)
    uvloop.run(serve(args.serve, args.cert, args.key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
