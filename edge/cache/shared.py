"""A tier the workers of one edge share: stored responses as files in one
directory (``[cache] shared_dir``; on tmpfs such as ``/dev/shm`` it is
memory every worker reads, and it outlives a restart).

Each worker keeps its own cache in memory (:mod:`edge.cache.store`); this
tier is where a worker looks when its own has nothing for a request, so a
URL one worker fetched serves the others too (``python -m
loadtests.cache_hit_ratio`` measures what per-worker caches lose without it:
10 points of hit ratio with two workers, a third with eight). What a worker
finds here it copies into its own cache (the hit after that costs no system
call).

Layout: ``<dir>/<hash of the URL>/<hash of key and variant>``, each file one
JSON line (status, fields, the request values of its ``Vary``, times,
tags) and the body after it, written to a temporary name and renamed (a
reader sees a whole file or none). Purge by URL removes a URL's directory;
by prefix, tag, or invalidation of a key, the files whose line says so.

An unsafe request's invalidation (RFC 9111 §4.4) reaches one worker; it
removes the shared copies and leaves a mark in ``<dir>/.invalidated`` that
every worker reads once a sweep (a second) to drop its own copy.

Hit-for-pass marks (:class:`edge.cache.lookup.PassMarks`) are shared too,
as empty files in ``<dir>/.passes`` whose modification time is when the mark
ends: a key whose responses cannot be stored does not make concurrent
requests queue behind each other in a worker that has not seen it yet, nor
in the workers that start after a restart or a reload (the first burst for
``/`` after a reload waited one origin round trip behind its first request:
+270 ms at 265 ms, ``make cold-burst``). Only a key marked again while its
mark holds is written (a URL asked once, such as an API call with an id in
its query, costs no file), and a mark is rewritten only once half of it has
passed, so an uncacheable URL costs a worker one file write a minute at most.

Bounds: ``shared_max_bytes``. A worker trims the directory, oldest written
first, at most once every :data:`TRIM_INTERVAL_S`, under an ``flock`` so
that one worker trims at a time. A failure to read or write (a full disk, a
permission) is logged once and turns the tier off in that worker: the
memory cache goes on alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edge.cache.entry import StoredResponse
from edge.cache.freshness import FreshnessRules, ResponseFacts

__all__ = ["PASS_MARKS_REMEMBERED", "TRIM_INTERVAL_S", "SharedTier"]

log = logging.getLogger("geoedge.edge")

TRIM_INTERVAL_S = 5.0
_LOCK = ".trim.lock"
_INVALIDATED = ".invalidated"
_PASSES = ".passes"
_SPECIAL = frozenset({_INVALIDATED, _PASSES})
"""Directories of marks, not of stored responses."""
INVALIDATION_KEPT_S = 120.0
"""How long an invalidation's mark stays for the other workers to read."""
PASS_MARKS_REMEMBERED = 10_000
"""Keys whose last shared pass mark a worker remembers (to skip rewriting it)."""


def _name(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def _encode(entry: StoredResponse) -> bytes:
    meta = {
        "key": entry.key,
        "url": entry.url,
        "status": entry.status,
        "reason": entry.reason.decode("latin-1"),
        "headers": [[n.decode("latin-1"), v.decode("latin-1")] for n, v in entry.headers],
        "vary": [
            [n.decode("latin-1"), None if v is None else v.decode("latin-1")] for n, v in entry.vary
        ],
        "request_time": entry.request_time,
        "response_time": entry.response_time,
        "initial_age": entry.initial_age if entry.initial_age != float("inf") else None,
        "lifetime": entry.lifetime,
        "tags": sorted(entry.tags),
    }
    return json.dumps(meta, separators=(",", ":")).encode() + b"\n" + entry.body


def _meta(path: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError), open(path, "rb") as file:
        return json.loads(file.readline())  # type: ignore[no-any-return]
    return None


class SharedTier:
    """One worker's view of the shared directory; see the module docstring."""

    __slots__ = ("_dir", "_next_trim", "_passes_written", "_rules", "max_bytes", "on")

    def __init__(self, directory: str, max_bytes: int, rules: FreshnessRules) -> None:
        self._dir = Path(directory)
        self.max_bytes = max_bytes
        self._rules = rules
        self._next_trim = 0.0
        self._passes_written: OrderedDict[str, float] = OrderedDict()
        self.on = True
        try:
            self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            self._fail("create", exc)

    def _fail(self, what: str, exc: OSError) -> None:
        log.error("shared cache tier off in this worker: cannot %s %s: %s", what, self._dir, exc)
        self.on = False

    def _url_dir(self, url: str) -> Path:
        return self._dir / _name(url)

    # -- reading ---------------------------------------------------------------------------

    def variants(self, url: str, key: str) -> Iterator[StoredResponse]:
        """The responses stored for ``key`` (of ``url``), as entries to keep."""
        if not self.on:
            return
        with contextlib.suppress(FileNotFoundError):
            for path in self._url_dir(url).iterdir():
                if path.name.startswith("."):
                    continue
                entry = self._read(path, key)
                if entry is not None:
                    yield entry

    def _read(self, path: Path, key: str) -> StoredResponse | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._fail("read", exc)
            return None
        line, _, body = data.partition(b"\n")
        try:
            meta = json.loads(line)
            if meta["key"] != key:
                return None
            headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in meta["headers"]]
            initial_age = meta["initial_age"]
            return StoredResponse(
                key=key,
                url=meta["url"],
                status=int(meta["status"]),
                reason=meta["reason"].encode("latin-1"),
                headers=headers,
                body=body,
                vary=tuple(
                    (n.encode("latin-1"), None if v is None else v.encode("latin-1"))
                    for n, v in meta["vary"]
                ),
                request_time=float(meta["request_time"]),
                response_time=float(meta["response_time"]),
                initial_age=float("inf") if initial_age is None else float(initial_age),
                lifetime=float(meta["lifetime"]),
                facts=ResponseFacts.of(int(meta["status"]), headers, self._rules),
                tags=frozenset(meta["tags"]),
            )
        except (ValueError, KeyError, TypeError):
            log.warning("shared cache tier: unreadable file %s removed", path)
            with contextlib.suppress(OSError):
                path.unlink()
            return None

    # -- writing ---------------------------------------------------------------------------

    def write(self, entry: StoredResponse) -> None:
        """Keep ``entry`` for the other workers (replacing the same variant)."""
        if not self.on:
            return
        directory = self._url_dir(entry.url)
        name = _name(entry.key + "\n" + repr(entry.vary))
        temporary = directory / f".{name}.{os.getpid()}"
        try:
            directory.mkdir(exist_ok=True)
            temporary.write_bytes(_encode(entry))
            os.replace(temporary, directory / name)
        except OSError as exc:
            self._fail("write", exc)
            with contextlib.suppress(OSError):
                temporary.unlink()
            return
        self.trim()

    # -- purging ---------------------------------------------------------------------------

    def remove(self, entry: StoredResponse) -> None:
        """One variant (the origin's new answer replaced it)."""
        if self.on:
            name = _name(entry.key + "\n" + repr(entry.vary))
            with contextlib.suppress(OSError):
                (self._url_dir(entry.url) / name).unlink()

    def purge_url(self, url: str) -> None:
        if self.on:
            shutil.rmtree(self._url_dir(url), ignore_errors=True)

    def remove_key(self, url: str, key: str) -> None:
        """Invalidation of ``key`` (§4.4): every variant of it."""
        self._remove_where(lambda meta: meta.get("key") == key, self._url_dir(url))

    def purge_prefix(self, prefix: str) -> None:
        self._remove_where(lambda meta: str(meta.get("url", "")).startswith(prefix))

    def purge_tag(self, tag: str) -> None:
        self._remove_where(lambda meta: tag in meta.get("tags", ()))

    def purge_all(self) -> None:
        if self.on:
            for path in self._dir.iterdir():
                if path.is_dir() and path.name not in _SPECIAL:
                    shutil.rmtree(path, ignore_errors=True)

    def _remove_where(self, matches: Any, only: Path | None = None) -> None:
        if not self.on:
            return
        directories = (
            [only]
            if only is not None
            else [p for p in self._dir.iterdir() if p.is_dir() and p.name not in _SPECIAL]
        )
        for directory in directories:
            with contextlib.suppress(FileNotFoundError):
                for path in directory.iterdir():
                    meta = None if path.name.startswith(".") else _meta(path)
                    if meta is not None and matches(meta):
                        with contextlib.suppress(OSError):
                            path.unlink()

    # -- invalidation, for the other workers' own caches -------------------------------------

    def note_invalidation(self, url: str) -> None:
        """Mark ``url`` invalidated (RFC 9111 §4.4) for the other workers, whose
        memory may hold it: each reads the marks once a sweep
        (:meth:`invalidated_since`) and drops what they name."""
        if not self.on:
            return
        marks = self._dir / _INVALIDATED
        try:
            marks.mkdir(exist_ok=True)
            temporary = marks / f".{_name(url)}.{os.getpid()}"
            temporary.write_text(url)
            os.replace(temporary, marks / _name(url))
        except OSError as exc:
            self._fail("mark an invalidation in", exc)

    def invalidated_since(self, since: float) -> list[str]:
        """URLs marked invalidated after ``since`` (a file time); old marks go."""
        if not self.on:
            return []
        found = []
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            for path in (self._dir / _INVALIDATED).iterdir():
                with contextlib.suppress(OSError):
                    mtime = path.stat().st_mtime
                    if mtime < now - INVALIDATION_KEPT_S:
                        path.unlink()
                    elif mtime >= since and not path.name.startswith("."):
                        found.append(path.read_text())
        return found

    # -- hit-for-pass marks -------------------------------------------------------------------

    def mark_pass(self, key: str, until: float, now: float) -> None:
        """Share the hit-for-pass mark of ``key`` (until ``until``, a wall-clock
        time), unless this worker wrote one that holds for more than half of
        the new one's time still."""
        if not self.on:
            return
        written = self._passes_written.get(key)
        if written is not None and written - now > (until - now) / 2:
            return
        path = self._dir / _PASSES / _name(key)
        try:
            path.parent.mkdir(exist_ok=True)
            path.touch()
            os.utime(path, (until, until))
        except OSError as exc:
            self._fail("mark a pass in", exc)
            return
        marks = self._passes_written
        marks[key] = until
        marks.move_to_end(key)
        while len(marks) > PASS_MARKS_REMEMBERED:
            marks.popitem(last=False)
        self.trim()

    def pass_until(self, key: str, now: float) -> float | None:
        """When the shared hit-for-pass mark of ``key`` ends, or None (no mark,
        or an ended one, which goes)."""
        if not self.on:
            return None
        path = self._dir / _PASSES / _name(key)
        try:
            until = path.stat().st_mtime
        except OSError:
            return None
        if until <= now:
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return until

    def _prune_passes(self, now: float) -> None:
        with contextlib.suppress(FileNotFoundError):
            for path in (self._dir / _PASSES).iterdir():
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime <= now:
                        path.unlink()

    # -- bounds ----------------------------------------------------------------------------

    def trim(self, now: float | None = None) -> None:
        """Oldest written first, until the files fit ``max_bytes``; one worker
        at a time, at most every :data:`TRIM_INTERVAL_S` per worker."""
        now = time.monotonic() if now is None else now
        if not self.on or now < self._next_trim:
            return
        self._next_trim = now + TRIM_INTERVAL_S
        try:
            with open(self._dir / _LOCK, "a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # another worker is trimming
                self._prune_passes(time.time())
                files = []
                for directory in self._dir.iterdir():
                    if directory.is_dir() and directory.name not in _SPECIAL:
                        for path in directory.iterdir():
                            with contextlib.suppress(FileNotFoundError):
                                stat = path.stat()
                                files.append((stat.st_mtime, stat.st_size, path))
                total = sum(size for _, size, _ in files)
                for _, size, path in sorted(files):
                    if total <= self.max_bytes:
                        break
                    with contextlib.suppress(OSError):
                        path.unlink()
                    total -= size
        except OSError as exc:
            self._fail("trim", exc)
