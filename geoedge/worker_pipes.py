"""The two pipes between the supervisor and each worker (:mod:`geoedge.workers`).

- The *control pipe*, supervisor to worker: JSON objects, one per line
  (:meth:`ControlWriter.send`, :func:`listen_control`); the origin sends pool
  snapshots this way. EOF on it tells a worker its supervisor is gone.
- The *report pipe*, worker to supervisor: JSON lines too; today one message,
  ``{"op": "ready"}`` (:func:`report_ready`): the worker serves, and for the
  edge its tunnels are up and warm. The supervisor lets an older generation
  of workers go only once every new worker said so (a reload, :mod:`geoedge.reload`).

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

__all__ = [
    "MAX_CONTROL_BACKLOG",
    "ControlWriter",
    "ReportReader",
    "listen_control",
    "report_ready",
]

log = logging.getLogger("geoedge.workers")

#: Bytes of control messages kept for a worker that does not read them; past
#: this the worker is considered stuck and killed (it will be restarted).
MAX_CONTROL_BACKLOG = 16 * 1024 * 1024
#: A report line longer than this is not a report: the rest is dropped.
MAX_REPORT_LINE = 64 * 1024
READY = b'{"op":"ready"}\n'


class ControlWriter:
    """Non-blocking writer of a control pipe with a bounded backlog."""

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
        except OSError:  # the worker is gone; its reaping closes us
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


class ReportReader:
    """The supervisor's end of a worker's report pipe: calls ``on_message(dict)``
    for each line the worker writes. EOF (the worker exited) only stops reading:
    the supervisor learns of an exit from the worker's pidfd."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fd: int,
        on_message: Callable[[dict[str, Any]], None],
    ) -> None:
        self._loop = loop
        self.fd = fd
        self._on_message = on_message
        self._buffer = bytearray()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._loop.remove_reader(self.fd)
            return
        self._buffer += data
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            try:
                message = json.loads(line)
            except ValueError:
                log.error("bad report from a worker: %r", line[:200])
                continue
            if isinstance(message, dict):
                self._on_message(message)
        if len(self._buffer) > MAX_REPORT_LINE:
            self._buffer.clear()

    def close(self) -> None:
        if self.fd < 0:
            return
        self._loop.remove_reader(self.fd)
        os.close(self.fd)
        self.fd = -1


class _Context(Protocol):
    @property
    def control_fd(self) -> int: ...

    @property
    def report_fd(self) -> int: ...


def report_ready(context: _Context) -> None:
    """In a worker: tell the supervisor this worker serves (once is enough)."""
    if context.report_fd < 0:
        return
    try:
        os.write(context.report_fd, READY)
    except OSError as exc:  # the supervisor is gone: the control pipe says so too
        log.warning("cannot report ready to the supervisor: %s", exc)


# --------------------------------------------------------------------------- worker side


@dataclass(slots=True)
class _ControlReader(asyncio.Protocol):
    on_message: Callable[[dict[str, Any]], None]
    on_parent_gone: Callable[[], None]
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
) -> asyncio.BaseTransport:
    """In a worker: call ``on_message(dict)`` for each message the parent broadcasts,
    and ``on_parent_gone()`` at EOF (the parent died). Returns the pipe's transport."""
    loop = asyncio.get_running_loop()
    pipe = os.fdopen(context.control_fd, "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(
        lambda: _ControlReader(on_message, on_parent_gone), pipe
    )
    return transport
