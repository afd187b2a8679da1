"""A real chain for the cache's tests: the Node.js cache backend
(tests/cache_backend.mjs), the real origin and an edge with a cache.

``cache_stack`` yields a :class:`CacheStack`: ``fetch`` sends one request
over its own TLS connection to the edge, ``count`` asks the backend how many
requests for a path reached Node.js.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import PkiFiles
from tests.edge_env import Processes, Stack, edge_stack, wait_port
from tests.tunnel_env import free_port

BACKEND = Path(__file__).with_name("cache_backend.mjs")

CACHE_ON = """
[cache]
enabled = true
max_bytes = {max_bytes}
hit_for_pass_s = {hit_for_pass_s}
{cache_keys}
[compression]
enabled = {compression}
"""


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def field(self, name: str) -> str | None:
        return self.headers.get(name)


@dataclass
class CacheStack:
    stack: Stack
    backend_port: int

    def fetch(
        self,
        path: str,
        headers: dict[str, str] | None = None,
        method: str = "GET",
        body: bytes | None = None,
    ) -> Reply:
        conn = self.stack.https()
        try:
            conn.request(method, path, body=body, headers={"Host": "localhost", **(headers or {})})
            response = conn.getresponse()
            return Reply(response.status, response.headers, response.read())
        finally:
            conn.close()

    def count(self, path: str) -> int:
        """Requests for ``path`` that reached Node.js."""
        conn = http.client.HTTPConnection("127.0.0.1", self.backend_port, timeout=5)
        try:
            conn.request("GET", f"/_count?path={path}")
            return int(json.loads(conn.getresponse().read())["count"])
        finally:
            conn.close()

    def admin(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.stack.admin_port, timeout=10)
        try:
            conn.request(method, path, body=body)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()


def start_backend(procs: Processes, port: int) -> subprocess.Popen[bytes]:
    proc = procs.start(["node", str(BACKEND), str(port)], stdout=subprocess.DEVNULL)
    wait_port(port)
    return proc


@contextlib.contextmanager
def cache_stack(
    test_pki: PkiFiles,
    tmp: Path,
    *,
    workers: int = 1,
    max_bytes: int = 64 * 1024 * 1024,
    cache_keys: str = "",
    compression: bool = False,
    hit_for_pass_s: float = 1.0,
    extra: str = "",
) -> Iterator[CacheStack]:
    procs = Processes()
    port = free_port()
    start_backend(procs, port)
    config = CACHE_ON.format(
        max_bytes=max_bytes,
        cache_keys=cache_keys,
        compression=str(compression).lower(),
        hit_for_pass_s=hit_for_pass_s,
    )
    try:
        with edge_stack(
            test_pki, tmp, workers=workers, backend_port=port, extra=config + extra
        ) as stack:
            yield CacheStack(stack, port)
    finally:
        procs.stop_all()
