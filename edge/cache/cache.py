"""A worker's HTTP cache: where an exchange's request is looked up and its
response kept. The one object the exchange's seam talks to.

:meth:`EdgeCache.admit` is called once per exchange before it opens a
stream (``edge.exchange.Exchange.start``). It returns True when the cache
took the exchange — served it from a stored response, or made it wait for a
fetch already in flight — and False when the exchange is to go to the
origin, having put a client of its own in front of the front end's when it
has something to do with the answer (:class:`edge.cache.fill.Fill`: store,
compress, freshen, stand in; :class:`edge.cache.relay.Invalidator`).

Per request (RFC 9111 §4; the decisions are :mod:`edge.cache.policy`'s):

- not GET or HEAD: unsafe methods invalidate on success (§4.4); nothing else;
- bypassed (configured path prefixes or fields, a body, a WebSocket): go up,
  compressed if it may be;
- a stored variant (§4.1) that is fresh: a hit; stale within
  ``stale-while-revalidate``: a hit, and one revalidation in the background
  (RFC 5861); otherwise revalidate it (conditionally when it has
  validators), serving it stale if the origin fails (§4.2.4);
- nothing stored: a miss. **Collapsing**: a plain GET whose key is being
  fetched already waits for that fetch (``collapse``) and is then served
  from what it stored; once the fetch's response head says it will not be
  stored (or its body outgrows ``max_object_bytes``), the waiters go to the
  origin at once, each on its own, and so do later requests for the key for
  ``hit_for_pass_s`` (hit-for-pass: they would only queue behind each
  other; with a shared tier the mark reaches the other workers and outlives
  a restart or a reload). A request with its own conditions or a ``Range``
  never waits: its answer is not the shared one.

Per worker, shared nothing (DESIGN principle 9): docs/cache.md gives the
measured hit ratios of per-worker and shared caches and why.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from edge.cache.compress import compress_whole, compressible, negotiate
from edge.cache.conditions import freshened_fields, validators
from edge.cache.config import CacheConfig, CompressionConfig
from edge.cache.entry import NOT_STORED, StoredResponse
from edge.cache.fill import Fill
from edge.cache.freshness import FreshnessRules, ResponseFacts, freshness_lifetime, initial_age
from edge.cache.keys import CacheKey, KeyMaker
from edge.cache.lookup import CacheCounters, Lookup, PassMarks
from edge.cache.policy import (
    SAFE_METHODS,
    RequestFacts,
    Reuse,
    reuse,
    variant_matches,
    vary_values,
)
from edge.cache.purging import Purger
from edge.cache.relay import Invalidator, NullClient
from edge.cache.responses import PlainHit, Reply, plain_hit, serve, stored_reply, with_vary
from edge.cache.shared import SharedTier
from edge.cache.store import CacheStore
from edge.http1.request_head import EDGE_SET_FIELDS

if TYPE_CHECKING:
    from edge.http1 import RequestHeadReceived, ResponseHeadReceived

__all__ = ["CacheCounters", "EdgeCache", "Lookup"]  # the last two: edge.cache.lookup

#: Distinct Accept-Encoding values whose coding is kept (EdgeCache._coding).
_CODINGS_KEPT = 256

#: Request fields that take a request off the plain-hit path (EdgeCache.plain_hit):
#: its own directives (§5.2.1), credentials (§3.5), a range (§3.4).
_REQUEST_DIRECTIVES = frozenset({b"cache-control", b"pragma", b"authorization", b"range"})

_CONDITIONAL = frozenset(
    {
        b"if-none-match",
        b"if-modified-since",
        b"if-match",
        b"if-unmodified-since",
        b"if-range",
        b"range",
    }
)


class EdgeCache:
    """A worker's cache and compressor; see the module docstring."""

    def __init__(
        self,
        config: CacheConfig,
        compression: CompressionConfig,
        name: str,
        *,
        response_timeout_s: float = 60.0,
    ) -> None:
        self.config = config
        self.compression = compression
        self.enabled = config.enabled
        self.status_name = (config.status_name or name).encode("ascii", "replace")
        self.store = CacheStore(config.max_bytes, config.max_variants)
        self.keys = KeyMaker(config.key)
        self.freshness = FreshnessRules(
            config.heuristic_fraction,
            config.heuristic_max_s,
            tuple(name.lower().encode("ascii") for name in config.targeted_fields),
        )
        self.tag_fields = tuple(name.lower().encode("ascii") for name in config.tag_fields)
        self.hidden_fields = frozenset(self.tag_fields if config.strip_tag_fields else ())
        self._bypass_fields = frozenset(
            name.lower().encode("ascii") for name in config.bypass_headers
        )
        self._bypass_prefixes = tuple(config.bypass_path_prefixes)
        # A request's client_fields lack the fields the edge sets: when the
        # key or a bypass rule reads one, only its full headers decide.
        self._plain = self.enabled and not (
            (self._bypass_fields | set(self.keys.header_names)) & EDGE_SET_FIELDS
        )
        self.response_timeout_s = response_timeout_s
        self.shared = (
            SharedTier(config.shared_dir, config.shared_max_bytes, self.freshness)
            if config.enabled and config.shared_dir
            else None
        )
        self.fills: dict[str, Fill] = {}
        self.passes = PassMarks(config.hit_for_pass_s)
        self.counters = CacheCounters()
        self._codings: dict[bytes, str | None] = {}  # Accept-Encoding value -> coding
        self.purger = Purger(self.store, self.shared, config.key, self.counters)

    # -- the exchange's seam -------------------------------------------------------------

    def admit(self, exchange: Any, *, collapse: bool | None = None) -> bool:
        """Take ``exchange`` (True: served or waiting) or prepare it to go up
        (False). ``collapse``: may it wait for a fetch in flight (default: the
        configuration's)."""
        request: RequestHeadReceived = exchange.request
        method = request.method
        if request.websocket_upgrade is not None:
            return False
        if method not in (b"GET", b"HEAD"):
            if self.enabled and method not in SAFE_METHODS:
                exchange.client = Invalidator(
                    exchange.client, lambda head: self._invalidate(exchange, head)
                )
            return False
        fields = request.headers
        compression = self.compression
        lookup = Lookup(
            key=None,
            request=RequestFacts.of(method, fields),
            fields=fields,
            coding=self._coding(fields) if compression.enabled else None,
            fwd="bypass",
            head_only=method == b"HEAD",
            frame_h1=not exchange.decode_chunked,
            http10=request.http_version == b"1.0",
        )
        if not self.enabled or request.expects_body or self._bypassed(request, fields):
            if compression.enabled and method == b"GET":
                lookup.bypass = True
                lookup.why_not_stored = "bypass"
                self._go_up(exchange, lookup)
            exchange.record.cache = "bypass" if self.enabled else ""
            return False
        target = request.target.decode("latin-1")
        lookup.key = self.keys.make("https", request.host, target, fields)
        return self._lookup(
            exchange, lookup, self.config.collapse if collapse is None else collapse
        )

    def plain_hit(self, request: RequestHeadReceived) -> PlainHit | None:
        """The reply to ``request`` when it is the common hit — a GET or HEAD
        with no body, no condition, range, cache directive or credentials,
        whose variant here is fresh (and, for a coding the client accepts,
        compressed already) — for a front end to write without an exchange
        (:mod:`edge.front_h1_requests`, :mod:`edge.front_h2_requests`); None:
        anything else, which :meth:`admit` decides. What is sent and counted
        is what :meth:`admit` would send and count (a differential test holds
        the two to each other: tests/unit/test_edge_plain_hits.py)."""
        method = request.method
        if (
            not self._plain
            or (method != b"GET" and method != b"HEAD")
            or request.expects_body
            or request.websocket_upgrade is not None
        ):
            return None
        fields = request.client_fields  # what admit would read in its headers, but for
        for name, _ in fields:  # the fields the edge sets (see self._plain)
            if name[:3] == b"if-" or name in _REQUEST_DIRECTIVES:
                return None
        if self._bypassed(request, fields):
            return None
        key = self.keys.make("https", request.host, request.target.decode("latin-1"), fields)
        entry = next((v for v in self.store.variants(key.key) if variant_matches(v, fields)), None)
        if entry is None or b"no-cache" in entry.facts.control or _varies_on_edge_fields(entry):
            return None
        now = time.time()
        age_s = entry.age(now)
        if age_s >= entry.lifetime:
            return None  # stale: served, revalidated or not, as admit says
        head_only = method == b"HEAD"
        coding = ""
        if not head_only and self._compressible(entry):
            coding = self._coding(fields) or ""
            if coding and coding not in entry.encoded:
                return None  # its first such hit: admit compresses it and keeps it
        self.store.touch(entry)
        entry.hits += 1
        self.counters.hits += 1
        age = b"%d" % max(0, int(age_s))
        cache_status = self.status_name + b"; hit; ttl=%d" % int(entry.ttl(now))
        hit = plain_hit(entry, head_only, age, cache_status, self.hidden_fields, coding)
        self.counters.bytes_served += len(hit.body)
        return hit

    def _compressible(self, entry: StoredResponse) -> bool:
        """May ``entry`` be sent compressed (asked once per entry's fields)?"""
        config = self.compression
        if not config.enabled:
            return False
        if entry.compressible is None:
            entry.compressible = compressible(entry.status, entry.headers, config)
        return entry.compressible

    def _coding(self, fields: Any) -> str | None:
        """The coding a request with ``fields`` gets (edge.cache.compress.negotiate),
        kept per ``Accept-Encoding`` value: browsers send a handful of them."""
        accepted = [value for name, value in fields if name == b"accept-encoding"]
        if len(accepted) != 1:
            return negotiate(fields, self.compression.encodings)
        codings = self._codings
        value = accepted[0]
        if value not in codings:
            if len(codings) >= _CODINGS_KEPT:
                codings.clear()
            codings[value] = negotiate(fields, self.compression.encodings)
        return codings[value]

    def resume(self, exchange: Any, *, collapse: bool) -> None:
        """A request that waited for a fetch: served from what it stored, or up itself."""
        if exchange.finished:
            return
        if not self.admit(exchange, collapse=collapse):
            exchange.forward()

    # -- lookups ------------------------------------------------------------------------

    def _lookup(self, exchange: Any, lookup: Lookup, collapse: bool) -> bool:
        key = lookup.key
        assert key is not None
        variants = self.store.variants(key.key)
        entry = next((v for v in variants if variant_matches(v, lookup.fields)), None)
        if entry is None and self.shared is not None:
            entry = self._from_shared(key, lookup)
        request = lookup.request
        now = time.time()
        if entry is not None:
            decision = reuse(
                entry, request, now, honour_no_cache=self.config.honour_request_no_cache
            )
            if decision is not Reuse.VALIDATE:
                self.store.touch(entry)
                stale = decision is Reuse.STALE_WHILE_REVALIDATE
                detail = b"; detail=stale-while-revalidate" if stale else b""
                reply = self.reply(lookup, entry, status=b"hit" + detail)
                exchange.record.cache = "stale" if stale else "hit"
                self.counters.hits += 1
                if stale:
                    self.counters.stale_served += 1
                self._served(exchange, reply, entry)
                if stale and key.key not in self.fills:
                    self._revalidate_in_background(exchange, lookup, entry)
                return True
            lookup.fwd = "request" if request.no_cache else "stale"
            lookup.stale = entry
            self._validate(exchange, lookup, entry)
            return False
        if variants and lookup.fwd == "bypass":
            lookup.fwd = "vary-miss"
        elif lookup.fwd == "bypass":
            lookup.fwd = "uri-miss"
        plain = request.method == b"GET" and not request.conditional and request.range is None
        leader = self.fills.get(key.key)
        if collapse and plain and leader is not None and not self._passing(key.key, now):
            leader.waiters.append(exchange)
            exchange.record.cache = "collapsed"
            self.counters.collapsed_waits += 1
            return True
        self.counters.misses += 1
        fill = self._go_up(exchange, lookup)
        if plain and leader is None and not self.passes.passing(key.key, now):
            self.fills[key.key] = fill
        return False

    def _from_shared(self, key: CacheKey, lookup: Lookup) -> StoredResponse | None:
        """A variant another worker stored (edge.cache.shared), now kept here too."""
        assert self.shared is not None
        for candidate in self.shared.variants(key.url, key.key):
            if variant_matches(candidate, lookup.fields) and self.store.put(candidate):
                self.counters.shared += 1
                return candidate
        return None

    def forget(self, entry: StoredResponse) -> None:
        """Drop ``entry`` here and from the shared tier (the origin replaced it)."""
        self.store.remove(entry)
        if self.shared is not None:
            self.shared.remove(entry)

    def _validate(self, exchange: Any, lookup: Lookup, entry: StoredResponse) -> None:
        """Send the request up with ``entry``'s validators instead of the client's conditions."""
        self.counters.misses += 1
        checks = validators(entry)
        lookup.validating = bool(checks)
        request: RequestHeadReceived = exchange.request
        kept = [(n, v) for n, v in request.headers if n not in _CONDITIONAL]
        line = b"%s %s HTTP/%s\r\n" % (request.method, request.target, request.http_version)
        head = line + b"".join(n + b": " + v + b"\r\n" for n, v in (*kept, *checks)) + b"\r\n"
        exchange.replace_head(head)
        fill = self._go_up(exchange, lookup)
        key = lookup.key
        if key is not None and key.key not in self.fills:
            self.fills[key.key] = fill

    def _revalidate_in_background(
        self, exchange: Any, lookup: Lookup, entry: StoredResponse
    ) -> None:
        """RFC 5861 §3: refresh ``entry`` while it is served stale; nobody waits."""
        sibling = exchange.sibling(NullClient())
        background = Lookup(
            key=lookup.key,
            request=lookup.request,
            fields=lookup.fields,
            coding=None,
            fwd="stale",
            head_only=False,
            frame_h1=False,
            http10=False,
        )
        background.stale = entry
        self._validate(sibling, background, entry)
        asyncio.get_running_loop().call_later(
            self.response_timeout_s, lambda: sibling.finished or sibling.time_out()
        )
        sibling.forward()

    def _go_up(self, exchange: Any, lookup: Lookup) -> Fill:
        exchange.frame_h1 = lookup.frame_h1
        exchange.decode_chunked = True
        fill = Fill(self, exchange.client, lookup)
        exchange.client = fill
        return fill

    def _served(self, exchange: Any, reply: Reply, entry: StoredResponse) -> None:
        entry.hits += 1
        self.counters.bytes_served += len(reply.body)
        serve(exchange, exchange.client, reply)

    # -- what fills report ----------------------------------------------------------------

    def reply(
        self, lookup: Lookup, entry: StoredResponse, *, status: bytes, extra: Any = ()
    ) -> Reply:
        """``entry`` as this request's reply, compressed for it if it may be
        (the coded body made once and kept with the entry)."""
        now = time.time()
        ttl = int(entry.ttl(now))
        cache_status = self.status_name + b"; " + status + b"; ttl=%d" % ttl
        coding, encoded = lookup.coding, None
        config = self.compression
        if self._compressible(entry):
            if coding is not None and not lookup.head_only:
                encoded = entry.encoded.get(coding)
                if encoded is None:
                    encoded = compress_whole(coding, entry.body, config)
                    entry.encoded[coding] = encoded
                    self.store.resize(entry)
        else:
            coding = None
        return stored_reply(
            entry,
            lookup.fields,
            head_only=lookup.head_only,
            now=now,
            cache_status=cache_status,
            coding=coding,
            encoded=encoded,
            extra=extra,
            hidden=self.hidden_fields,
        )

    def keep(
        self,
        fill: Fill,
        head: ResponseHeadReceived,
        facts: ResponseFacts,
        body: bytes,
        encoded: tuple[str, bytes] | None,
    ) -> StoredResponse | None:
        """Store a complete storable response; the entry, or None if it did not fit."""
        lookup = fill.lookup
        key = lookup.key
        if key is None:
            return None
        fields = [
            (n, v) for n, v in head.headers if n not in NOT_STORED and n not in head.nominated
        ]
        if self.compression.enabled and compressible(head.status, fields, self.compression):
            fields = with_vary(fields, b"Accept-Encoding")
        entry = StoredResponse(
            key=key.key,
            url=key.url,
            status=head.status,
            reason=head.reason,
            headers=fields,
            body=body,
            vary=vary_values(facts.vary, lookup.fields),
            request_time=fill.request_time,
            response_time=fill.response_time,
            initial_age=initial_age(facts, fill.request_time, fill.response_time),
            lifetime=freshness_lifetime(facts, fill.response_time, self.freshness),
            facts=facts,
            tags=self._tags(head.headers),
        )
        if encoded is not None:
            entry.encoded[encoded[0]] = encoded[1]
        if not self.store.put(entry):
            return None
        self.counters.stored += 1
        if self.shared is not None:
            self.shared.write(entry)
        return entry

    def freshen(
        self,
        entry: StoredResponse,
        head: ResponseHeadReceived,
        request_time: float,
        response_time: float,
    ) -> StoredResponse:
        """``entry`` updated by a 304 (RFC 9111 §4.3.4): its fields, age and lifetime."""
        fields = freshened_fields(
            entry.headers, [(n, v) for n, v in head.headers if n not in head.nominated]
        )
        facts = ResponseFacts.of(entry.status, fields, self.freshness)
        update = ResponseFacts.of(304, head.headers, self.freshness)
        entry.headers = fields
        entry.plain_heads.clear()
        entry.compressible = None
        entry.facts = facts
        entry.request_time = request_time
        entry.response_time = response_time
        entry.initial_age = initial_age(update, request_time, response_time)
        entry.lifetime = freshness_lifetime(facts, response_time, self.freshness)
        self.store.replace_tags(entry, self._tags(fields))
        self.store.resize(entry)
        self.store.touch(entry)
        if self.shared is not None:
            self.shared.write(entry)
        self.counters.revalidated += 1
        return entry

    def fill_refused(self, fill: Fill) -> None:
        """``fill``'s response will not be stored (its head says so, or its body
        outgrew ``max_object_bytes``): its key passes from now on, and the
        requests that waited for it go to the origin now, not after its body."""
        key = fill.lookup.key
        if key is None or fill.released:
            return
        fill.released = True
        if self.fills.get(key.key) is fill:
            del self.fills[key.key]
        self._mark_pass(key.key, time.time())
        waiters, fill.waiters = fill.waiters, []
        for waiter in waiters:
            self.resume(waiter, collapse=False)

    def fill_ended(self, fill: Fill) -> None:
        """``fill``'s exchange finished: its waiters' turn (unless
        :meth:`fill_refused` sent them on already)."""
        key = fill.lookup.key
        if key is None:
            return
        if self.fills.get(key.key) is fill:
            del self.fills[key.key]
        if fill.released:
            return
        # The leader's client went away mid-fetch: one waiter fetches for the
        # others again. Otherwise (stored, the origin failed) each goes its own
        # way at once, never in a queue behind another.
        stored = fill.stored is not None or fill.swallow
        again = not stored and fill.client_gone
        waiters, fill.waiters = fill.waiters, []
        for waiter in waiters:
            self.resume(waiter, collapse=again)

    def _mark_pass(self, key: str, now: float) -> None:
        """Hit-for-pass for ``key``; shared once the key was marked before (a
        URL asked once costs the shared tier nothing)."""
        again = self.passes.passing(key, now)
        if not self.passes.mark(key, now):
            return
        self.counters.passes += 1
        if again and self.shared is not None:
            self.shared.mark_pass(key, now + self.passes.seconds, now)

    def _passing(self, key: str, now: float) -> bool:
        """``key`` is marked hit-for-pass here, or in the shared tier (the mark
        is then kept here too)."""
        if self.passes.passing(key, now):
            return True
        until = None if self.shared is None else self.shared.pass_until(key, now)
        if until is None:
            return False
        self.passes.mark_until(key, until)
        return True

    # -- purge and invalidation (edge.cache.purging) -----------------------------------

    def purge(self, kind: str, values: tuple[str, ...] = ()) -> int:
        """Drop entries by ``url``, ``prefix``, ``tag`` or ``all``; how many went."""
        return self.purger.purge(kind, values)

    def apply_shared_invalidations(self) -> None:
        self.purger.apply_shared_invalidations()

    def _invalidate(self, exchange: Any, head: ResponseHeadReceived) -> None:
        request: RequestHeadReceived = exchange.request
        target = request.target.decode("latin-1")
        key = self.keys.make("https", request.host, target, request.headers)
        self.purger.invalidate(request.method, head.status, key.url, head.headers)

    # -- internals ------------------------------------------------------------------------

    def _bypassed(self, request: RequestHeadReceived, fields: Any) -> bool:
        if self._bypass_prefixes and request.target.decode("latin-1").startswith(
            self._bypass_prefixes
        ):
            return True
        bypass = self._bypass_fields
        return bool(bypass) and any(name in bypass for name, _ in fields)

    def _tags(self, fields: Any) -> frozenset[str]:
        tags: set[str] = set()
        for name, value in fields:
            if name in self.tag_fields:
                tags.update(value.decode("latin-1").replace(",", " ").split())
        return frozenset(tags)


def _varies_on_edge_fields(entry: StoredResponse) -> bool:
    """Does ``entry`` vary on a field the edge sets (so a request's
    ``client_fields`` alone cannot select it)?"""
    return bool(entry.vary) and any(name in EDGE_SET_FIELDS for name, _ in entry.vary)
