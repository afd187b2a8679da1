"""TOML spelling of keys and values: how the loader names a key in its
messages, and how configs and defaults are rendered back to TOML.

Split from :mod:`geoedge.config` so that :mod:`geoedge.config_renames`, which
the loader uses, can spell values too without a circle of imports.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import math
import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

__all__ = ["quote", "toml_key", "toml_value"]

BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_IP_VALUES = (
    ipaddress.IPv4Network,
    ipaddress.IPv6Network,
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
    ipaddress.IPv4Interface,
    ipaddress.IPv6Interface,
)
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_ESCAPES["\r"] = "\\r"


def quote(text: str) -> str:
    """A TOML basic string (json.dumps would write surrogate pairs TOML refuses)."""
    out = []
    for char in text:
        escaped = _ESCAPES.get(char)
        if escaped is None and (char < " " or char == "\x7f"):
            escaped = f"\\u{ord(char):04x}"
        out.append(escaped or char)
    return '"' + "".join(out) + '"'


def toml_key(name: str) -> str:
    return name if BARE_KEY.fullmatch(name) else quote(name)


def toml_value(value: Any) -> str:
    """An inline TOML value."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, (PurePath, *_IP_VALUES)):
        return quote(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Mapping):
        inner = ", ".join(
            f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items() if v is not None
        )
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"cannot render {value!r} as TOML")
