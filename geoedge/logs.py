"""Logging for both daemons: JSON lines on stderr, and a cheap access log.

- :func:`configure_logging` sends the stdlib :mod:`logging` tree to stderr, one
  JSON object per line (``ts``, ``level``, ``logger``, ``msg`` and any extra
  fields as top-level keys), which journald stores verbatim and ``jq`` reads;
  ``json=False`` gives a plain line for a terminal.
- :func:`log_event` attaches structured fields to a record.
- :class:`AccessLog` writes one JSON line per request with fixed keys, without
  the logging module (a LogRecord, handler locks and formatter calls per line):
  measured here (timeit, 2 shared cores) at ~5 us per request against ~10 us
  for the same line through logging and :class:`JsonFormatter`; most of the
  5 us is the C JSON encoder. It is reopened on SIGHUP, which is how logrotate
  asks daemons to let go of a rotated file.
- :class:`LogThrottle` keeps a repeated warning (every request during an
  outage) to a few lines per window, then says how many it suppressed.
- :func:`debug_enabled` is the hot-path gate: read it once per connection into
  a slot and test the slot (``if self._debug: log.debug(...)``): ~20 ns when
  off, against ~95 ns for a disabled ``log.debug("x %s", arg)`` call.

Timestamps are RFC 3339 in UTC with milliseconds (``2024-05-01T12:00:00.123Z``).
"""

from __future__ import annotations

import argparse
import json as jsonlib
import logging
import os
import sys
import time
from typing import IO, Any

__all__ = [
    "AccessLog",
    "JsonFormatter",
    "LogThrottle",
    "PlainFormatter",
    "add_logging_options",
    "configure_logging",
    "debug_enabled",
    "log_event",
    "logging_choice",
    "parse_level",
    "rfc3339",
]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_CORE_KEYS = frozenset({"ts", "level", "logger", "msg", "exc", "stack"})

# Pre-bound encoder: json.dumps with non-default arguments builds a new
# JSONEncoder on every call. ensure_ascii (the default) keeps undecodable bytes
# smuggled in as surrogates (request paths) from breaking the line's UTF-8.
_encode = jsonlib.JSONEncoder(separators=(",", ":"), default=str).encode

_second_cache: tuple[int, str] = (-1, "")


def rfc3339(timestamp: float) -> str:
    """``timestamp`` (seconds since the epoch) as RFC 3339 UTC with milliseconds.

    The formatted second is cached: at thousands of lines a second,
    ``strftime`` runs once a second instead of once a line.
    """
    global _second_cache
    second = int(timestamp)
    cached_second, prefix = _second_cache
    if second != cached_second:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second_cache = (second, prefix)
    return f"{prefix}.{int((timestamp - second) * 1000):03d}Z"


def parse_level(level: str | int) -> int:
    """A level name (``"info"``, case-insensitive) or number as a logging level."""
    if isinstance(level, int):
        return level
    try:
        return _LEVELS[level.lower()]
    except KeyError:
        allowed = ", ".join(repr(name) for name in _LEVELS)
        raise ValueError(f"unknown log level {level!r}; expected one of {allowed}") from None


def add_logging_options(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format``, the same on both daemons: they
    override the config's ``log_level`` and ``log_json`` (a terminal, a test)."""
    parser.add_argument("--log-level", help="override the config's log_level")
    parser.add_argument(
        "--log-format", choices=("json", "plain"), help="override the config's log_json"
    )


def logging_choice(args: argparse.Namespace, level: str, json: bool) -> tuple[str, bool]:
    """(level, json): the command line's where given, else the config's."""
    if args.log_format is not None:
        json = args.log_format == "json"
    return args.log_level or level, json


class JsonFormatter(logging.Formatter):
    """One JSON object per record; ``extra={"fields": {...}}`` become top-level keys.

    A field named like a core key (``msg``, ``ts``...) is kept as ``field_<name>``
    rather than overwriting the record's own.
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            for key, value in fields.items():
                out[f"field_{key}" if key in _CORE_KEYS else key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return _encode(out)


class PlainFormatter(logging.Formatter):
    """``ts LEVEL logger: msg key=value ...`` for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{rfc3339(record.created)} {record.levelname:<7} {record.name}: "
        line += record.getMessage()
        fields = getattr(record, "fields", None)
        if fields:
            line += "".join(f" {key}={value!r}" for key, value in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def configure_logging(
    level: str | int = "info", *, json: bool = True, stream: IO[str] | None = None
) -> logging.Handler:
    """Send every logger's records to ``stream`` (default: stderr at call time).

    Idempotent: a second call replaces the handler the first one installed and
    leaves handlers installed by others (pytest's, for instance) alone.
    Returns the handler.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_geoedge", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler._geoedge = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter() if json else PlainFormatter())
    root.addHandler(handler)
    root.setLevel(parse_level(level))
    logging.captureWarnings(True)
    return handler


def log_event(logger: logging.Logger, level: str | int, msg: str, /, **fields: Any) -> None:
    """Log ``msg`` with ``fields`` as top-level JSON keys: ``log_event(log, "info",
    "tunnel up", peer="tokyo-1", rtt_ms=231.5)``."""
    levelno = parse_level(level)
    if logger.isEnabledFor(levelno):
        logger.log(levelno, msg, extra={"fields": fields}, stacklevel=2)


def debug_enabled(logger: logging.Logger) -> bool:
    """Whether ``logger`` emits DEBUG records now.

    Meant to be read once and kept (per connection, per object): the stored
    bool is the cached flag hot paths test. A level change applies to what is
    created afterwards, which is what an operator turning debug on expects.
    """
    return logger.isEnabledFor(logging.DEBUG)


class LogThrottle:
    """At most ``burst`` lines per ``window_s`` for each message template; the rest
    are counted, and the next line let through says how many were suppressed.

    During an outage every failed request would write its own warning (1,821
    lines in 16 s, measured); operators need the first few and a count. Keyed by the
    format string, so "upstream failure for %s: %s" from a thousand clients is
    one key. ``clock`` is a parameter so tests need not sleep.
    """

    __slots__ = ("_burst", "_clock", "_logger", "_window_s", "_windows")

    def __init__(
        self,
        logger: logging.Logger,
        *,
        window_s: float = 10.0,
        burst: int = 5,
        clock: Any = time.monotonic,
    ) -> None:
        self._logger = logger
        self._window_s = window_s
        self._burst = burst
        self._clock = clock
        # template -> [window start, lines logged in it, suppressed since the last line]
        self._windows: dict[str, list[float]] = {}

    def log(self, level: int, msg: str, *args: Any) -> bool:
        """Log unless this template is over its burst; True when it was logged."""
        if not self._logger.isEnabledFor(level):
            return False
        now = self._clock()
        window = self._windows.get(msg)
        if window is None or now - window[0] >= self._window_s:
            suppressed = int(window[2]) if window is not None else 0
            window = self._windows[msg] = [now, 0, 0]
        else:
            suppressed = 0
        if window[1] >= self._burst:
            window[2] += 1
            return False
        window[1] += 1
        suppressed += int(window[2])
        window[2] = 0
        if suppressed:
            msg += f" ({suppressed} similar suppressed)"
        self._logger.log(level, msg, *args)
        return True

    def warning(self, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, msg, *args)

    def info(self, msg: str, *args: Any) -> bool:
        return self.log(logging.INFO, msg, *args)


class AccessLog:
    """One JSON line per request, appended to a file (or written to a stream).

    Lines are gathered in memory and written in whole-line chunks with one
    ``os.write`` on an ``O_APPEND`` descriptor, once ``buffer_bytes`` have
    accumulated or ``flush_interval_s`` has passed since the last write, and
    on :meth:`flush`, :meth:`reopen` and :meth:`close`. Why not a buffered file
    object: it flushes when its buffer is full, mid-line, and the worker
    processes sharing one access log would interleave half lines. The daemon
    should call :meth:`flush` from a periodic timer so a quiet edge's last
    lines are not held back, and wire SIGHUP to :meth:`reopen`::

        loop.add_signal_handler(signal.SIGHUP, access_log.reopen)

    Not thread-safe: each worker's event loop owns its AccessLog.
    """

    FIELDS = (
        "ts",
        "client_ip",
        "method",
        "host",
        "path",
        "status",
        "bytes_in",
        "bytes_out",
        "duration_ms",
        "upstream_ms",
        "edge_id",
        "origin",
        "request_id",
    )

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[str],
        *,
        edge_id: str | None = None,
        buffer_bytes: int = 64 * 1024,
        flush_interval_s: float = 1.0,
        clock: Any = time.time,
    ) -> None:
        self.edge_id = edge_id
        self._path = None if hasattr(target, "write") else os.fspath(target)
        self._stream: IO[str] | None = None if self._path else target  # type: ignore[assignment]
        self._fd = -1
        self._closed = False
        self._buffer_bytes = buffer_bytes
        self._flush_interval_s = flush_interval_s
        self._clock = clock
        self._pending: list[str] = []
        self._pending_chars = 0
        self._last_flush = clock()
        self.lines_written = 0
        if self._path is not None:
            self._fd = self._open(self._path)

    @staticmethod
    def _open(path: str) -> int:
        """Open for appending, creating the file and any missing directory (0750:
        systemd's LogsDirectory= makes it, and a daemon run by hand should not
        fail for want of it)."""
        os.makedirs(os.path.dirname(path) or ".", mode=0o750, exist_ok=True)
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)

    def log(
        self,
        *,
        client_ip: str | None,
        method: str | None,
        host: str | None,
        path: str | None,
        status: int,
        bytes_in: int,
        bytes_out: int,
        duration_ms: float,
        upstream_ms: float | None = None,
        edge_id: str | None = None,
        origin: str | None = None,
        request_id: str | None = None,
        **extra: Any,
    ) -> None:
        """Record one request; keys beyond the fixed ones go after them."""
        if self._closed:
            raise ValueError("access log is closed")
        now = self._clock()
        record = {
            "ts": rfc3339(now),
            "client_ip": client_ip,
            "method": method,
            "host": host,
            "path": path,
            "status": status,
            "bytes_in": bytes_in,
            "bytes_out": bytes_out,
            "duration_ms": round(duration_ms, 3),
            "upstream_ms": None if upstream_ms is None else round(upstream_ms, 3),
            "edge_id": self.edge_id if edge_id is None else edge_id,
            "origin": origin,
            "request_id": request_id,
        }
        if extra:
            record.update(extra)
        line = _encode(record) + "\n"
        self._pending.append(line)
        self._pending_chars += len(line)
        self.lines_written += 1
        if (
            self._pending_chars >= self._buffer_bytes
            or now - self._last_flush >= self._flush_interval_s
        ):
            self.flush()

    def flush(self) -> None:
        """Write what is pending, in one system call for files."""
        if self._closed:
            raise ValueError("access log is closed")
        self._last_flush = self._clock()
        if not self._pending:
            return
        chunk = "".join(self._pending)
        self._pending.clear()
        self._pending_chars = 0
        if self._stream is not None:
            self._stream.write(chunk)
            self._stream.flush()
            return
        data = memoryview(chunk.encode("utf-8"))
        while data:  # a regular file takes it all at once; a pipe may not
            data = data[os.write(self._fd, data) :]

    def reopen(self) -> None:
        """Flush, then reopen the file by name (after logrotate renamed it)."""
        if self._closed:
            return
        self.flush()
        if self._path is None:
            return
        new_fd = self._open(self._path)
        old_fd, self._fd = self._fd, new_fd
        if old_fd >= 0:
            os.close(old_fd)

    def close(self) -> None:
        """Flush and close the file; a stream target is flushed, not closed."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> AccessLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
