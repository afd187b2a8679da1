"""Typed configuration: a TOML file validated into frozen dataclasses.

Each component declares its configuration as a frozen (slotted) dataclass with a
docstring under every field (aioquic style) and units in the field names
(``ping_interval_s``, ``max_frame_bytes``). Defaults are written there and
nowhere else. This module is the one loader for all of them:

- :func:`load_config` reads a TOML file (stdlib :mod:`tomllib`) and maps it onto
  a schema; :func:`config_from_mapping` does the same for an already parsed
  mapping.
- Every wrong key is an error naming the file, the table and the key, with a
  "did you mean" for misspellings; problems are collected, so one run reports
  all of them (hypercorn, our counter-example, silently ignores unknown keys).
- Renamed keys and values keep working: a root schema declares them
  (``RENAMED_KEYS``, ``RENAMED_VALUES``: :mod:`geoedge.config_renames`); the
  loader reads the old spelling as the new one and logs a deprecation warning
  naming the file, the old key and the new one. Giving both is an error. Any
  table, a new one included, can declare its renames there.
- Relative :class:`~pathlib.Path` values are resolved against the directory of
  the config file, so a config can name its certificates next to itself.
- :func:`geoedge.config_render.config_to_toml` renders a config, or a
  schema's defaults, back to TOML with the field docstrings as comments: the
  example configs and ``geoedge config --defaults`` come from the same place
  as the defaults.

Why not a library: dacite, cattrs and msgspec map mappings onto dataclasses,
but out of the box none resolves paths against the config file, suggests near
keys and reports every problem as ``file: [table] key: reason``; the hooks to
teach them would be about as long as this module, and tomli-w writes no
comments. The subset of types configs need is small enough to own.

Units live in field names only (``stall_timeout_s = 60.0``); strings such as
``"60s"`` are not parsed: one spelling, checked like every other number.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import enum
import functools
import inspect
import ipaddress
import itertools
import logging
import os
import re
import textwrap
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any, TypeVar

from geoedge.config_renames import apply_renames, renamed_keys
from geoedge.config_toml import toml_key, toml_value

__all__ = [
    "ConfigError",
    "ConfigProblem",
    "config_from_mapping",
    "describe_type",
    "field_docs",
    "load_config",
    "schema_fields",
    "toml_key",
    "toml_value",
]

log = logging.getLogger("geoedge.config")

T = TypeVar("T")
KeyPath = tuple[str | int, ...]

_TOML_LINE = re.compile(r"at line (\d+)")
_IP_TYPES: dict[type, Any] = {
    ipaddress.IPv4Network: functools.partial(ipaddress.ip_network, strict=True),
    ipaddress.IPv6Network: functools.partial(ipaddress.ip_network, strict=True),
    ipaddress.IPv4Address: ipaddress.ip_address,
    ipaddress.IPv6Address: ipaddress.ip_address,
    ipaddress.IPv4Interface: ipaddress.ip_interface,
    ipaddress.IPv6Interface: ipaddress.ip_interface,
}
_IP_NAMES = {t: f"{t.__name__[:4]} {t.__name__[4:].lower()}" for t in _IP_TYPES}
_SCALAR_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string"}


# --------------------------------------------------------------------------- errors


def _render_key(parts: KeyPath) -> str:
    """``("listeners", 1, "address")`` -> ``listeners[1].address``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = toml_key(part)
            out += f".{name}" if out else name
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One thing wrong with a config; ``where`` is the key path from the root."""

    where: KeyPath
    message: str
    is_table: bool = False
    """True when the problem is about the table at ``where`` as a whole (its
    ``__post_init__`` refused it), not about one key."""

    @property
    def key(self) -> str | None:
        return _render_key(self.where) or None

    def __str__(self) -> str:
        if self.is_table:
            return f"[{self.key}] {self.message}" if self.where else self.message
        # The table is everything up to the last named key: "[listeners[1]] address".
        last = max((i for i, p in enumerate(self.where) if isinstance(p, str)), default=0)
        table, leaf = self.where[:last], _render_key(self.where[last:])
        location = f"[{_render_key(table)}] {leaf}" if table else leaf
        return f"{location}: {self.message}" if location else self.message


class ConfigError(Exception):
    """A config file or mapping is wrong; the message names file, table and key.

    One line per problem, each starting with the file, like a compiler's
    output: ``edge.toml: [tunnel] ping_interval: unknown key (did you mean
    'ping_interval_s'?)``. ``key`` is the dotted path of the first problem
    (``listeners[1].address``), ``line`` the line of a TOML syntax error.
    """

    def __init__(
        self, path: str | None, problems: Sequence[ConfigProblem], *, line: int | None = None
    ) -> None:
        self.path = path
        self.problems = tuple(problems)
        self.key = self.problems[0].key if self.problems else None
        self.line = line
        prefix = f"{path}: " if path else ""
        super().__init__("\n".join(f"{prefix}{problem}" for problem in self.problems))


# --------------------------------------------------------------------------- schema


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    type: Any
    default: Any  # dataclasses.MISSING when required

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


@functools.cache
def schema_fields(schema: type) -> dict[str, _Field]:
    """The init fields of a dataclass schema with resolved types and defaults."""
    hints = typing.get_type_hints(schema)
    out = {}
    for f in dataclasses.fields(schema):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        out[f.name] = _Field(f.name, hints[f.name], default)
    return out


def describe_type(tp: Any, seen: frozenset[type] = frozenset()) -> str:
    """What a type looks like in TOML; raises TypeError for unsupported types.

    Walking the whole schema once (see :func:`_check_schema`) turns a schema
    bug into an error at start-up, not when someone first sets the key.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return "any value"
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if tp not in seen:
            for f in schema_fields(tp).values():
                describe_type(f.type, seen | {tp})
        return "table"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(a, seen) for a in args if a is not type(None))
    if origin is typing.Literal:
        return "one of " + ", ".join(toml_value(a) for a in args)
    if (origin is list and args) or (origin is tuple and args[1:] == (Ellipsis,)):
        item = describe_type(args[0], seen)
        return "array of tables" if item == "table" else f"array of {item}"
    if origin is dict and len(args) == 2 and args[0] is str:
        return f"table of {describe_type(args[1], seen)}"
    if isinstance(tp, type) and origin is None:
        if issubclass(tp, enum.Enum):
            return "one of " + ", ".join(repr(m.value) for m in tp)
        if tp in _SCALAR_NAMES:
            return _SCALAR_NAMES[tp]
        if issubclass(tp, PurePath):
            return "path"
        if tp in _IP_NAMES:
            return _IP_NAMES[tp]
    raise TypeError(f"unsupported type in a config schema: {tp!r}")


_CHECKED_SCHEMAS: set[type] = set()


def _check_schema(schema: type) -> None:
    """Every field's type is one the loader knows (once per schema)."""
    if schema in _CHECKED_SCHEMAS:
        return
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        raise TypeError(f"a config schema must be a dataclass type, not {schema!r}")
    describe_type(schema)
    renamed_keys(schema)  # a declaration the loader cannot apply is a schema bug
    _CHECKED_SCHEMAS.add(schema)


def _found(value: Any) -> str:
    """The TOML name and, for scalars, the value: ``string 'yes'``."""
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    kind = {bool: "boolean", int: "integer", float: "float", str: "string"}.get(type(value))
    if kind is None:
        return f"{type(value).__name__} {str(value)[:40]}"
    shown = toml_value(value)
    return f"{kind} {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --------------------------------------------------------------------------- loading


class _Invalid:
    """Marks a value that failed conversion; the problem is already recorded."""


_INVALID = _Invalid()


class _Loader:
    """Converts parsed TOML onto a schema, recording every problem on the way."""

    def __init__(self, base_dir: Path | None) -> None:
        self.base_dir = base_dir
        self.problems: list[ConfigProblem] = []

    def fail(self, where: KeyPath, message: str, *, is_table: bool = False) -> _Invalid:
        self.problems.append(ConfigProblem(where, message, is_table))
        return _INVALID

    def mismatch(self, where: KeyPath, tp: Any, value: Any) -> _Invalid:
        return self.fail(where, f"expected {describe_type(tp)}, found {_found(value)}")

    def convert(self, value: Any, tp: Any, where: KeyPath) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is Any:
            return value
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self.load_table(value, tp, where)
        if origin in (typing.Union, types.UnionType):
            return self.convert_union(value, tp, args, where)
        if origin is typing.Literal:
            for choice in args:
                if type(choice) is type(value) and choice == value:
                    return choice
            return self.mismatch(where, tp, value)
        if origin in (tuple, list):
            return self.convert_array(value, tp, origin, args[0], where)
        if origin is dict:
            if not isinstance(value, Mapping):
                return self.mismatch(where, tp, value)
            items = {k: self.convert(v, args[1], (*where, k)) for k, v in value.items()}
            return _INVALID if _INVALID in items.values() else items
        if issubclass(tp, enum.Enum):
            return self.convert_enum(value, tp, where)
        if tp is bool or tp is int or tp is str:
            return value if type(value) is tp else self.mismatch(where, tp, value)
        if tp is float:
            ok = type(value) is float or type(value) is int
            return float(value) if ok else self.mismatch(where, tp, value)
        if issubclass(tp, PurePath):
            return self.convert_path(value, tp, where)
        return self.convert_ip(value, (tp,), where)

    def convert_union(self, value: Any, tp: Any, args: tuple[Any, ...], where: KeyPath) -> Any:
        if value is None and type(None) in args:
            return None
        members = tuple(a for a in args if a is not type(None))
        if len(members) == 1:
            return self.convert(value, members[0], where)
        if all(m in _IP_TYPES for m in members):
            return self.convert_ip(value, members, where)
        for member in members:
            trial = _Loader(self.base_dir)
            result = trial.convert(value, member, where)
            if not trial.problems:
                return result
        return self.mismatch(where, tp, value)

    def convert_array(self, value: Any, tp: Any, origin: type, item: Any, where: KeyPath) -> Any:
        if not isinstance(value, list | tuple):
            return self.mismatch(where, tp, value)
        items = [self.convert(v, item, (*where, i)) for i, v in enumerate(value)]
        if any(item is _INVALID for item in items):
            return _INVALID
        return origin(items)

    def convert_enum(self, value: Any, tp: type[enum.Enum], where: KeyPath) -> Any:
        if isinstance(value, tp):
            return value
        for member in tp:
            if type(member.value) is type(value) and member.value == value:
                return member
        if isinstance(value, str) and value in tp.__members__:
            return tp[value]
        hint = ""
        if isinstance(value, str):
            hint = _did_you_mean(value, [str(m.value) for m in tp] + list(tp.__members__))
        return self.fail(where, f"expected {describe_type(tp)}, found {_found(value)}{hint}")

    def convert_path(self, value: Any, tp: type[PurePath], where: KeyPath) -> Any:
        if isinstance(value, PurePath):
            value = str(value)
        if not isinstance(value, str):
            return self.mismatch(where, tp, value)
        if not value:
            return self.fail(where, "expected a path, found an empty string")
        path = tp(value)
        if not path.is_absolute() and self.base_dir is not None:
            path = tp(self.base_dir / path)
        return path

    def convert_ip(self, value: Any, allowed: tuple[type, ...], where: KeyPath) -> Any:
        expected = " or ".join(_IP_NAMES[t] for t in allowed)
        if isinstance(value, allowed):
            return value
        if not isinstance(value, str):
            return self.fail(where, f"expected {expected}, found {_found(value)}")
        reasons = []
        for parse in dict.fromkeys(_IP_TYPES[t] for t in allowed):
            try:
                parsed = parse(value)
            except ValueError as exc:
                reasons.append(str(exc))
                continue
            if isinstance(parsed, allowed):
                return parsed
            reasons.append(f"{value!r} is an {_IP_NAMES[type(parsed)]}")
        return self.fail(where, f"expected {expected}: {reasons[0]}")

    def load_table(self, value: Any, schema: type, where: KeyPath) -> Any:
        if isinstance(value, schema):
            return value
        if not isinstance(value, Mapping):
            return self.fail(where, f"expected a table, found {_found(value)}")
        fields = schema_fields(schema)
        before = len(self.problems)
        for key in value:
            if key not in fields:
                self.fail((*where, key), "unknown key" + _did_you_mean(str(key), list(fields)))
        kwargs = {}
        for name, f in fields.items():
            if name in value:
                kwargs[name] = self.convert(value[name], f.type, (*where, name))
            elif f.required:
                self.fail((*where, name), f"missing required key ({describe_type(f.type)})")
        if len(self.problems) > before:
            return _INVALID
        try:
            return schema(**kwargs)
        except (ValueError, TypeError) as exc:  # __post_init__ validation
            return self.fail(where, str(exc), is_table=True)


def config_from_mapping(
    data: Mapping[str, Any],
    schema: type[T],
    *,
    source: str = "<mapping>",
    base_dir: str | os.PathLike[str] | None = None,
) -> T:
    """Validate a parsed mapping into ``schema``; raise :class:`ConfigError`.

    ``base_dir`` is where relative paths are resolved; without it they stay
    relative. ``source`` names the origin of ``data`` in error messages.
    A renamed key or value (:mod:`geoedge.config_renames`) is read under its
    new name and logged as deprecated, naming the file, the old key and the
    new one; a key given under both names is an error.
    """
    _check_schema(schema)
    loader = _Loader(Path(base_dir) if base_dir is not None else None)
    data, deprecated, twice = apply_renames(data, schema)
    for renamed in deprecated:
        problem = ConfigProblem(renamed.where, renamed.message, renamed.is_table)
        log.warning("%s: %s", source, problem)
    for renamed in twice:
        loader.fail(renamed.where, renamed.message, is_table=renamed.is_table)
    result: T = loader.load_table(data, schema, ())
    if loader.problems:
        raise ConfigError(source, loader.problems)
    return result


def load_config(path: str | os.PathLike[str], schema: type[T]) -> T:
    """Read the TOML file at ``path`` and validate it into ``schema``.

    Relative paths inside are resolved against the file's directory.
    """
    _check_schema(schema)
    source = os.fspath(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(source, [ConfigProblem((), f"cannot read: {exc.strerror}")]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        problem = ConfigProblem((), f"not UTF-8 (byte {exc.start})")
        raise ConfigError(source, [problem]) from None
    except tomllib.TOMLDecodeError as exc:
        match = _TOML_LINE.search(str(exc))
        line = int(match.group(1)) if match else None
        problem = ConfigProblem((), f"invalid TOML: {exc}")
        raise ConfigError(source, [problem], line=line) from None
    return config_from_mapping(data, schema, source=source, base_dir=Path(path).absolute().parent)


# --------------------------------------------------------------------------- docs


@functools.cache
def _own_field_docs(cls: type) -> dict[str, str]:
    """The string literal right after each annotated field in ``cls``'s source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):  # no source: built dynamically, frozen app
        return {}
    classdef = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if classdef is None:
        return {}
    docs = {}
    for stmt, after in itertools.pairwise(classdef.body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def field_docs(schema: type) -> dict[str, str]:
    """Field name -> docstring of a dataclass schema (inherited ones included)."""
    docs: dict[str, str] = {}
    for cls in reversed(schema.__mro__):
        if dataclasses.is_dataclass(cls):
            docs.update(_own_field_docs(cls))
    return docs
