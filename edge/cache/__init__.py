"""The edge's HTTP cache (RFC 9111) and compression: see docs/cache.md.

Pure parts, each tested as tables and properties without sockets:
:mod:`.directives` (field syntax), :mod:`.freshness` (lifetime and age),
:mod:`.policy` (storable? reusable? which variant? what invalidates),
:mod:`.conditions` (validators, 304 merging, ranges), :mod:`.keys`,
:mod:`.compress` (negotiation, encoders), :mod:`.store` (bytes, LRU, purge
indexes), :mod:`.responses` (heads and replies built from stored responses).

The parts that touch an exchange: :mod:`.cache` (:class:`EdgeCache`, the one
object ``edge.exchange`` talks to), :mod:`.fill` and :mod:`.relay` (the
clients a cacheable exchange answers through).
"""

from edge.cache.cache import EdgeCache
from edge.cache.config import CacheConfig, CacheKeyConfig, CompressionConfig

__all__ = ["CacheConfig", "CacheKeyConfig", "CompressionConfig", "EdgeCache"]
