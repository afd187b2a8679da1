"""What a shared cache may do with a request and a response: pure decisions.

Each function takes facts (:class:`RequestFacts`,
:class:`edge.cache.freshness.ResponseFacts`, a stored response, ``now``)
and returns a decision; nothing here performs I/O or keeps state, so every
rule is a row in ``tests/unit/test_cache_policy.py``.

- :func:`not_storable` (RFC 9111 §3, §3.5, §5.2.2): why a response may not
  be stored, or None. Beyond the RFC, by DESIGN principle 16: a response
  that sets a cookie is never stored (it is that one user's), nor one whose
  ``Vary`` is ``*`` (it could never be reused), a 206 (ranges are served
  from whole responses, §3.4) or a response with no freshness and no
  validator (it could never be reused either).
- :func:`reuse` (§4, §4.2.4, RFC 5861): serve a stored response fresh, serve
  it stale while revalidating, or validate first.
- :func:`stale_on_error` (§4.2.4, RFC 5861 §4): whether a stale response may
  stand in for an origin that failed.
- :func:`vary_values` / :func:`variant_matches` (§4.1): the secondary key,
  with ``Accept-Encoding`` reduced to the set of codings accepted.
- :func:`invalidates` (§4.4): which URIs an unsafe request's answer invalidates.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from edge.cache.directives import INVALID, Directives, field_values, parse_directives, split_list
from edge.cache.entry import StoredResponse, VaryValues
from edge.cache.freshness import HEURISTIC_STATUSES, ResponseFacts

__all__ = [
    "UNDERSTOOD_STATUSES",
    "RequestFacts",
    "Reuse",
    "invalidates",
    "not_storable",
    "reuse",
    "stale_on_error",
    "variant_matches",
    "vary_values",
]

Fields = Sequence[tuple[bytes, bytes]]

UNDERSTOOD_STATUSES = frozenset(
    {200, 203, 204, 300, 301, 302, 303, 307, 308, 400, 403, 404, 405, 410, 414, 500, 501}
    | {502, 503, 504}
)
"""Status codes whose caching rules this cache implements (for ``must-understand``, §5.2.2.3)."""

SAFE_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE"})

KNOWN_CODINGS = frozenset({b"br", b"compress", b"deflate", b"gzip", b"identity", b"zstd"})


_NO_DIRECTIVES = Directives({})


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """The fields of a request a cache decides by, read once."""

    method: bytes
    control: Directives
    no_cache: bool
    """``Cache-Control: no-cache``, or ``Pragma: no-cache`` without Cache-Control (§5.4)."""
    authorization: bool
    conditional: bool
    """It carries If-None-Match, If-Modified-Since, If-Match, If-Unmodified-Since or If-Range."""
    range: bytes | None

    @classmethod
    def of(cls, method: bytes, fields: Fields) -> RequestFacts:
        cc: list[bytes] = []
        pragma: list[bytes] = []
        conditional = False
        authorization = False
        ranges = None
        for name, value in fields:  # one pass: this runs for every request a cache sees
            if name[:3] == b"if-":
                conditional = True
            elif name == b"cache-control":
                cc.append(value)
            elif name == b"pragma":
                pragma.append(value)
            elif name == b"authorization":
                authorization = True
            elif name == b"range":
                ranges = value
        control = parse_directives(cc) if cc else _NO_DIRECTIVES
        no_cache = b"no-cache" in control or (not cc and b"no-cache" in split_list(pragma))
        return cls(method, control, no_cache, authorization, conditional, ranges)


def not_storable(request: RequestFacts, response: ResponseFacts) -> str | None:
    """Why the response to ``request`` may not be stored; None when it may."""
    if request.method != b"GET":
        return "method"
    status = response.status
    if status < 200 or status in (206, 304):
        return "status"
    control = response.control
    if b"must-understand" in control:
        if status not in UNDERSTOOD_STATUSES:
            return "must-understand"
    elif b"no-store" in control:
        return "no-store"
    if b"private" in control:
        return "private"
    if b"no-store" in request.control:
        return "request no-store"
    if request.authorization and not (
        b"public" in control or b"s-maxage" in control or b"must-revalidate" in control
    ):
        return "authorization"
    if response.sets_cookie:
        return "set-cookie"
    if b"*" in response.vary:
        return "vary *"
    explicit = response.explicit_freshness or b"public" in control
    if not explicit and status not in HEURISTIC_STATUSES:
        return "no freshness"
    if not explicit and not response.validators:
        return "no freshness"
    return None


class Reuse(enum.Enum):
    FRESH = "fresh"
    """Serve it."""
    STALE_WHILE_REVALIDATE = "stale-while-revalidate"
    """Serve it, and revalidate it in the background (RFC 5861 §3)."""
    VALIDATE = "validate"
    """Ask the origin first (conditionally when it has validators)."""


def _no_stale(control: Directives) -> bool:
    """§4.2.4: these forbid serving the response stale, whatever else allows it."""
    return (
        b"must-revalidate" in control
        or b"proxy-revalidate" in control
        or b"s-maxage" in control
        or b"no-cache" in control
    )


def reuse(
    entry: StoredResponse, request: RequestFacts, now: float, *, honour_no_cache: bool = True
) -> Reuse:
    """May ``entry`` answer ``request`` at ``now`` (§4.2, §5.2.1)?"""
    control = entry.facts.control
    if b"no-cache" in control:
        return Reuse.VALIDATE
    wants = request.control
    if honour_no_cache and request.no_cache:
        return Reuse.VALIDATE
    age = entry.age(now)
    lifetime = entry.lifetime
    if honour_no_cache:
        max_age = wants.seconds(b"max-age")
        if max_age is not None and (max_age == INVALID or age > max_age):
            return Reuse.VALIDATE
        min_fresh = wants.seconds(b"min-fresh")
        if min_fresh is not None and min_fresh != INVALID:
            lifetime -= min_fresh
    if age < lifetime:
        return Reuse.FRESH
    if _no_stale(control):
        return Reuse.VALIDATE
    staleness = age - entry.lifetime
    if b"max-stale" in wants:
        max_stale = wants.seconds(b"max-stale")
        if wants.values[b"max-stale"] is None or (max_stale is not None and staleness <= max_stale):
            return Reuse.FRESH
    swr = control.seconds(b"stale-while-revalidate")
    if swr is not None and swr != INVALID and staleness <= swr:
        return Reuse.STALE_WHILE_REVALIDATE
    return Reuse.VALIDATE


def stale_on_error(entry: StoredResponse, now: float, default_s: float) -> bool:
    """May ``entry``, stale, stand in for an origin that failed? Its own
    ``stale-if-error`` bounds how stale; without one, ``default_s``."""
    control = entry.facts.control
    if _no_stale(control):
        return False
    allowed = control.seconds(b"stale-if-error")
    limit = default_s if allowed is None or allowed == INVALID else float(allowed)
    return entry.age(now) - entry.lifetime <= limit


def accepted_codings(fields: Fields) -> bytes | None:
    """``Accept-Encoding`` reduced to the sorted set of known codings it
    accepts (q > 0): two requests that accept the same codings get the same
    variant, whatever their order, spacing, q-values or unknown tokens."""
    values = field_values(fields, b"accept-encoding")
    if not values:
        return None
    accepted = set()
    for member in split_list(values):
        coding, _, params = member.partition(b";")
        coding = coding.strip()
        q = params.strip()
        if q.startswith(b"q="):
            try:
                if float(q[2:]) <= 0:
                    continue
            except ValueError:
                continue
        if coding in KNOWN_CODINGS:
            accepted.add(coding)
    return b",".join(sorted(accepted))


def vary_values(names: Sequence[bytes], fields: Fields) -> VaryValues:
    """The request's values of the fields ``Vary`` names, normalised (§4.1):
    lines joined, whitespace around commas dropped; absent is None."""
    out = []
    for name in names:
        if name == b"accept-encoding":
            out.append((name, accepted_codings(fields)))
            continue
        values = field_values(fields, name)
        if not values:
            out.append((name, None))
            continue
        members = [m.strip(b" \t") for v in values for m in v.split(b",")]
        out.append((name, b",".join(members)))
    return tuple(out)


def variant_matches(entry: StoredResponse, fields: Fields) -> bool:
    """Does the request select ``entry`` (§4.1)? ``Vary: *`` never does."""
    if not entry.vary:
        return True
    names = tuple(name for name, _ in entry.vary)
    if b"*" in names:
        return False
    return vary_values(names, fields) == entry.vary


def invalidates(method: bytes, status: int, target_url: str, fields: Fields) -> list[str]:
    """The URLs an answer to an unsafe ``method`` invalidates (§4.4): a
    non-error answer invalidates the target, and the ``Location`` and
    ``Content-Location`` URLs of the same origin (relative references
    resolved against the target)."""
    if method in SAFE_METHODS or not 200 <= status < 400:
        return []
    urls = [target_url]
    origin_end = target_url.find("/", target_url.find("://") + 3)
    origin = target_url[:origin_end] if origin_end > 0 else target_url
    directory = target_url.split("?", 1)[0].rsplit("/", 1)[0]
    for name in (b"location", b"content-location"):
        for value in field_values(fields, name):
            ref = value.decode("latin-1").strip()
            if ref.startswith(origin + "/"):
                urls.append(ref)
            elif ref.startswith("/") and not ref.startswith("//"):
                urls.append(origin + ref)
            elif ref and "://" not in ref and not ref.startswith("//"):
                urls.append(f"{directory}/{ref}")
    return urls
