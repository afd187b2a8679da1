"""What a purge asks for, read from an operator's request (pure).

One shape everywhere: the edge's admin API (``POST /cache/purge``), the
origin's (which sends it on to every edge), the control pipe to the
workers, and the tunnel's CONTROL frame (kind :data:`PURGE_KIND`,
PROTOCOL.md §5.14) all carry the same JSON object::

    {"url": "https://example.com/app.js"}      one URL (every variant, every added key part)
    {"prefix": "https://example.com/static/"}  every URL starting so
    {"tag": "product-42"}                      every response tagged so (Surrogate-Key, Cache-Tag)
    {"all": true}                              everything

``url``, ``prefix`` and ``tag`` may instead hold a list (up to
:data:`MAX_VALUES`). Anything else is a :class:`PurgeError`, with what is
wrong in words for the operator.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tunnel.mux import ControlKind

__all__ = ["MAX_VALUES", "PURGE_KIND", "Purge", "PurgeError", "parse_purge"]

PURGE_KIND = ControlKind.CACHE_PURGE
"""The CONTROL frame kind of a purge (origin -> edge, PROTOCOL.md §5.14)."""

MAX_VALUES = 1000
_KINDS = ("url", "prefix", "tag", "all")


class PurgeError(ValueError):
    """A purge request that cannot be carried out, and why."""


@dataclass(frozen=True, slots=True)
class Purge:
    kind: str
    """``url``, ``prefix``, ``tag`` or ``all``."""
    values: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        if self.kind == "all":
            return {"all": True}
        return {self.kind: list(self.values)}

    def encode(self) -> bytes:
        return json.dumps(self.as_json(), separators=(",", ":")).encode()


def parse_purge(data: bytes | dict[str, object]) -> Purge:
    """The purge ``data`` (a JSON object, or its bytes) asks for."""
    if isinstance(data, bytes | bytearray):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise PurgeError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PurgeError("a purge is a JSON object")
    named = [key for key in _KINDS if key in data]
    unknown = sorted(set(data) - set(_KINDS))
    if unknown:
        raise PurgeError(f"unknown key(s) {', '.join(unknown)}: use one of {', '.join(_KINDS)}")
    if len(named) != 1:
        raise PurgeError(f"name exactly one of {', '.join(_KINDS)}")
    kind = named[0]
    value = data[kind]
    if kind == "all":
        if value is not True:
            raise PurgeError('"all" must be true')
        return Purge("all", ())
    values = value if isinstance(value, list) else [value]
    if not values or len(values) > MAX_VALUES:
        raise PurgeError(f"{kind}: 1 to {MAX_VALUES} values")
    for item in values:
        if not isinstance(item, str) or not item or len(item) > 8192:
            raise PurgeError(f"{kind}: each value is a non-empty string")
        if kind in ("url", "prefix") and not item.startswith(("https://", "http://")):
            raise PurgeError(f"{kind}: {item!r} is not an absolute http(s) URL")
    return Purge(kind, tuple(str(item) for item in values))
