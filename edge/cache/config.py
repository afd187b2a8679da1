"""The cache's and the compressor's configuration: the ``[cache]`` and
``[compression]`` tables of ``edge.toml`` (frozen typed data, one docstring
per field, units in the names; defaults written here and in
``deploy/config/cache.example.toml``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["ENCODINGS", "CacheConfig", "CacheKeyConfig", "CompressionConfig"]

ENCODINGS = ("zstd", "br", "gzip")
"""The content codings the edge can apply (RFC 8878, RFC 7932, RFC 1952)."""

_FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _check_field_names(what: str, names: tuple[str, ...]) -> None:
    for name in names:
        if not _FIELD_NAME.fullmatch(name):
            raise ValueError(f"{what}: {name!r} is not a field name")


@dataclass(frozen=True, slots=True)
class CacheKeyConfig:
    """What makes two requests the same stored response. By default: scheme,
    authority (Host, lowercased) and the path and query as sent."""

    ignore_query_params: tuple[str, ...] = ()
    """Query parameters left out of the key (``utm_source``; ``utm_*``: every
    name starting ``utm_``). The origin still receives them."""
    sort_query: bool = False
    """Sort the query's parameters in the key, so ``?a=1&b=2`` and ``?b=2&a=1``
    are one entry."""
    headers: tuple[str, ...] = ()
    """Request fields whose values are added to the key (each value its own entry)."""
    cookies: tuple[str, ...] = ()
    """Cookie names whose values are added to the key (a site's language or
    currency cookie). Any other cookie makes no difference to the key: it is
    the origin that marks a personal response ``private``."""

    def __post_init__(self) -> None:
        _check_field_names("headers", self.headers)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """A shared HTTP cache in each edge worker (RFC 9111); see docs/cache.md."""

    enabled: bool = False
    """Store and serve cacheable responses at the edge."""
    max_bytes: int = 256 * 1024 * 1024
    """Memory one worker's cache may hold (bodies, fields and a fixed overhead
    per entry); past it the least recently used entries go."""
    max_object_bytes: int = 8 * 1024 * 1024
    """A response larger than this is passed, never stored."""
    max_variants: int = 16
    """Variants kept per URL (responses that differ by the fields their
    ``Vary`` names); past it the oldest goes."""
    heuristic_fraction: float = 0.1
    """A response with ``Last-Modified`` but no explicit freshness is fresh for
    this fraction of its age (RFC 9111 §4.2.2)..."""
    heuristic_max_s: float = 86_400.0
    """... at most this long."""
    stale_if_error_s: float = 60.0
    """When the origin cannot answer (no tunnel, reset, timeout, a 5xx), a stale
    response without a ``stale-if-error`` of its own may be served for this
    long past its freshness (RFC 9111 §4.2.4), unless it says
    must-revalidate, proxy-revalidate, s-maxage or no-cache. 0: never."""
    targeted_fields: tuple[str, ...] = ("CDN-Cache-Control", "Surrogate-Control")
    """Fields that, when present, replace ``Cache-Control`` for this cache
    (RFC 9213), the first found wins. Empty: ``Cache-Control`` only."""
    collapse: bool = True
    """One fetch per key in flight: other requests for it wait for that
    response and share it (nginx's proxy_cache_lock, Varnish's waiting list)."""
    hit_for_pass_s: float = 120.0
    """After a response that could not be stored, requests for its key go to
    the origin at once, without waiting on each other, for this long."""
    honour_request_no_cache: bool = True
    """A request's ``Cache-Control: no-cache`` / ``max-age=0`` (a browser's
    reload) revalidates with the origin (RFC 9111 §5.2.1); false: the edge
    serves what it holds (Cloudflare's default), sparing the origin."""
    bypass_path_prefixes: tuple[str, ...] = ()
    """Requests whose path starts with one of these are neither looked up nor stored."""
    bypass_headers: tuple[str, ...] = ()
    """Requests carrying one of these fields are neither looked up nor stored."""
    tag_fields: tuple[str, ...] = ("Surrogate-Key", "Cache-Tag")
    """Response fields listing purge tags (space- or comma-separated)."""
    strip_tag_fields: bool = True
    """Remove the tag fields before the client sees the response."""
    status_name: str = ""
    """The cache's name in ``Cache-Status`` (RFC 9211); empty: the edge's id."""
    shared_dir: str = ""
    """A directory the edge's workers share (on tmpfs: ``/dev/shm/geoedge-cache``):
    what one worker stores, the others find there when their own cache has
    nothing (edge/cache/shared.py). Empty: each worker's cache alone."""
    shared_max_bytes: int = 1024 * 1024 * 1024
    """What the shared directory may hold, oldest written out first."""
    key: CacheKeyConfig = field(default_factory=CacheKeyConfig)

    def __post_init__(self) -> None:
        if self.max_bytes < 0 or self.max_object_bytes < 0 or self.shared_max_bytes < 0:
            raise ValueError("max_bytes and max_object_bytes must be >= 0")
        if self.max_variants < 1:
            raise ValueError("max_variants must be at least 1")
        if not 0 <= self.heuristic_fraction <= 1 or self.heuristic_max_s < 0:
            raise ValueError("heuristic_fraction must be in 0..1 and heuristic_max_s >= 0")
        if self.stale_if_error_s < 0 or self.hit_for_pass_s < 0:
            raise ValueError("stale_if_error_s and hit_for_pass_s must be >= 0")
        _check_field_names("targeted_fields", self.targeted_fields)
        _check_field_names("bypass_headers", self.bypass_headers)
        _check_field_names("tag_fields", self.tag_fields)
        if self.status_name and not _FIELD_NAME.fullmatch(self.status_name):
            raise ValueError("status_name must be a token (letters, digits, -._)")


@dataclass(frozen=True, slots=True)
class CompressionConfig:
    """Compression of responses at the edge (for clients that accept it)."""

    enabled: bool = False
    """Compress compressible responses the origin sent uncompressed."""
    encodings: tuple[str, ...] = ENCODINGS
    """Codings offered, the edge's preference first (a client's q-values
    come before it)."""
    min_bytes: int = 1024
    """Bodies shorter than this (by Content-Length) are sent as they are."""
    types: tuple[str, ...] = (
        "text/*",
        "application/javascript",
        "application/json",
        "application/xml",
        "application/wasm",
        "application/manifest+json",
        "image/svg+xml",
        "font/ttf",
        "font/otf",
    )
    """Media types compressed (``text/*``: every subtype); ``+json`` and ``+xml`` always are."""
    zstd_level: int = 3
    """zstd level (1..19): see docs/cache.md for the measured CPU per MB."""
    brotli_level: int = 4
    """brotli quality (0..11)."""
    gzip_level: int = 6
    """gzip level (1..9)."""

    def __post_init__(self) -> None:
        unknown = set(self.encodings) - set(ENCODINGS)
        if unknown or len(set(self.encodings)) != len(self.encodings):
            raise ValueError(f"encodings: each of {', '.join(ENCODINGS)} at most once")
        if self.min_bytes < 0:
            raise ValueError("min_bytes must be >= 0")
        if not (1 <= self.zstd_level <= 19 and 0 <= self.brotli_level <= 11):
            raise ValueError("zstd_level must be 1..19 and brotli_level 0..11")
        if not 1 <= self.gzip_level <= 9:
            raise ValueError("gzip_level must be 1..9")
