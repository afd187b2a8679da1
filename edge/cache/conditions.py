"""Validators, conditional requests and ranges against a stored response (pure).

- :func:`not_modified`: a client's ``If-None-Match`` (weak comparison,
  ``*``) or, without it, ``If-Modified-Since``, evaluated against a stored
  200 (RFC 9110 §13.1.2, §13.1.3, §13.2.2: If-None-Match takes precedence).
- :func:`validators`: the conditional fields a cache sends to revalidate
  (RFC 9111 §4.3.1): the stored ``ETag`` as ``If-None-Match``, the stored
  ``Last-Modified`` as ``If-Modified-Since``.
- :func:`freshened_fields`: a stored response's fields updated by a 304
  (RFC 9111 §3.2, §4.3.4): every field the 304 carries replaces the stored
  lines of that name, but for the framing and content metadata of the
  stored body (``Content-Length``, ``Content-Encoding``, ``Content-Range``,
  ``Content-MD5``, ``ETag``: a 304 describes the same representation) and
  what is never stored.
- :func:`byte_range`: one ``bytes=`` range of a stored body (RFC 9110 §14.2),
  honouring ``If-Range`` (§13.1.5); several ranges are served whole (a
  client must accept a 200 to any Range request).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from edge.cache.directives import field_values, http_date
from edge.cache.entry import NOT_STORED, StoredResponse

__all__ = [
    "UNSATISFIABLE",
    "byte_range",
    "freshened_fields",
    "not_modified",
    "validators",
]

Fields = Sequence[tuple[bytes, bytes]]

UNSATISFIABLE = (-1, -1)
""":func:`byte_range`'s answer when no byte of the range exists (416)."""

KEPT_ON_304 = frozenset(
    {b"content-length", b"content-encoding", b"content-range", b"content-md5", b"etag"}
)

_RANGE = re.compile(rb"bytes[ \t]*=[ \t]*([0-9]*)[ \t]*-[ \t]*([0-9]*)[ \t]*")


def _opaque(tag: bytes) -> bytes:
    """An entity tag without its weakness prefix (weak comparison, §8.8.3.2)."""
    tag = tag.strip(b" \t")
    return tag[2:] if tag[:2] == b"W/" else tag


def not_modified(entry: StoredResponse, fields: Fields) -> bool:
    """Does the client's conditional GET/HEAD make ``entry`` a 304 for it?"""
    if entry.status != 200:
        return False
    inm = field_values(fields, b"if-none-match")
    if inm:
        etag = entry.facts.etag
        for value in inm:
            for tag in value.split(b","):
                tag = tag.strip(b" \t")
                if tag == b"*" or (etag is not None and _opaque(tag) == _opaque(etag)):
                    return True
        return False
    ims = field_values(fields, b"if-modified-since")
    if ims:
        since = http_date(ims[0])
        modified = entry.facts.last_modified
        if modified is None:
            modified = entry.facts.date
        return since is not None and modified is not None and modified <= since
    return False


def validators(entry: StoredResponse) -> list[tuple[bytes, bytes]]:
    """The fields that ask the origin whether ``entry`` is still current."""
    out = []
    etag = entry.field(b"etag")
    if etag is not None:
        out.append((b"If-None-Match", etag))
    modified = entry.field(b"last-modified")
    if modified is not None:
        out.append((b"If-Modified-Since", modified))
    return out


def freshened_fields(stored: Fields, update: Fields) -> list[tuple[bytes, bytes]]:
    """``stored`` fields as a 304's ``update`` fields freshen them."""
    replaced = {name for name, _ in update if name not in KEPT_ON_304 and name not in NOT_STORED}
    if not replaced:
        return list(stored)
    kept = [(name, value) for name, value in stored if name not in replaced]
    kept += [(name, value) for name, value in update if name in replaced]
    return kept


def byte_range(
    value: bytes, if_range: bytes | None, entry: StoredResponse
) -> tuple[int, int] | None:
    """``(first, last)`` octets (inclusive) of the one range ``value`` asks of
    ``entry``'s body; :data:`UNSATISFIABLE`; or None: serve the whole body
    (several ranges, a syntax this cache does not serve, an ``If-Range``
    that does not match)."""
    if entry.status != 200:
        return None
    if if_range is not None and not _if_range_matches(if_range.strip(b" \t"), entry):
        return None
    match = _RANGE.fullmatch(value)
    if match is None:
        return None
    size = len(entry.body)
    first, last = match[1], match[2]
    if not first:
        if not last:
            return None
        suffix = int(last)
        if suffix == 0 or size == 0:
            return UNSATISFIABLE
        return max(0, size - suffix), size - 1
    start = int(first)
    if last and int(last) < start:
        return None  # invalid: ignore the Range field (§14.2)
    if start >= size:
        return UNSATISFIABLE
    end = int(last) if last else size - 1
    return start, min(end, size - 1)


def _if_range_matches(if_range: bytes, entry: StoredResponse) -> bool:
    """§13.1.5: a strong entity tag equal to the stored one, or the stored
    ``Last-Modified`` exactly (a date is strong only as the last-modified)."""
    if if_range[:1] == b'"':
        etag = entry.facts.etag
        return etag is not None and etag[:2] != b"W/" and etag == if_range
    if if_range[:2] == b"W/":
        return False
    modified = entry.field(b"last-modified")
    return modified is not None and modified.strip() == if_range
