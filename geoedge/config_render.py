"""Rendering configs (or a schema's defaults) back to TOML, field docstrings as
comments: where the example configs and ``geoedge config --defaults`` come from.
Split from :mod:`geoedge.config`, which owns loading."""

from __future__ import annotations

import dataclasses
import enum
import typing
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
    that :func:`_is_table` does not take it for a table), with an example
    value when there is one."""

    __slots__ = ("example", "type")

    def __init__(self, tp: Any, example: Any = None) -> None:
        self.type = tp
        self.example = example

    def line(self, key: str) -> str:
        kind = describe_type(self.type)
        if self.example is None:
            return f"# {toml_key(key)} =  (required: {kind})"
        return f"# {toml_key(key)} = {toml_value(self.example)}  (required: {kind})"


def _items(
    obj: Any, example: Mapping[str, Any], commented: bool = False
) -> list[tuple[str, Any, str]]:
    """(key, value, doc) of a table: a dataclass instance, a schema or a mapping.

    For a schema, a required field takes its value from ``example`` when it
    has one (still written as a comment: the schema has no default for it),
    and so does every field of a ``commented`` example entry.
    """
    if isinstance(obj, Mapping):
        return [(str(k), v, "") for k, v in obj.items()]
    schema = obj if isinstance(obj, type) else type(obj)
    docs = field_docs(schema)
    items = []
    for name, f in schema_fields(schema).items():
        table, item = _table_schema(f.type), _array_item_schema(f.type)
        if not isinstance(obj, type):
            value = getattr(obj, name)
        elif table is not None and not f.required and f.default is None:
            value = _Example(table, example.get(name), required=False)
        elif item is not None and (f.required or not f.default):
            value = _Example(item, example.get(name), required=f.required, array=True)
        elif not f.required:
            value = example.get(name, f.default) if commented else f.default
            if value is None and example.get(name) is not None:
                value = _Unset(example[name])
        elif isinstance(f.type, type) and dataclasses.is_dataclass(f.type):
            value = f.type  # a required nested table: render its defaults
        else:
            value = _Required(f.type, example.get(name))
        items.append((name, value, docs.get(name, "")))
    return items


class _Unset:
    """An optional key with no default, shown commented with an example value."""

    __slots__ = ("example",)

    def __init__(self, example: Any) -> None:
        self.example = example


class _Example:
    """A table a schema has no entry of by default (an optional table, an empty
    or required array of tables): rendered as one commented-out example entry,
    from ``example`` (a mapping) where it gives values, else the defaults."""

    __slots__ = ("array", "example", "required", "schema")

    def __init__(self, schema: type, example: Any, *, required: bool, array: bool = False) -> None:
        self.schema = schema
        if array and isinstance(example, list | tuple):
            example = example[0] if example else None
        self.example: Mapping[str, Any] = example if isinstance(example, Mapping) else {}
        self.required = required
        self.array = array


def _table_schema(tp: Any) -> type | None:
    """The dataclass of a table-typed field (``T`` or ``T | None``)."""
    members = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    if len(members) == 1 and isinstance(members[0], type) and dataclasses.is_dataclass(members[0]):
        return members[0]
    return None


def _array_item_schema(tp: Any) -> type | None:
    """The dataclass of an array-of-tables field (``tuple[T, ...]``, ``list[T]``)."""
    if typing.get_origin(tp) in (tuple, list):
        args = typing.get_args(tp)
        if args:
            return _table_schema(args[0])
    return None


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping | _Example) or dataclasses.is_dataclass(value)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(map(_is_table, value))


def _comment(lines: list[str], doc: str) -> None:
    lines.extend(f"# {line}".rstrip() for line in doc.splitlines())


def _write_table(
    lines: list[str],
    header: KeyPath,
    obj: Any,
    doc: str,
    array: bool,
    *,
    example: Mapping[str, Any] | None = None,
    commented: bool = False,
) -> None:
    """Write one table; ``commented``: every key and header as a comment (an
    example entry the schema has no default of)."""
    off = "# " if commented else ""
    items = _items(obj, example or {}, commented)
    if header:
        lines.append("")
        _comment(lines, doc)
        name = ".".join(toml_key(str(k)) for k in header)
        lines.append(off + (f"[[{name}]]" if array else f"[{name}]"))
    tables = []
    for key, value, item_doc in items:
        if _is_table(value) or _is_table_array(value):
            tables.append((key, value, item_doc))
            continue
        _comment(lines, item_doc)
        if value is None:
            lines.append(f"# {toml_key(key)} =  (not set)")
        elif isinstance(value, _Required):
            lines.append(value.line(key))
        elif isinstance(value, _Unset):
            lines.append(f"# {toml_key(key)} = {toml_value(value.example)}  (not set by default)")
        else:
            lines.append(f"{off}{toml_key(key)} = {toml_value(value)}")
            given = example.get(key) if example and isinstance(obj, type) else None
            if not commented and given is not None and given != _plain(value):
                lines.append(f"# e.g. {toml_key(key)} = {toml_value(given)}")
    for key, value, item_doc in tables:
        path = (*header, key)
        if isinstance(value, _Example):
            note = "an example entry" if value.array else "an example"
            kind = "required" if value.required else "none by default"
            entry_doc = f"{item_doc}\n({kind}; {note}: uncomment and edit)".lstrip("\n")
            nested = example.get(key) if example else None
            _write_table(
                lines,
                path,
                value.schema,
                entry_doc,
                value.array,
                example=value.example or _first(nested),
                commented=True,
            )
        elif _is_table_array(value):
            for i, element in enumerate(value):
                _write_table(lines, path, element, item_doc if i == 0 else "", True)
        else:
            nested = example.get(key) if example else None
            _write_table(
                lines,
                path,
                value,
                item_doc,
                False,
                example=nested if isinstance(nested, Mapping) else None,
                commented=commented,
            )


def _plain(value: Any) -> Any:
    """A default as the example mappings spell it (lists, strings)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, str | int | float | bool | list):
        return value
    return str(value)


def _first(value: Any) -> Mapping[str, Any]:
    if isinstance(value, list | tuple) and value and isinstance(value[0], Mapping):
        return value[0]
    return value if isinstance(value, Mapping) else {}


def config_to_toml(obj: Any, *, example: Mapping[str, Any] | None = None) -> str:
    """Render a config instance, or a schema's defaults, as commented TOML.

    Field docstrings become comments; unset optional keys and (for a schema)
    required keys are written as comments, since TOML has no null. Loading the
    output of an instance gives back an equal instance.

    For a schema, every table is written, so the output names every key:
    optional tables and arrays of tables with no default entry as one
    commented-out example entry, whose values come from ``example`` (a
    mapping shaped like the config) where it has them. Uncommented, the
    output still loads to the defaults.
    """
    if not dataclasses.is_dataclass(obj):
        raise TypeError(f"expected a config dataclass or instance, not {obj!r}")
    lines: list[str] = []
    _write_table(lines, (), obj, "", False, example=example)
    return "\n".join(lines).strip("\n") + "\n"
