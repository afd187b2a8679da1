"""A response's freshness and age (RFC 9111 §4.2), as a shared cache computes them.

:class:`ResponseFacts` reads a response's fields once. The directives that
govern this cache are those of the first *targeted* field present with a
directive for it (``CDN-Cache-Control``, RFC 9213 §2.2, then
``Surrogate-Control``), and only then ``Cache-Control``: a targeted field
replaces ``Cache-Control`` entirely for the caches it targets (and
``Expires`` with it).

Freshness lifetime (§4.2.1, shared): ``s-maxage``, else ``max-age``, else
``Expires`` minus ``Date`` (``Date`` absent: the time it was received), else the
heuristic of §4.2.2 — a fraction (10%, as the RFC suggests) of the time since
``Last-Modified``, capped — for a status that is heuristically cacheable
(§4.2.2: 200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501) or a
``public`` response. A malformed directive value makes the lifetime 0.

Age (§4.2.3), with times in seconds since the epoch::

    apparent_age          = max(0, response_time - date_value)
    response_delay        = response_time - request_time   (the tunnel's delay)
    corrected_age_value   = age_value + response_delay
    corrected_initial_age = max(apparent_age, corrected_age_value)
    current_age           = corrected_initial_age + (now - response_time)

An invalid ``Age`` makes the initial age infinite: such a response is stale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge.cache.directives import (
    INVALID,
    Directives,
    field_values,
    http_date,
    parse_age,
    parse_directives,
    split_list,
)

__all__ = [
    "HEURISTIC_STATUSES",
    "FreshnessRules",
    "ResponseFacts",
    "freshness_lifetime",
    "initial_age",
]

HEURISTIC_STATUSES = frozenset({200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501})
"""RFC 9110 §15.1: heuristically cacheable by default."""

_TARGETED = {b"cdn-cache-control": False, b"surrogate-control": True}


@dataclass(frozen=True, slots=True)
class FreshnessRules:
    """What a shared cache's freshness depends on besides the response."""

    heuristic_fraction: float = 0.1
    heuristic_max_s: float = 86_400.0
    targeted_fields: tuple[bytes, ...] = (b"cdn-cache-control", b"surrogate-control")
    """Lowercase names of the targeted fields this cache obeys, first found wins."""


@dataclass(frozen=True, slots=True)
class ResponseFacts:
    """The fields of a response a cache decides by, read once."""

    status: int
    control: Directives
    """The directives that govern this cache (a targeted field's, or Cache-Control's)."""
    targeted: bool
    """``control`` came from a targeted field (``Expires`` does not count then)."""
    date: float | None
    expires: float | None
    has_expires: bool
    last_modified: float | None
    etag: bytes | None
    age: int | None
    """None: no ``Age``; :data:`edge.cache.directives.INVALID`: a malformed one."""
    vary: tuple[bytes, ...]
    """Lowercased names ``Vary`` lists (``*`` kept as is)."""
    sets_cookie: bool

    @classmethod
    def of(cls, status: int, headers: object, rules: FreshnessRules | None = None) -> ResponseFacts:
        rules = rules or _DEFAULT_RULES
        control: Directives | None = None
        targeted = False
        for name in rules.targeted_fields:
            values = field_values(headers, name)
            if values:
                found = parse_directives(values, targeted=_TARGETED.get(name, False))
                if found:
                    control, targeted = found, True
                    break
        if control is None:
            control = parse_directives(field_values(headers, b"cache-control"))
        expires = field_values(headers, b"expires")
        modified = field_values(headers, b"last-modified")
        etags = field_values(headers, b"etag")
        dates = field_values(headers, b"date")
        return cls(
            status=status,
            control=control,
            targeted=targeted,
            date=http_date(dates[0]) if dates else None,
            expires=http_date(expires[0]) if expires else None,
            has_expires=bool(expires),
            last_modified=http_date(modified[0]) if modified else None,
            etag=etags[0].strip() if etags else None,
            age=parse_age(field_values(headers, b"age")),
            vary=tuple(split_list(field_values(headers, b"vary"))),
            sets_cookie=any(
                name in (b"set-cookie", b"set-cookie2")
                for name, _ in headers  # type: ignore[attr-defined]
            ),
        )

    @property
    def validators(self) -> bool:
        return self.etag is not None or self.last_modified is not None

    @property
    def explicit_freshness(self) -> bool:
        control = self.control
        return (
            b"s-maxage" in control
            or b"max-age" in control
            or (self.has_expires and not self.targeted)
        )


_DEFAULT_RULES = FreshnessRules()


def freshness_lifetime(
    facts: ResponseFacts, response_time: float, rules: FreshnessRules | None = None
) -> float:
    """Seconds the response is fresh for, from its generation (§4.2.1, §4.2.2)."""
    control = facts.control
    for name in (b"s-maxage", b"max-age"):
        seconds = control.seconds(name)
        if seconds is not None:
            return 0.0 if seconds == INVALID else float(seconds)
    if facts.has_expires and not facts.targeted:
        if facts.expires is None:
            return 0.0  # an invalid Expires: already expired (§5.3)
        date = facts.date if facts.date is not None else response_time
        return max(0.0, facts.expires - date)
    rules = rules or _DEFAULT_RULES
    if facts.last_modified is not None and (
        facts.status in HEURISTIC_STATUSES or b"public" in control
    ):
        date = facts.date if facts.date is not None else response_time
        since = max(0.0, date - facts.last_modified)
        return min(since * rules.heuristic_fraction, rules.heuristic_max_s)
    return 0.0


def initial_age(facts: ResponseFacts, request_time: float, response_time: float) -> float:
    """The corrected initial age (§4.2.3); ``math.inf`` for an invalid ``Age``."""
    if facts.age == INVALID:
        return math.inf
    date = facts.date if facts.date is not None else response_time
    apparent = max(0.0, response_time - date)
    corrected = (facts.age or 0) + max(0.0, response_time - request_time)
    return max(apparent, corrected)
