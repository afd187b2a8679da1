"""The responses a worker holds: a byte limit, LRU eviction, variants, purge indexes.

:class:`CacheStore` is plain data structures and no I/O. Entries are found by
primary key (:mod:`edge.cache.keys`), each key holding up to
``max_variants`` variants (responses that differ by their ``Vary`` fields,
RFC 9111 §4.1: the newest first). Every entry is in one recency order; when
the octets held (:attr:`StoredResponse.size`, overheads included) pass
``max_bytes``, the least recently used entries go until they fit. An entry
larger than ``max_bytes`` is not kept at all.

Purge indexes: URL → keys (purge by URL and prefix; a key may add a header
or a cookie to the URL) and tag → entries (``Surrogate-Key`` /
``Cache-Tag``).

Invariants: an entry is in ``_by_key`` iff it is in ``_recency``; its tags
index it iff it is held; ``bytes_held`` is the sum of the held entries'
sizes, never above ``max_bytes`` after a call returns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from edge.cache.entry import StoredResponse, VaryValues

__all__ = ["CacheStore", "StoreStatistics"]


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    entries: int
    bytes_held: int
    max_bytes: int
    evictions: int


class CacheStore:
    """A worker's stored responses; see the module docstring."""

    __slots__ = (
        "_by_key",
        "_by_tag",
        "_by_url",
        "_recency",
        "bytes_held",
        "evictions",
        "max_bytes",
        "max_variants",
        "on_evict",
    )

    def __init__(self, max_bytes: int, max_variants: int = 16) -> None:
        if max_bytes < 0 or max_variants < 1:
            raise ValueError("max_bytes >= 0 and max_variants >= 1")
        self.max_bytes = max_bytes
        self.max_variants = max_variants
        self._by_key: dict[str, list[StoredResponse]] = {}
        self._by_url: dict[str, set[str]] = {}
        self._by_tag: dict[str, set[StoredResponse]] = {}
        self._recency: OrderedDict[StoredResponse, int] = OrderedDict()
        self.bytes_held = 0
        self.evictions = 0
        self.on_evict: Callable[[StoredResponse], None] | None = None

    def __len__(self) -> int:
        return len(self._recency)

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(len(self._recency), self.bytes_held, self.max_bytes, self.evictions)

    # -- lookups -----------------------------------------------------------------------

    def variants(self, key: str) -> list[StoredResponse]:
        """The variants stored under ``key``, the newest first (may be empty)."""
        return self._by_key.get(key, [])

    def touch(self, entry: StoredResponse) -> None:
        """``entry`` was used: it is now the most recently used."""
        if entry in self._recency:
            self._recency.move_to_end(entry)

    def holds(self, entry: StoredResponse) -> bool:
        return entry in self._recency

    # -- changes -----------------------------------------------------------------------

    def put(self, entry: StoredResponse) -> bool:
        """Keep ``entry`` (replacing the variant with the same ``Vary`` values);
        False when it is larger than the whole store."""
        size = entry.size
        existing = self._by_key.get(entry.key, [])
        for old in [v for v in existing if v.vary == entry.vary]:
            self.remove(old)
        if size > self.max_bytes:
            return False
        variants = self._by_key.setdefault(entry.key, [])
        variants.insert(0, entry)
        while len(variants) > self.max_variants:
            self._evict(variants[-1])
        self._recency[entry] = size
        self.bytes_held += size
        self._by_url.setdefault(entry.url, set()).add(entry.key)
        for tag in entry.tags:
            self._by_tag.setdefault(tag, set()).add(entry)
        self._fit()
        return True

    def resize(self, entry: StoredResponse) -> None:
        """``entry`` changed in size (a coding added, fields updated): recount it."""
        old = self._recency.get(entry)
        if old is None:
            return
        size = entry.size
        self._recency[entry] = size
        self.bytes_held += size - old
        if size > self.max_bytes:
            self._evict(entry)
            return
        self._fit()

    def replace_tags(self, entry: StoredResponse, tags: frozenset[str]) -> None:
        if entry in self._recency:
            self._untag(entry)
            for tag in tags:
                self._by_tag.setdefault(tag, set()).add(entry)
        entry.tags = tags

    def remove(self, entry: StoredResponse) -> bool:
        size = self._recency.pop(entry, None)
        if size is None:
            return False
        self.bytes_held -= size
        variants = self._by_key.get(entry.key)
        if variants is not None:
            variants.remove(entry)
            if not variants:
                del self._by_key[entry.key]
                keys = self._by_url.get(entry.url)
                if keys is not None:
                    keys.discard(entry.key)
                    if not keys:
                        del self._by_url[entry.url]
        self._untag(entry)
        return True

    def remove_variant(self, key: str, vary: VaryValues) -> None:
        for entry in list(self.variants(key)):
            if entry.vary == vary:
                self.remove(entry)

    # -- invalidation and purge ----------------------------------------------------------

    def invalidate_key(self, key: str) -> int:
        """Drop every variant of ``key``; how many were held."""
        return self._drop(list(self.variants(key)))

    def purge_url(self, url: str) -> int:
        """Drop every entry stored for ``url`` (whatever a key adds to it)."""
        keys = list(self._by_url.get(url, ()))
        return self._drop([e for key in keys for e in self.variants(key)])

    def purge_prefix(self, prefix: str) -> int:
        urls = [url for url in self._by_url if url.startswith(prefix)]
        keys = [key for url in urls for key in self._by_url.get(url, ())]
        return self._drop([e for key in keys for e in self.variants(key)])

    def purge_tag(self, tag: str) -> int:
        return self._drop(list(self._by_tag.get(tag, ())))

    def purge_all(self) -> int:
        return self._drop(list(self._recency))

    # -- internals ----------------------------------------------------------------------

    def _drop(self, entries: Iterable[StoredResponse]) -> int:
        return sum(1 for entry in list(entries) if self.remove(entry))

    def _untag(self, entry: StoredResponse) -> None:
        for tag in entry.tags:
            held = self._by_tag.get(tag)
            if held is not None:
                held.discard(entry)
                if not held:
                    del self._by_tag[tag]

    def _evict(self, entry: StoredResponse) -> None:
        if self.remove(entry):
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(entry)

    def _fit(self) -> None:
        recency = self._recency
        while self.bytes_held > self.max_bytes and recency:
            self._evict(next(iter(recency)))
