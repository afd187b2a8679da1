"""A backend that records every request it receives and parses them strictly.

It stands where Node.js stands behind the origin, in a thread of the test
process, and parses with h11 (python-hyper), a strict HTTP/1.1 implementation:
whatever the edge forwards must be one unambiguous message to it. A parse
error, a message with both ``Content-Length`` and ``Transfer-Encoding``,
duplicate framing fields, an underscore spelling of a forwarding field, or
bytes after a ``Connection: close`` request is recorded as a *violation*: an
ambiguous request reached the backend.

Answers, by path: ``/ws`` a correct WebSocket 101 (then echoes raw bytes),
``/ws-bad-accept`` a 101 with a wrong ``Sec-WebSocket-Accept``, ``/hang``
nothing at all, anything else ``200`` with a JSON body naming what it saw.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field

import h11

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
FRAMING = {b"content-length", b"transfer-encoding"}


@dataclass
class Recorded:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    complete: bool = False


@dataclass
class Record:
    requests: list[Recorded] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    connections: int = 0


class RecordingBackend:
    """``with RecordingBackend() as backend:`` listening on ``backend.port``."""

    def __init__(self) -> None:
        self.record = Record()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> RecordingBackend:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("recording backend did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return len(self.record.requests), len(self.record.violations)

    def since(self, mark: tuple[int, int]) -> tuple[list[Recorded], list[str]]:
        with self._lock:
            return (
                list(self.record.requests[mark[0] :]),
                list(self.record.violations[mark[1] :]),
            )

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def _violation(self, text: str) -> None:
        with self._lock:
            self.record.violations.append(text)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.record.connections += 1
        conn = h11.Connection(h11.SERVER)
        current: Recorded | None = None
        try:
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError as exc:
                    if not reader.at_eof():
                        self._violation(f"backend could not parse the request: {exc}")
                    break  # (at EOF: a request cut short by a reset stream, not ambiguous)
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    if not data:
                        conn.receive_data(b"")
                        if conn.their_state in (h11.IDLE, h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
                            break
                        continue
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    current = Recorded(event.method, event.target, list(event.headers))
                    self._check(event)
                    with self._lock:
                        self.record.requests.append(current)
                elif isinstance(event, h11.Data):
                    assert current is not None
                    current.body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    assert current is not None
                    current.complete = True
                    if await self._answer(conn, writer, current, reader):
                        break
                    if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                        break
                    conn.start_next_cycle()
                else:  # ConnectionClosed, or PAUSED (nothing more to read here)
                    break
        except (ConnectionError, h11.LocalProtocolError):
            pass
        finally:
            writer.close()

    def _check(self, request: h11.Request) -> None:
        names = [name for name, _ in request.headers]
        if set(names) >= FRAMING:
            self._violation("both Content-Length and Transfer-Encoding reached the backend")
        for name in FRAMING:
            if names.count(name) > 1:
                self._violation(f"{name.decode()} twice reached the backend")
        for name in names:
            if b"_" in name and name.replace(b"_", b"-") in (
                b"x-forwarded-for", b"x-real-ip", b"x-forwarded-proto", b"x-forwarded-host",
                b"x-forwarded-port", b"x-request-id", b"content-length", b"transfer-encoding",
                b"forwarded",
            ):  # fmt: skip
                self._violation(f"underscore spelling {name.decode()} reached the backend")

    async def _answer(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        request: Recorded,
        reader: asyncio.StreamReader,
    ) -> bool:
        """Answer ``request``; True when the connection is done (upgraded or hung)."""
        path = request.target.split(b"?", 1)[0]
        if path == b"/hang":
            await asyncio.sleep(30)
            return True
        if path in (b"/ws", b"/ws-bad-accept"):
            key = dict(request.headers).get(b"sec-websocket-key", b"")
            accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
            if path == b"/ws-bad-accept":
                accept = base64.b64encode(b"not the right answer")
            headers = [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade")]
            headers.append((b"Sec-WebSocket-Accept", accept))
            writer.write(conn.send(h11.InformationalResponse(status_code=101, headers=headers)))
            await writer.drain()
            trailing, _ = conn.trailing_data
            if trailing:
                writer.write(trailing)
            while data := await reader.read(65536):  # echo: the upgraded bytes
                writer.write(data)
            return True
        body = json.dumps(
            {
                "method": request.method.decode("latin-1"),
                "target": request.target.decode("latin-1"),
                "headers": [[n.decode("latin-1"), v.decode("latin-1")] for n, v in request.headers],
                "body_bytes": len(request.body),
            }
        ).encode()
        response = h11.Response(
            status_code=200,
            headers=[
                (b"Content-Type", b"application/json"),
                (b"Content-Length", b"%d" % len(body)),
            ],
        )
        writer.write(
            conn.send(response) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        )
        await writer.drain()
        return False
