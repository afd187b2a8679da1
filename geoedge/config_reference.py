"""The configuration reference (docs/configuration.md), generated from the schemas.

``geoedge config --reference`` prints it; a test keeps the committed file
equal to what this prints, so the reference cannot drift from the loader.
Every table of ``edge.toml`` and ``origin.toml`` gets a section, with each
key's TOML type, default and docstring: the same source as the example
configs and ``geoedge config --defaults``. Each file's renamed keys and
values (:mod:`geoedge.config_renames`) are listed after its tables.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Sequence
from typing import Any

from geoedge.config import describe_type, field_docs, schema_fields, toml_value
from geoedge.config_renames import rename_table
from geoedge.config_render import _array_item_schema, _table_schema

__all__ = ["reference_markdown"]

_INTRO = """# Configuration reference

Generated from the schemas the daemons load (`geoedge config --reference`;
`make docs` writes this file and a test checks it is current). Every key,
its type in TOML, its default, and what it means. The same keys with their
defaults, as a commented TOML file: `geoedge config --defaults edge` (or
`origin`); annotated examples: `deploy/config/edge.example.toml` and
`deploy/config/origin.example.toml`.

A wrong key is refused at start, naming the file, the table and the key
(`edge.toml: [tunnel] ping_interval: unknown key (did you mean
'ping_interval_s'?)`). Units are in the names: `_s` seconds, `_bytes` bytes.
"""


def _tables(schema: type, path: str, array: bool) -> Iterator[tuple[str, type, bool]]:
    yield path, schema, array
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        tp = hints[f.name]
        item = _array_item_schema(tp)
        table = _table_schema(tp)
        child = f"{path}.{f.name}" if path else f.name
        if item is not None:
            yield from _tables(item, child, True)
        elif table is not None:
            yield from _tables(table, child, False)


def _default(field: Any) -> str:
    if field.required:
        return "required"
    value = field.default
    if value is None:
        return "not set"
    try:
        text = toml_value(value)
    except TypeError:
        return "(a table)"
    return f"`{text}`" if len(text) <= 60 else f"`{text[:57]}...`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _section(role: str, schema: type) -> list[str]:
    lines = [f"## {role}.toml", ""]
    for path, table, array in _tables(schema, "", False):
        fields = {
            name: f
            for name, f in schema_fields(table).items()
            if _table_schema(f.type) is None and _array_item_schema(f.type) is None
        }
        if not path:
            continue
        header = f"[[{path}]]" if array else f"[{path}]"
        lines += [f"### `{header}`", ""]
        doc = (table.__doc__ or "").strip()
        if doc and not doc.startswith(table.__name__ + "("):
            lines += [_cell(doc), ""]
        if not fields:
            lines += ["Only tables (below).", ""]
            continue
        docs = field_docs(table)
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, f in fields.items():
            kind = describe_type(f.type)
            lines.append(
                f"| `{name}` | {_cell(kind)} | {_cell(_default(f))} | {_cell(docs.get(name, ''))} |"
            )
        lines.append("")
    return lines + _renames(role, schema)


def _renames(role: str, schema: type) -> list[str]:
    rows = rename_table(schema)
    if not rows:
        return []
    lines = [
        f"### Renamed in {role}.toml",
        "",
        "The old names still load, with a warning naming the file, the old key and",
        "the new one; a key given under both names is an error.",
        "",
        "| old | new |",
        "| --- | --- |",
    ]
    lines += [f"| {_cell(old)} | {_cell(new)} |" for old, new in rows]
    return [*lines, ""]


def reference_markdown(schemas: Sequence[tuple[str, type]]) -> str:
    """The reference for ``(role, schema)`` pairs, as Markdown."""
    lines = [_INTRO]
    for role, schema in schemas:
        lines += _section(role, schema)
    return "\n".join(lines).rstrip("\n") + "\n"
