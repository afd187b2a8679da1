"""Requests from a daemon's parent to its workers, and their answers: the way
back beside the control pipe of :mod:`geoedge.workers`.

The control pipe carries JSON lines from the parent to each worker. A
*request* is such a line with a ``"request_id"``; the worker runs its request
handler (``on_request`` of :func:`geoedge.workers.listen_control`) and writes
exactly one JSON line to its *reply pipe*, worker to parent:
``{"reply_to": id, "result": {...}}``, or ``{"reply_to": id, "error":
"ClassName"}`` when the handler raised (its text stays in the worker's log).
:meth:`geoedge.workers.Supervisor.request` sends a request to every running
worker and gathers one :class:`WorkerAnswer` per worker: its result, or why
there is none (no answer in time, the worker exited, its handler failed).

Everything here is bounded: a reply line above :data:`MAX_REPLY_BYTES` is
dropped (and logged) up to the next newline, at most
:data:`MAX_PENDING_REQUESTS` requests wait at once (one more raises
:class:`TooManyRequests`), a request waits a time its caller gives, and the
worker's writer keeps a bounded backlog, as the control pipe's does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_PENDING_REQUESTS",
    "MAX_REPLY_BYTES",
    "PendingRequests",
    "ReplyReader",
    "RequestServer",
    "TooManyRequests",
    "WorkerAnswer",
]

log = logging.getLogger("geoedge.workers")

#: The longest reply line a worker may write (octets, newline excluded).
MAX_REPLY_BYTES = 4 * 1024 * 1024
#: Requests waiting for their answers at once.
MAX_PENDING_REQUESTS = 16

RequestHandler = Callable[[dict[str, Any]], Awaitable[Mapping[str, Any]]]


class TooManyRequests(RuntimeError):
    """:data:`MAX_PENDING_REQUESTS` requests are waiting already."""


@dataclass(frozen=True, slots=True)
class WorkerAnswer:
    """One worker's answer to a request: ``result`` (the handler's JSON
    object), or None and ``error``: ``"timeout"``, ``"exited"``, or the class
    name of the exception the handler raised."""

    index: int
    pid: int
    result: dict[str, Any] | None = None
    error: str | None = None


class _Pending:
    __slots__ = ("answers", "done", "expected")

    def __init__(self, expected: dict[int, int], done: asyncio.Future[None]) -> None:
        self.expected = expected  # slot index -> pid
        self.answers: dict[int, WorkerAnswer] = {}
        self.done = done

    def add(self, answer: WorkerAnswer) -> None:
        if self.expected.get(answer.index) == answer.pid and answer.index not in self.answers:
            self.answers[answer.index] = answer
            if len(self.answers) == len(self.expected) and not self.done.done():
                self.done.set_result(None)


class PendingRequests:
    """The parent's requests awaiting answers, by id.

    Invariants: ids increase from 1; a request is pending from :meth:`open`
    until its :meth:`wait` returns; each worker asked answers it at most once
    (a second answer, or one from a worker not asked, is ignored); at most
    :data:`MAX_PENDING_REQUESTS` are pending."""

    __slots__ = ("_last_id", "_pending")

    def __init__(self) -> None:
        self._last_id = 0
        self._pending: dict[int, _Pending] = {}

    def open(self, workers: Mapping[int, int]) -> int:
        """A new request to ``workers`` (slot index -> pid); its id."""
        if len(self._pending) >= MAX_PENDING_REQUESTS:
            raise TooManyRequests(f"{MAX_PENDING_REQUESTS} requests are waiting already")
        self._last_id += 1
        done = asyncio.get_running_loop().create_future()
        if not workers:
            done.set_result(None)
        self._pending[self._last_id] = _Pending(dict(workers), done)
        return self._last_id

    async def wait(self, request_id: int, timeout_s: float) -> list[WorkerAnswer]:
        """Until every worker asked answered, or ``timeout_s``: the answers in
        slot order, ``"timeout"`` for those that did not answer."""
        pending = self._pending[request_id]
        try:
            await asyncio.wait_for(asyncio.shield(pending.done), timeout_s)
        except TimeoutError:
            pass
        finally:
            del self._pending[request_id]
        return [
            pending.answers.get(index) or WorkerAnswer(index, pid, error="timeout")
            for index, pid in sorted(pending.expected.items())
        ]

    def answer(self, index: int, pid: int, message: Mapping[str, Any]) -> None:
        """A reply line from the worker in slot ``index``."""
        pending = self._pending.get(message.get("reply_to", 0))
        if pending is None:  # answered too late, or nonsense: nobody waits
            return
        result = message.get("result")
        error = message.get("error")
        if isinstance(result, dict):
            pending.add(WorkerAnswer(index, pid, result=result))
        else:
            pending.add(WorkerAnswer(index, pid, error=str(error or "malformed reply")))

    def worker_gone(self, index: int, pid: int) -> None:
        """The worker in slot ``index`` exited: it answers nothing pending."""
        for pending in self._pending.values():
            if pending.expected.get(index) == pid:
                pending.add(WorkerAnswer(index, pid, error="exited"))


class ReplyReader:
    """Reads a worker's reply pipe in the parent: JSON lines, each at most
    :data:`MAX_REPLY_BYTES`, handed to ``on_reply``. Closed by its owner."""

    __slots__ = ("_buffer", "_discarding", "_loop", "_on_reply", "fd")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fd: int,
        on_reply: Callable[[dict[str, Any]], None],
    ) -> None:
        self._loop = loop
        self.fd = fd
        self._on_reply = on_reply
        self._buffer = bytearray()
        self._discarding = False
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the worker closed its end: its reaping closes ours
            self._loop.remove_reader(self.fd)
            return
        self._buffer += data
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if self._discarding or len(line) > MAX_REPLY_BYTES:
                if not self._discarding:
                    log.error("a worker's reply is above %d octets: dropped", MAX_REPLY_BYTES)
                self._discarding = False
                continue
            self._deliver(line)
        if len(self._buffer) > MAX_REPLY_BYTES and not self._discarding:
            log.error("a worker's reply is above %d octets: dropped", MAX_REPLY_BYTES)
            self._discarding = True
        if self._discarding:  # hold nothing of a line being dropped
            self._buffer.clear()

    def _deliver(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            log.error("bad reply from a worker: %r", line[:200])
            return
        if isinstance(message, dict):
            self._on_reply(message)

    def close(self) -> None:
        if self.fd < 0:
            return
        self._loop.remove_reader(self.fd)
        os.close(self.fd)
        self.fd = -1


class RequestServer:
    """In a worker: runs ``handler`` for each request and writes its answer
    with ``write`` (one JSON line; False from it means the parent does not
    read: the answer is dropped and logged). Handlers run concurrently."""

    __slots__ = ("_handler", "_running", "_write")

    def __init__(self, handler: RequestHandler, write: Callable[[bytes], bool]) -> None:
        self._handler = handler
        self._write = write
        self._running: set[asyncio.Task[None]] = set()

    def handle(self, message: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(message))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _answer(self, message: dict[str, Any]) -> None:
        request_id = message["request_id"]
        try:
            result = dict(await self._handler(message))
            line = _json_line({"reply_to": request_id, "result": result})
        except Exception as exc:  # the handler's, or a result JSON cannot carry
            log.exception("request %r failed", message.get("op"))
            line = _json_line({"reply_to": request_id, "error": type(exc).__name__})
        if len(line) > MAX_REPLY_BYTES + 1:
            log.error("reply to %r above %d octets: not sent", message.get("op"), MAX_REPLY_BYTES)
            line = _json_line({"reply_to": request_id, "error": "ReplyTooLarge"})
        if not self._write(line):
            log.error("the parent does not read its reply pipe: reply dropped")


def _json_line(message: Mapping[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()
