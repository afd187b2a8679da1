"""``make restart-test``: restart the edge under load, as ``systemctl restart``
does with ``geoedge-edge.socket``, and count what clients notice.

A holder process stands where systemd does: it binds the edge's listening
socket once and passes it to every edge it starts (``LISTEN_FDS``, descriptor
3), with a notify socket for ``READY=1``. The restart is systemd's: SIGTERM to
the running edge, wait for it to exit (it drains: in-flight requests finish,
WebSockets get a Close 1001 spread over ``drain_websocket_window_s``), start
the new one, wait for ``READY=1``. Meanwhile:

- keep-alive clients send GETs back to back on their connections; a
  connection the draining edge closes between two requests is reopened and
  the request sent again (RFC 9112 §9.3.1: what browsers and HTTP libraries
  do for an idempotent request that got no response octet);
- new-connection clients open a TLS connection per GET;
- ``--websockets`` WebSockets stay open, wait for the edge's Close, answer it
  and reconnect through the new edge.

Failures: a refused or reset connection attempt, a request that fails after
its one retry, a response cut short, a WebSocket closed without a Close frame
or with another code. Writes ``loadtests/results/restart.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from loadtests import edge_stack
from loadtests.soak_stack import SoakStack, edge_toml

RESULTS = Path(__file__).resolve().parent / "results" / "restart.json"
WINDOW_S = 5.0


class Holder:
    """systemd's part: the listening socket and the notify socket, kept across edges."""

    def __init__(self, workdir: Path, port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", port), backlog=4096)
        self.notify_path = workdir / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.setblocking(False)
        self.workdir = workdir

    def start_edge(self, config: Path, generation: int) -> subprocess.Popen[bytes]:
        fd = self.listener.fileno()
        script = (
            f"exec 3<&{fd} {fd}<&-; LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=https "
            f'exec "$0" -m edge --config "$1" --log-level warning'
        )
        log = open(self.workdir / f"edge-{generation}.log", "wb")  # noqa: SIM115
        env = {**os.environ, "PYTHONPATH": str(edge_stack.ROOT)}
        env["NOTIFY_SOCKET"] = str(self.notify_path)
        try:
            return subprocess.Popen(
                ["sh", "-c", script, sys.executable, str(config)],
                pass_fds=(fd,),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=edge_stack.ROOT,
                env=env,
            )
        finally:
            log.close()

    async def wait_ready(self, timeout_s: float = 60.0) -> float:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            try:
                while True:
                    message = self.notify.recv(4096).decode()
                    if "READY=1" in message.split("\n"):
                        return loop.time()
            except BlockingIOError:
                await asyncio.sleep(0.02)
        raise TimeoutError("the edge never said READY=1")


class Tally:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.latencies: list[tuple[float, float]] = []  # (when, seconds)

    def fail(self, what: str, exc: BaseException | str) -> None:
        self.counts[what] += 1
        if len(self.errors) < 20:
            self.errors.append(f"{what}: {exc!r}")


async def read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length)
    return head + body


async def keepalive_client(
    port: int, ctx: ssl.SSLContext, tally: Tally, stop: asyncio.Event
) -> None:
    loop = asyncio.get_running_loop()
    request = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while not stop.is_set():
        started = loop.time()
        for attempt in (1, 2):
            try:
                if connection is None:
                    connection = await asyncio.open_connection(
                        "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
                    )
                reader, writer = connection
                writer.write(request)
                answer = await read_response(reader)
                if not answer.startswith(b"HTTP/1.1 200"):
                    tally.fail("keepalive_status", answer[:40].decode(errors="replace"))
                else:
                    tally.counts["keepalive_ok"] += 1
                    tally.latencies.append((started, loop.time() - started))
                if b"connection: close" in answer.lower():
                    writer.close()
                    connection = None
                break
            except ConnectionRefusedError as exc:
                tally.fail("refused", exc)
                connection = None
                break
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError) as exc:
                connection = None
                if attempt == 1:
                    tally.counts["keepalive_retried"] += 1
                    continue
                tally.fail("keepalive_failed_after_retry", exc)
        await asyncio.sleep(0.01)
    if connection is not None:
        connection[1].close()


async def new_connection_client(
    port: int, ctx: ssl.SSLContext, tally: Tally, stop: asyncio.Event
) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        started = loop.time()
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
            )
            writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            answer = await read_response(reader)
            writer.close()
            if answer.startswith(b"HTTP/1.1 200"):
                tally.counts["new_ok"] += 1
                tally.latencies.append((started, loop.time() - started))
            else:
                tally.fail("new_status", answer[:40].decode(errors="replace"))
        except ConnectionRefusedError as exc:
            tally.fail("refused", exc)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError) as exc:
            tally.fail("new_failed", exc)
        await asyncio.sleep(0.02)


def ws_handshake(target: str) -> bytes:
    """A client's WebSocket upgrade request for ``target``."""
    return (
        f"GET {target} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def ws_frame(opcode: int, payload: bytes) -> bytes:
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + body


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first, second = await reader.readexactly(2)
    length = second & 0x7F
    if length == 126:
        length = int.from_bytes(await reader.readexactly(2), "big")
    elif length == 127:
        length = int.from_bytes(await reader.readexactly(8), "big")
    return first & 0x0F, await reader.readexactly(length)


async def websocket(
    port: int, ctx: ssl.SSLContext, tally: Tally, closes: list[tuple[float, int]], index: int
) -> None:
    """Open, echo, wait for the edge's Close, answer it, reconnect and echo again."""
    loop = asyncio.get_running_loop()
    for round_ in (1, 2):
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
            )
            writer.write(ws_handshake(f"/ws?i={index}"))
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                tally.fail("ws_refused", head[:40].decode(errors="replace"))
                return
            writer.write(ws_frame(0x1, b"ping"))
            if await read_frame(reader) != (0x1, b"ping"):
                tally.fail("ws_echo", "wrong echo")
            tally.counts[f"ws_open_round{round_}"] += 1
            if round_ == 2:
                writer.write(ws_frame(0x8, (1000).to_bytes(2, "big")))
                writer.close()
                return
            opcode, payload = await read_frame(reader)
            while opcode != 0x8:
                opcode, payload = await read_frame(reader)
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            closes.append((loop.time(), code))
            writer.write(ws_frame(0x8, payload[:2]))
            writer.close()
        except ConnectionRefusedError as exc:
            tally.fail("refused", exc)
            return
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError) as exc:
            tally.fail(f"ws_round{round_}_broken", exc)
            return


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="geoedge-restart-") as tmp:
        workdir = Path(tmp)
        stack = SoakStack(workdir, backends=2)
        holder = Holder(workdir, stack.ports.edge)
        config = workdir / "edge-restart.toml"
        config.write_text(
            edge_toml(stack.keys, stack.ports).replace(
                "drain_timeout_s = 2.0",
                f"drain_timeout_s = {WINDOW_S + 5}\ndrain_websocket_window_s = {WINDOW_S}",
            )
        )
        stack.start_backends_and_origin()
        ctx = ssl.create_default_context(cafile=str(stack.keys.ca))
        first = holder.start_edge(config, 1)
        await holder.wait_ready()
        tally, closes = Tally(), []  # type: ignore[var-annotated]
        stop = asyncio.Event()
        port = stack.ports.edge
        tasks = [asyncio.create_task(keepalive_client(port, ctx, tally, stop)) for _ in range(16)]
        tasks += [
            asyncio.create_task(new_connection_client(port, ctx, tally, stop)) for _ in range(4)
        ]
        sockets = [
            asyncio.create_task(websocket(port, ctx, tally, closes, i))
            for i in range(args.websockets)
        ]
        await asyncio.sleep(3.0)
        loop = asyncio.get_running_loop()
        sigterm_at = loop.time()
        first.send_signal(signal.SIGTERM)  # systemctl restart: stop...
        while first.poll() is None:
            await asyncio.sleep(0.02)
        stopped_at = loop.time()
        second = holder.start_edge(config, 2)  # ... then start
        ready_at = await holder.wait_ready()
        await asyncio.sleep(3.0)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, *sockets), 30)
        second.send_signal(signal.SIGTERM)
        second.wait(30)
        stack.stop()
    offsets = sorted(at - sigterm_at for at, _ in closes)
    during = [s for at, s in tally.latencies if sigterm_at <= at <= ready_at]
    failures = {k: v for k, v in tally.counts.items() if k not in OK_COUNTS}
    return {
        "websockets": args.websockets,
        "drain_websocket_window_s": WINDOW_S,
        "old_edge_exit_s": round(stopped_at - sigterm_at, 3),
        "new_edge_ready_s": round(ready_at - sigterm_at, 3),
        "counts": dict(tally.counts),
        "failures": failures,
        "errors": tally.errors,
        "websocket_close_codes": dict(Counter(code for _, code in closes)),
        "websocket_close_s": {
            "min": round(offsets[0], 3) if offsets else None,
            "p25": round(offsets[len(offsets) // 4], 3) if offsets else None,
            "p50": round(statistics.median(offsets), 3) if offsets else None,
            "p75": round(offsets[3 * len(offsets) // 4], 3) if offsets else None,
            "max": round(offsets[-1], 3) if offsets else None,
            "per_second": dict(Counter(int(o) for o in offsets)),
        },
        "request_latency_during_restart_s": {
            "count": len(during),
            "max": round(max(during), 3) if during else None,
        },
    }


OK_COUNTS = {"keepalive_ok", "keepalive_retried", "new_ok", "ws_open_round1", "ws_open_round2"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.restart", description=__doc__)
    parser.add_argument("--websockets", type=int, default=200)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    ok = not result["failures"] and result["websocket_close_codes"] == {1001: args.websockets}
    print("PASS" if ok else "FAIL", f"(results: {RESULTS})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
