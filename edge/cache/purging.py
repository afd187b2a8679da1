"""Dropping stored responses on purpose: purges (by URL, prefix, tag, all) and
invalidation after unsafe requests (RFC 9111 §4.4), in a worker's own store
and in the tier its edge's workers share (:mod:`edge.cache.shared`).

An invalidation reaches the worker whose request caused it; with a shared
tier it also leaves a mark there, which every worker reads once a sweep
(:meth:`Purger.apply_shared_invalidations`) to drop its own copy. A purge
reaches every worker by itself (the admin API and the origin's CONTROL
message ask each one).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from edge.cache.config import CacheKeyConfig
from edge.cache.keys import normalise_url
from edge.cache.lookup import CacheCounters
from edge.cache.policy import invalidates
from edge.cache.shared import SharedTier
from edge.cache.store import CacheStore

__all__ = ["Purger"]


class Purger:
    """Purges and invalidations of one worker's cache; see the module docstring."""

    __slots__ = ("_counters", "_invalidations_read", "_key_config", "_shared", "_store")

    def __init__(
        self,
        store: CacheStore,
        shared: SharedTier | None,
        key_config: CacheKeyConfig,
        counters: CacheCounters,
    ) -> None:
        self._store = store
        self._shared = shared
        self._key_config = key_config
        self._counters = counters
        self._invalidations_read = time.time()

    def purge(self, kind: str, values: tuple[str, ...] = ()) -> int:
        """Drop entries by ``url``, ``prefix``, ``tag`` or ``all``
        (geoedge.cache_purge); how many this worker held."""
        count = sum(self._purge_one(kind, value) for value in values) if values else 0
        if kind == "all":
            count = self._store.purge_all()
            if self._shared is not None:
                self._shared.purge_all()
        self._counters.purged += count
        return count

    def _purge_one(self, kind: str, value: str) -> int:
        store, shared = self._store, self._shared
        if kind == "url":
            url = normalise_url(value, self._key_config)
            count = store.purge_url(url)
            if shared is not None:
                shared.purge_url(url)
        elif kind == "prefix":
            prefix = normalise_url(value, self._key_config)
            count = store.purge_prefix(prefix)
            if shared is not None:
                shared.purge_prefix(prefix)
        elif kind == "tag":
            count = store.purge_tag(value)
            if shared is not None:
                shared.purge_tag(value)
        else:
            raise ValueError(f"unknown purge kind {kind!r}")
        return count

    def invalidate(
        self, method: bytes, status: int, url: str, fields: Sequence[tuple[bytes, bytes]]
    ) -> None:
        """An unsafe request to ``url`` was answered ``status`` with ``fields`` (§4.4)."""
        for target in invalidates(method, status, url, fields):
            normal = normalise_url(target, self._key_config)
            self._store.purge_url(normal)
            if self._shared is not None:
                self._shared.purge_url(normal)
                self._shared.note_invalidation(normal)

    def apply_shared_invalidations(self) -> None:
        """Drop what other workers invalidated since the last call (the worker's sweep)."""
        if self._shared is None:
            return
        now = time.time()
        for url in self._shared.invalidated_since(self._invalidations_read):
            self._store.purge_url(url)
        self._invalidations_read = now - 1.0  # a mark written as we read: read it again
