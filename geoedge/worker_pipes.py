"""The two pipes between the supervisor and each worker (:mod:`geoedge.workers`).

- The *control pipe*, supervisor to worker: JSON objects, one per line
  (:meth:`ControlWriter.send`, :func:`listen_control`); the origin sends pool
  snapshots this way. A line with a ``"request_id"`` is a request
  (:mod:`geoedge.worker_requests`). EOF on it tells a worker its supervisor
  is gone.
- The *reply pipe*, worker to supervisor: JSON lines too, read by
  :class:`geoedge.worker_requests.ReplyReader`: the answers to requests, and
  the worker's own report ``{"op": "ready"}`` (:func:`report_ready`): it
  serves, and for the edge its tunnels are up and warm. The supervisor lets
  an older generation of workers go only once every new worker said so (a
  reload, :mod:`geoedge.reload`). One writer per worker process writes it
  (:func:`reply_writer`), so lines never interleave.

Both are plain pipes whose descriptors survive a supervisor's re-exec (their
numbers travel in the environment), so workers started before a reload stay
in touch with the supervisor after it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from geoedge.worker_requests import RequestHandler, RequestServer

__all__ = [
    "MAX_CONTROL_BACKLOG",
    "ControlWriter",
    "listen_control",
    "reply_writer",
    "report_ready",
]

log = logging.getLogger("geoedge.workers")

#: Bytes of control messages kept for a worker that does not read them; past
#: this the worker is considered stuck and killed (it will be restarted).
MAX_CONTROL_BACKLOG = 16 * 1024 * 1024
#: A worker's report that it serves (on its reply pipe).
READY = b'{"op":"ready"}\n'


class ControlWriter:
    """Non-blocking writer of a pipe with a bounded backlog."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._loop = loop
        self.fd = fd
        os.set_blocking(fd, False)
        self._backlog = bytearray()
        self._watching = False

    def send(self, data: bytes) -> bool:
        """Queue ``data``; False when the backlog is over its cap."""
        if self.fd < 0:
            return True
        self._backlog += data
        if len(self._backlog) > MAX_CONTROL_BACKLOG:
            return False
        self._flush()
        return True

    def _flush(self) -> None:
        try:
            while self._backlog:
                written = os.write(self.fd, self._backlog)
                del self._backlog[:written]
        except BlockingIOError:
            pass
        except OSError:  # the reader is gone; its reaping closes us
            self._backlog.clear()
        if self._backlog and not self._watching:
            self._loop.add_writer(self.fd, self._flush)
            self._watching = True
        elif not self._backlog and self._watching:
            self._loop.remove_writer(self.fd)
            self._watching = False

    def close(self) -> None:
        if self.fd < 0:
            return
        if self._watching:
            self._loop.remove_writer(self.fd)
        os.close(self.fd)
        self.fd = -1


class _Context(Protocol):
    @property
    def control_fd(self) -> int: ...

    @property
    def reply_fd(self) -> int: ...


#: The reply pipe's writer of this worker process, by descriptor (one writer,
#: so that an answer and a report never interleave their octets).
_reply_writers: dict[int, ControlWriter] = {}


def reply_writer(context: _Context) -> ControlWriter | None:
    """In a worker (its event loop running): the one writer of its reply pipe."""
    if context.reply_fd < 0:
        return None
    writer = _reply_writers.get(context.reply_fd)
    if writer is None:
        writer = ControlWriter(asyncio.get_running_loop(), context.reply_fd)
        _reply_writers[context.reply_fd] = writer
    return writer


def report_ready(context: _Context) -> None:
    """In a worker: tell the supervisor this worker serves (once is enough)."""
    writer = reply_writer(context)
    if writer is not None and not writer.send(READY):
        log.warning("the supervisor does not read its reply pipe: ready not reported")


# --------------------------------------------------------------------------- worker side


@dataclass(slots=True)
class _ControlReader(asyncio.Protocol):
    on_message: Callable[[dict[str, Any]], None]
    on_parent_gone: Callable[[], None]
    requests: RequestServer | None = None
    buffer: bytearray = field(default_factory=bytearray)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\n")) >= 0:
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            try:
                message = json.loads(line)
            except ValueError:
                log.error("bad control message from the parent: %r", line[:200])
                continue
            if self.requests is not None and "request_id" in message:
                self.requests.handle(message)
                continue
            try:
                self.on_message(message)
            except Exception:
                log.exception("control message %r failed", message.get("op"))

    def eof_received(self) -> bool:
        self.on_parent_gone()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        return None


async def listen_control(
    context: _Context,
    on_message: Callable[[dict[str, Any]], None],
    on_parent_gone: Callable[[], None],
    on_request: RequestHandler | None = None,
) -> asyncio.BaseTransport:
    """In a worker: call ``on_message(dict)`` for each message the parent broadcasts,
    and ``on_parent_gone()`` at EOF (the parent died). With ``on_request``, a
    request of :meth:`Supervisor.request` is answered on the reply pipe with
    what ``await on_request(dict)`` returns. Returns the pipe's transport."""
    loop = asyncio.get_running_loop()
    requests = None
    writer = reply_writer(context)
    if on_request is not None and writer is not None:
        requests = RequestServer(on_request, writer.send)
    pipe = os.fdopen(context.control_fd, "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(
        lambda: _ControlReader(on_message, on_parent_gone, requests), pipe
    )
    return transport
