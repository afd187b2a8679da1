"""``make bench-keepalive-race``: Node's keep-alive race, geoedge beside HAProxy.

Node.js closes a keep-alive socket idle for ``keepAliveTimeout`` (5 s). A proxy
that reuses its backend connection at that moment sends a request into a
socket Node is closing: the request fails (a 502), or, if the proxy retries
it, may be processed twice. geoedge pools backend connections at the origin
and retires them after ``keepalive_timeout_s`` (3 s), before Node's timeout, so
the race should never happen.

The load: ``--clients`` keep-alive client connections, each sending a request
every ``--pace-s`` (Node's timeout, with ±``--jitter-s``), alternately GET and
POST to the sample app's ``/once`` with a unique ``X-Once-Id``, until
``--requests`` of each method were sent (bounded by ``--max-s``). Every answer
must be 200 with ``seen == 1`` (Node saw that id once): a 502 or a second
sighting is a failure. Both chains take the same load, one after the other,
on the same Node process (``loadtests.edge_stack``). Results go to
``loadtests/results/keepalive_race.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import ssl
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import uvloop

from loadtests.edge_stack import Stack

RESULTS = Path(__file__).resolve().parent / "results" / "keepalive_race.json"


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return status, await reader.readexactly(length)


async def _client(
    port: int, context: ssl.SSLContext, args: argparse.Namespace, quota: dict[str, int],
    outcome: Counter[str], deadline: float, first_delay: float,
) -> None:  # fmt: skip
    await asyncio.sleep(first_delay)
    reader = writer = None
    method = "GET" if random.random() < 0.5 else "POST"
    while time.monotonic() < deadline and (quota["GET"] > 0 or quota["POST"] > 0):
        if quota[method] <= 0:
            method = "POST" if method == "GET" else "GET"
        quota[method] -= 1
        if writer is None:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname="localhost"
            )
        once = uuid.uuid4().hex
        body = b"x" * 64 if method == "POST" else b""
        writer.write(
            f"{method} /once HTTP/1.1\r\nHost: localhost\r\nX-Once-Id: {once}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        try:
            status, payload = await _response(reader)  # type: ignore[arg-type]
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            outcome[f"{method} closed"] += 1
            writer.close()
            reader = writer = None
            continue
        if status != 200:
            outcome[f"{method} {status}"] += 1
        elif json.loads(payload)["seen"] != 1:
            outcome[f"{method} sent twice"] += 1
        else:
            outcome[f"{method} ok"] += 1
        method = "POST" if method == "GET" else "GET"
        await asyncio.sleep(args.pace_s + random.uniform(-args.jitter_s, args.jitter_s))
    if writer is not None:
        writer.close()


async def _run_chain(port: int, ca: Path, args: argparse.Namespace) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(ca))
    quota = {"GET": args.requests, "POST": args.requests}
    outcome: Counter[str] = Counter()
    started = time.monotonic()
    deadline = started + args.max_s
    await asyncio.gather(
        *(
            _client(port, context, args, quota, outcome, deadline, i * args.pace_s / args.clients)
            for i in range(args.clients)
        )
    )
    failures = sum(n for key, n in outcome.items() if not key.endswith(" ok"))
    return {"outcomes": dict(outcome), "failures": failures,
            "seconds": round(time.monotonic() - started, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.keepalive_race", description=__doc__)
    parser.add_argument("--requests", type=int, default=20000, help="per method (GET, POST)")
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--pace-s", type=float, default=5.0, help="Node's keepAliveTimeout")
    parser.add_argument("--jitter-s", type=float, default=0.05)
    parser.add_argument("--max-s", type=float, default=900.0, help="bound on each chain's run")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"settings": vars(args) | {"output": str(args.output)}}
    with tempfile.TemporaryDirectory(prefix="geoedge-race-") as workdir:
        stack = Stack(Path(workdir))
        try:
            stack.start()
            for chain, port in (("geoedge", stack.ports.edge), ("haproxy", stack.ports.haproxy)):
                print(
                    f"{chain}: {args.clients} clients, {args.requests} GET + POST ...", flush=True
                )
                results[chain] = uvloop.run(_run_chain(port, stack.keys.ca, args))
                print(f"{chain}: {results[chain]}", flush=True)
                stack.check_alive()
        finally:
            stack.stop()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if results["geoedge"]["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
