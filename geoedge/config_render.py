"""Rendering configs (or a schema's defaults) back to TOML, field docstrings as
comments: where the example configs and ``geoedge config --defaults`` come from.
Split from :mod:`geoedge.config`, which owns loading."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from geoedge.config import (
    KeyPath,
    describe_type,
    field_docs,
    schema_fields,
    toml_key,
    toml_value,
)

# --------------------------------------------------------------------------- rendering


class _Required:
    """A required field of a schema, rendered as a comment (not a dataclass, so
    that :func:`_is_table` does not take it for a table)."""

    __slots__ = ("type",)

    def __init__(self, tp: Any) -> None:
        self.type = tp


def _items(obj: Any) -> list[tuple[str, Any, str]]:
    """(key, value, doc) of a table: a dataclass instance, a schema or a mapping."""
    if isinstance(obj, Mapping):
        return [(str(k), v, "") for k, v in obj.items()]
    schema = obj if isinstance(obj, type) else type(obj)
    docs = field_docs(schema)
    items = []
    for name, f in schema_fields(schema).items():
        if not isinstance(obj, type):
            value = getattr(obj, name)
        elif not f.required:
            value = f.default
        elif isinstance(f.type, type) and dataclasses.is_dataclass(f.type):
            value = f.type  # a required nested table: render its defaults
        else:
            value = _Required(f.type)
        items.append((name, value, docs.get(name, "")))
    return items


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping) or dataclasses.is_dataclass(value)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(map(_is_table, value))


def _comment(lines: list[str], doc: str) -> None:
    lines.extend(f"# {line}".rstrip() for line in doc.splitlines())


def _write_table(lines: list[str], header: KeyPath, obj: Any, doc: str, array: bool) -> None:
    items = _items(obj)
    if header:
        lines.append("")
        _comment(lines, doc)
        name = ".".join(toml_key(str(k)) for k in header)
        lines.append(f"[[{name}]]" if array else f"[{name}]")
    tables = []
    for key, value, item_doc in items:
        if _is_table(value) or _is_table_array(value):
            tables.append((key, value, item_doc))
            continue
        _comment(lines, item_doc)
        if value is None:
            lines.append(f"# {toml_key(key)} =  (not set)")
        elif isinstance(value, _Required):
            lines.append(f"# {toml_key(key)} =  (required: {describe_type(value.type)})")
        else:
            lines.append(f"{toml_key(key)} = {toml_value(value)}")
    for key, value, item_doc in tables:
        if _is_table_array(value):
            for i, element in enumerate(value):
                _write_table(lines, (*header, key), element, item_doc if i == 0 else "", True)
        else:
            _write_table(lines, (*header, key), value, item_doc, False)


def config_to_toml(obj: Any) -> str:
    """Render a config instance, or a schema's defaults, as commented TOML.

    Field docstrings become comments; unset optional keys and (for a schema)
    required keys are written as comments, since TOML has no null. Loading the
    output of an instance gives back an equal instance.
    """
    if not dataclasses.is_dataclass(obj):
        raise TypeError(f"expected a config dataclass or instance, not {obj!r}")
    lines: list[str] = []
    _write_table(lines, (), obj, "", False)
    return "\n".join(lines).strip("\n") + "\n"
