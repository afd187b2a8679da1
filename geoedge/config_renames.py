"""Renamed keys and values: an old config keeps loading, with a warning.

A root schema declares what was renamed, in two class attributes:

- ``RENAMED_KEYS``: old dotted key path -> new path, or a tuple of new paths
  when one old key became several (it sets each of them). ``[]`` stands for
  each entry of an array of tables (``"pools[].read_timeout_s":
  "pools[].between_bytes_timeout_s"``). A key may move between tables
  (``"http.access_log": "edge.access_log"``, a whole table: ``"limits":
  "admission"``), but only between tables at fixed paths: inside an array
  entry it stays in its table.
- ``RENAMED_VALUES``: key path (its new name) -> ``(old value, new value)``
  pairs: a value of an older spelling (``proxy_protocol = true``) read as
  its new one (``"any"``). Values match by type too: ``1`` is not ``true``.

:func:`apply_renames` moves each old key to its new place and each old value
to its new spelling, and says what it did: one deprecation per occurrence
(for a warning naming the file, the old key and the new one) and one error
per key given under both names (not a silent choice between them). The
loader (:func:`geoedge.config.config_from_mapping`) logs the first and
raises the second. :func:`rename_table` lists them all for the
configuration reference.

Old names are never rendered: ``geoedge init``, ``--defaults`` and the
reference write the schema's (new) names only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from geoedge.config_toml import toml_value

__all__ = ["Renamed", "apply_renames", "rename_table", "renamed_keys", "renamed_values"]

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Renamed:
    """One old key or value met in a config: where, and what to say there."""

    where: KeyPath
    message: str
    is_table: bool = False
    """A whole table was renamed (``[limits]``), not one key in it."""


def renamed_keys(schema: type) -> dict[str, tuple[str, ...]]:
    """Old dotted key path -> its new path(s), as the root ``schema`` declares them.

    Raises TypeError for a declaration the loader cannot apply (a schema bug,
    found when the schema is first used, not when someone sets the key)."""
    declared: Mapping[str, str | tuple[str, ...]] = getattr(schema, "RENAMED_KEYS", {})
    out = {}
    for old, new in declared.items():
        targets = (new,) if isinstance(new, str) else tuple(new)
        *old_tables, _ = old.split(".")
        for target in targets:
            *new_tables, _ = target.split(".")
            if new_tables != old_tables and any(p.endswith("[]") for p in old_tables + new_tables):
                raise TypeError(f"{schema.__name__}: {old} -> {target}: moves out of an array")
        if not targets:
            raise TypeError(f"{schema.__name__}: {old} is renamed to nothing")
        out[old] = targets
    return out


def renamed_values(schema: type) -> dict[str, tuple[tuple[Any, Any], ...]]:
    """Key path -> ``(old value, new value)`` pairs, as the root ``schema`` declares them."""
    declared: Mapping[str, tuple[tuple[Any, Any], ...]] = getattr(schema, "RENAMED_VALUES", {})
    return {key: tuple(pairs) for key, pairs in declared.items()}


def _copy_tables(value: Any) -> Any:
    """``value`` with its tables and arrays copied (to move keys in), values
    as they are (a config instance in a mapping stays that instance)."""
    if isinstance(value, Mapping):
        return {k: _copy_tables(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_tables(v) for v in value]
    return value


def _tables_at(data: Any, parts: list[str], where: KeyPath) -> list[tuple[dict[str, Any], KeyPath]]:
    """The (mutable) tables that ``parts`` (``a``, ``b[]``...) lead to in ``data``."""
    found = [(data, where)]
    for part in parts:
        step = []
        for table, at in found:
            if not isinstance(table, dict):
                continue
            name = part.removesuffix("[]")
            value = table.get(name)
            if part.endswith("[]") and isinstance(value, list):
                step += [(v, (*at, name, i)) for i, v in enumerate(value) if isinstance(v, dict)]
            elif not part.endswith("[]") and isinstance(value, dict):
                step.append((value, (*at, name)))
        found = step
    return found


def _drop(data: dict[str, Any], at: KeyPath) -> None:
    """Remove the table at ``at`` (string keys only) from ``data``."""
    parent = data
    for part in at[:-1]:
        parent = parent[part]  # type: ignore[index]
    del parent[at[-1]]  # type: ignore[arg-type]


def _shown(path: str, beside: list[str]) -> str:
    """How a new key is named in a message: bare in the old key's table, else
    ``[table] key`` as the loader names keys."""
    *tables, key = path.split(".")
    if not tables:  # every key at the root is a table
        return f"[{key}]"
    if tables == beside:
        return key
    return f"[{'.'.join(tables)}] {key}"


def _new_table(data: dict[str, Any], table: dict[str, Any], same: bool, path: list[str]) -> Any:
    """Where a moved key goes: its own ``table``, or the table at ``path``
    from the root (created when missing; not a table: None)."""
    if same:
        return table
    target: Any = data
    for part in path:
        target = target.setdefault(part, {}) if isinstance(target, dict) else None
    return target if isinstance(target, dict) else None


def _move_key(
    data: dict[str, Any],
    old: str,
    new: tuple[str, ...],
    deprecated: list[Renamed],
    errors: list[Renamed],
) -> None:
    *old_tables, old_key = old.split(".")
    shown = " and ".join(_shown(path, old_tables) for path in new)
    for table, at in _tables_at(data, old_tables, ()):
        if old_key not in table:
            continue
        places = []
        for path in new:
            *new_tables, new_key = path.split(".")
            places.append((_new_table(data, table, new_tables == old_tables, new_tables), new_key))
        if any(target is None for target, _ in places):
            continue  # the new place is not a table: the loader says so, and of the old key
        value = table.pop(old_key)
        if any(key in target for target, key in places):
            keys = "key" if len(new) == 1 else "keys"
            message = f"renamed to {shown}: give only the new {keys} (both are set)"
            errors.append(Renamed((*at, old_key), message, is_table=not old_tables))
        else:
            for target, key in places:
                target[key] = _copy_tables(value)
            note = "move it there" if len(new) == 1 else "it sets each of them: give those"
            message = f"deprecated: renamed to {shown} ({note})"
            deprecated.append(Renamed((*at, old_key), message, is_table=not old_tables))
        if not table and at and all(isinstance(part, str) for part in at):
            _drop(data, at)  # a table the move left empty: the old table may be gone


def _respell_value(
    data: dict[str, Any], path: str, pairs: tuple[tuple[Any, Any], ...], deprecated: list[Renamed]
) -> None:
    *tables, key = path.split(".")
    for table, at in _tables_at(data, tables, ()):
        if key not in table:
            continue
        value = table[key]
        for old, new in pairs:
            if type(value) is type(old) and value == old:
                table[key] = new
                deprecated.append(
                    Renamed(
                        (*at, key),
                        f"deprecated: {toml_value(old)} is now written {toml_value(new)}",
                    )
                )
                break


def apply_renames(
    data: Mapping[str, Any], schema: type
) -> tuple[dict[str, Any], list[Renamed], list[Renamed]]:
    """``data`` (not changed) with old keys and values renamed as ``schema``
    declares; the deprecations met, and the errors (a key given twice)."""
    keys, values = renamed_keys(schema), renamed_values(schema)
    if not keys and not values:
        return dict(data), [], []
    out: dict[str, Any] = _copy_tables(data)
    deprecated: list[Renamed] = []
    errors: list[Renamed] = []
    for old, new in keys.items():
        _move_key(out, old, new, deprecated, errors)
    for path, pairs in values.items():
        _respell_value(out, path, pairs, deprecated)
    return out, deprecated, errors


def _display(path: str) -> str:
    """``pools[].read_timeout_s`` -> ``[[pools]] read_timeout_s``; ``limits`` -> ``[limits]``."""
    *tables, key = path.split(".")
    if not tables:  # every key at the root is a table
        return f"`[{key}]`"
    last = tables[-1]
    if last.endswith("[]"):
        header = "[[" + ".".join([*(t.removesuffix("[]") for t in tables[:-1]), last[:-2]]) + "]]"
    else:
        header = "[" + ".".join(t.removesuffix("[]") for t in tables) + "]"
    return f"`{header} {key}`"


def rename_table(schema: type) -> list[tuple[str, str]]:
    """(old, new) of every rename ``schema`` declares, as the reference shows them."""
    rows = []
    for old, new in renamed_keys(schema).items():
        rows.append((_display(old), " and ".join(_display(path) for path in new)))
    for path, pairs in renamed_values(schema).items():
        for old, value in pairs:
            rows.append(
                (
                    f"{_display(path)} = `{toml_value(old)}`",
                    f"{_display(path)} = `{toml_value(value)}`",
                )
            )
    return rows
