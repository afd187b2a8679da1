"""The cache's part of ``make bench-edge``: hits beside nginx's proxy_cache, and
the CPU each encoder spends per MB.

Hits: keep-alive requests per second for one stored 1 KiB response
(``Cache-Control: public, max-age=3600``), ``wrk -t1 -c50``, against

- geoedge: the edge (one worker, ``[cache]`` on, no access log) in front of
  origin → Node.js (tests/cache_backend.mjs), which a hit never reaches;
- nginx (Debian's, one worker, ``proxy_cache`` on, no access log): TLS → the
  same Node.js;
- the floor (:mod:`loadtests.hit_floor`): the edge's TLS listener and
  transport answering every request with a fixed response of the hit's
  size, no logic at all: ``floor_ratio`` (floor / nginx) is the best hit
  ratio a Python edge of this shape could reach, ``floor_cpu_us`` what it
  pays per request.

Both use the same ECDSA P-256 certificate, the servers pinned to CPU 0 and
wrk to CPU 1, best of ``rounds`` runs taken in alternating order (noise
only slows a run). Target (issue 30): hits >= 0.5x nginx.

Compression: CPU seconds per MB of input for zstd, brotli and gzip at each
level tried, on a corpus of this repository's own text (Python, Markdown,
JSON: what a web app's scripts and styles resemble), with the ratio each
reaches: docs/cache.md chooses the default levels from this table.

``python -m loadtests.bench_cache`` runs it alone; ``make bench-edge`` runs
it after its own phases and keeps its figures under ``cache``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import brotli
import zstandard

from geoedge import devstack
from loadtests import edge_clients, edge_stack
from loadtests.edge_stack import CLIENT_CPU, SERVER_CPU, pinned, tree_cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
BACKEND = ROOT / "tests" / "cache_backend.mjs"
NGINX = "/usr/sbin/nginx"
PATH = "/bench?cc=public,max-age=3600&size=1024&type=text/plain"
CHAINS = ("geoedge", "nginx", "floor")
TARGET_RATIO = 0.5

LEVELS = {"zstd": (1, 3, 6, 9), "br": (1, 4, 6, 9), "gzip": (1, 6, 9)}


def nginx_conf(workdir: Path, keys: devstack.DevPki, port: int, node_port: int) -> str:
    return f"""
user root;
worker_processes 1;
daemon off;
master_process on;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    proxy_cache_path {workdir}/nginx-cache levels=1:2 keys_zone=bench:16m max_size=256m;
    proxy_temp_path {workdir}/nginx-temp;
    client_body_temp_path {workdir}/nginx-body;
    upstream node {{ server 127.0.0.1:{node_port}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {keys.server.cert};
        ssl_certificate_key {keys.server.key};
        keepalive_requests 1000000;
        location / {{
            proxy_cache bench;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://node;
        }}
    }}
}}
"""


CACHE_TOML = """
[cache]
enabled = true
"""


class CacheStack:
    """Node.js, origin, edge (cache on) and nginx (proxy_cache), pinned to CPU 0."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.keys = edge_stack.make_pki(workdir / "pki")
        self.ports = edge_stack.Ports()
        self.nginx_port = devstack.free_port()
        self.floor_port = devstack.free_port()
        self.processes = devstack.ProcessGroup()
        self.forked: list[int] = []

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Any:
        log = self.workdir / f"{name}.log"
        return self.processes.spawn(name, pinned(SERVER_CPU, argv), log=log, cwd=ROOT, env=env)

    def start(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        work, ports = self.workdir, self.ports
        node = self._spawn("node", ["node", str(BACKEND), str(ports.node)])
        devstack.wait_port(ports.node, deadline, node)
        (work / "origin.toml").write_text(edge_stack.origin_toml(self.keys, ports))
        (work / "edge.toml").write_text(edge_stack.edge_toml(self.keys, ports) + CACHE_TOML)
        (work / "nginx.conf").write_text(nginx_conf(work, self.keys, self.nginx_port, ports.node))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        python = [sys.executable, "-m"]
        origin = self._spawn(
            "origin", [*python, "origin", "--config", str(work / "origin.toml")], env
        )
        edge = self._spawn(
            "edge",
            [*python, "edge", "--config", str(work / "edge.toml"), "--log-level", "warning"],
            env,
        )
        nginx = self._spawn("nginx", [NGINX, "-c", str(work / "nginx.conf")])
        floor_argv = [*python, "loadtests.hit_floor", "--serve", str(self.floor_port)]
        floor_argv += ["--cert", str(self.keys.server.cert), "--key", str(self.keys.server.key)]
        floor = self._spawn("floor", floor_argv, env)
        devstack.wait_port(ports.edge, deadline, edge, work / "edge.log")
        devstack.wait_port(self.nginx_port, deadline, nginx, work / "nginx.log")
        devstack.wait_port(self.floor_port, deadline, floor, work / "floor.log")
        devstack.wait_healthy(ports.edge_admin, deadline, "the edge", work / "edge.log", (origin,))
        for pid_of in ("edge", "origin"):
            self.forked += edge_stack.children(self.processes.procs[pid_of].pid)

    def port(self, chain: str) -> int:
        return {"geoedge": self.ports.edge, "nginx": self.nginx_port}.get(chain, self.floor_port)

    def server_pids(self, chain: str) -> list[int]:
        name = {"geoedge": "edge"}.get(chain, chain)
        return [self.processes.procs[name].pid]

    def stop(self) -> None:
        self.processes.stop()
        edge_stack.kill_orphaned_workers(self.forked)


def warm(stack: CacheStack) -> None:
    """One request per chain stores the response; the next must be a hit."""
    import http.client
    import ssl

    context = ssl.create_default_context(cafile=str(stack.keys.ca))
    for chain in ("geoedge", "nginx"):
        for _ in range(3):
            conn = http.client.HTTPSConnection("localhost", stack.port(chain), context=context)
            conn.request("GET", PATH)
            conn.getresponse().read()
            conn.close()
            time.sleep(0.1)


def hits(stack: CacheStack, rounds: int, seconds: float) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {chain: [] for chain in CHAINS}
    for index in range(rounds):
        for chain in CHAINS if index % 2 == 0 else CHAINS[::-1]:
            url = f"https://127.0.0.1:{stack.port(chain)}{PATH}"
            pids = stack.server_pids(chain)
            cpu_before = tree_cpu_seconds(pids)
            run = edge_clients.run_wrk(pinned(CLIENT_CPU, []), url, seconds, 50)
            cpu = tree_cpu_seconds(pids) - cpu_before
            if run.requests == 0 or run.errors >= run.requests:
                raise RuntimeError(f"wrk got no good response from {chain}")
            runs[chain].append(
                {
                    "per_s": round(run.requests_per_s, 1),
                    "errors": run.errors,
                    "server_cpu_us_per_request": round(1e6 * cpu / run.requests, 1),
                    "client_cpu_share": round(run.client_cpu_share, 3),
                }
            )
    best = {chain: max(r["per_s"] for r in runs[chain]) for chain in CHAINS}
    cheapest = {chain: min(r["server_cpu_us_per_request"] for r in runs[chain]) for chain in CHAINS}
    return {
        "cache_hit_rps": best["geoedge"],
        "nginx_cache_hit_rps": best["nginx"],
        "cache_hit_ratio": round(best["geoedge"] / best["nginx"], 3),
        "target_ratio": TARGET_RATIO,
        "floor_rps": best["floor"],
        "floor_ratio": round(best["floor"] / best["nginx"], 3),
        "cpu_us_per_request": cheapest,
        "runs": runs,
    }


def corpus(limit: int = 4 * 1024 * 1024) -> bytes:
    """This repository's own text, up to ``limit`` octets."""
    parts, size = [], 0
    for pattern in ("**/*.py", "**/*.md", "**/*.json"):
        for path in sorted(ROOT.glob(pattern)):
            if ".venv" in path.parts or "node_modules" in path.parts or ".tools" in path.parts:
                continue
            data = path.read_bytes()
            parts.append(data)
            size += len(data)
            if size >= limit:
                return b"".join(parts)[:limit]
    return b"".join(parts)


def compress_once(coding: str, level: int, data: bytes) -> bytes:
    if coding == "zstd":
        return zstandard.ZstdCompressor(level=level).compress(data)
    if coding == "br":
        return bytes(brotli.compress(data, quality=level))
    return zlib.compress(data, level) if coding == "deflate" else _gzip(data, level)


def _gzip(data: bytes, level: int) -> bytes:
    obj = zlib.compressobj(level, zlib.DEFLATED, 31)
    return obj.compress(data) + obj.flush()


def compression(repeat: int = 3) -> dict[str, Any]:
    """CPU seconds per MB of input and the ratio, per coding and level (best of ``repeat``)."""
    data = corpus()
    mb = len(data) / 1e6
    table: dict[str, Any] = {"input_bytes": len(data)}
    for coding, levels in LEVELS.items():
        for level in levels:
            best = float("inf")
            out = b""
            for _ in range(repeat):
                started = time.process_time()
                out = compress_once(coding, level, data)
                best = min(best, time.process_time() - started)
            table[f"{coding}-{level}"] = {
                "cpu_ms_per_mb": round(1000 * best / mb, 2),
                "ratio": round(len(data) / len(out), 2),
            }
    return table


def run(quick: bool = False) -> dict[str, Any]:
    """Both parts; the hits need nginx, wrk and Node.js (else they are skipped, saying why)."""
    result: dict[str, Any] = {"compression": compression(1 if quick else 3)}
    missing = [what for what in (NGINX,) if not os.access(what, os.X_OK)]
    missing += [tool for tool in ("wrk", "node") if shutil.which(tool) is None]
    if missing:
        result["hits"] = {
            "skipped": f"missing: {', '.join(missing)} (make bench-edge installs them)"
        }
        return result
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        stack = CacheStack(Path(tmp))
        try:
            stack.start()
            warm(stack)
            result["hits"] = hits(stack, 1 if quick else 3, 1.0 if quick else 5.0)
        finally:
            stack.stop()
    return result


def report(result: dict[str, Any]) -> str:
    lines = []
    found = result.get("hits", {})
    if "skipped" in found:
        lines.append(f"cache hits: skipped ({found['skipped']})")
    elif found:
        lines.append(
            f"cache hits: geoedge {found['cache_hit_rps']:.0f}/s, nginx proxy_cache "
            f"{found['nginx_cache_hit_rps']:.0f}/s: {found['cache_hit_ratio']:.2f}x "
            f"(target >= {TARGET_RATIO}x); the floor (loadtests/hit_floor.py) "
            f"{found['floor_rps']:.0f}/s, {found['floor_ratio']:.2f}x"
        )
        cpu = found["cpu_us_per_request"]
        lines.append(
            "  server CPU per hit: " + ", ".join(f"{chain} {cpu[chain]:.0f} us" for chain in CHAINS)
        )
    table = result["compression"]
    lines.append(
        f"compression of {table['input_bytes'] / 1e6:.1f} MB of text, CPU ms per MB (ratio):"
    )
    for name, figures in table.items():
        if name != "input_bytes":
            lines.append(
                f"  {name:8} {figures['cpu_ms_per_mb']:8.1f} ms/MB  {figures['ratio']:5.2f}x"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if (os.cpu_count() or 1) > CLIENT_CPU:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {CLIENT_CPU})
    result = run(args.quick)
    print(report(result))
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
