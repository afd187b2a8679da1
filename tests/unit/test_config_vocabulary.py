"""One vocabulary (issue 28, item 6): the two daemons name one idea the same
way, every old name keeps loading with a warning that names the file, the old
key and the new one, and nothing the project ships or writes uses an old name.

Each rename is listed here by hand, not read from the schemas' declarations:
a declaration removed by mistake fails here."""

from __future__ import annotations

import copy
import dataclasses
import re
import tomllib
import typing
from typing import Any

import pytest

from edge.config import EdgeConfig, EdgeSection, HttpConfig, ListenerConfig
from geoedge import host_init
from geoedge.config import ConfigError, config_from_mapping
from origin.config import OriginConfig, OriginSection, PoolConfig
from tests.unit.test_deploy_files import CLOUD_INIT, DEPLOY, load_user_data, written

EXAMPLES = {
    "edge": DEPLOY / "config" / "edge.example.toml",
    "origin": DEPLOY / "config" / "origin.example.toml",
}
SCHEMAS: dict[str, type] = {"edge": EdgeConfig, "origin": OriginConfig}
KeyPath = tuple[str | int, ...]

#: (role, old key path, new key paths, a value, how the loader names the old key,
#: how its message names the new ones).
KEY_RENAMES: list[tuple[str, KeyPath, list[KeyPath], Any, str, str]] = [
    (
        "edge", ("http", "access_log"), [("edge", "access_log")], "/var/log/a.log",
        "[http] access_log", "[edge] access_log",
    ),
    (
        "edge", ("limits",), [("admission",)], {"max_connections": 77},
        "[limits]", "[admission]",
    ),
    (
        "edge", ("http", "response_timeout_s"),
        [("http", "first_byte_timeout_s"), ("http", "between_bytes_timeout_s")], 42.0,
        "[http] response_timeout_s", "first_byte_timeout_s and between_bytes_timeout_s",
    ),
    (
        "origin", ("pools", 0, "response_timeout_s"), [("pools", 0, "first_byte_timeout_s")],
        42.0, "[pools[0]] response_timeout_s", "first_byte_timeout_s",
    ),
    (
        "origin", ("pools", 0, "read_timeout_s"), [("pools", 0, "between_bytes_timeout_s")],
        42.0, "[pools[0]] read_timeout_s", "between_bytes_timeout_s",
    ),
    (
        "origin", ("pools", 1, "keepalive_idle_s"), [("pools", 1, "keepalive_timeout_s")],
        0.5, "[pools[1]] keepalive_idle_s", "keepalive_timeout_s",
    ),
]  # fmt: skip


def example(role: str) -> dict[str, Any]:
    return tomllib.loads(EXAMPLES[role].read_text())


def put(data: dict[str, Any], path: KeyPath, value: Any) -> None:
    *parents, key = path
    table: Any = data
    for part in parents:
        table = table.setdefault(part, {}) if isinstance(part, str) else table[part]
    table[key] = copy.deepcopy(value)


def drop(data: dict[str, Any], path: KeyPath) -> None:
    *parents, key = path
    table: Any = data
    for part in parents:
        table = table[part]
    table.pop(key, None)


def load(role: str, data: dict[str, Any]) -> Any:
    return config_from_mapping(data, SCHEMAS[role], source=f"/etc/geoedge/{role}.toml")


def deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "geoedge.config"]


@pytest.mark.parametrize(
    ("role", "old", "new", "value", "old_shown", "new_shown"),
    KEY_RENAMES,
    ids=[f"{r[0]}:{r[4]}" for r in KEY_RENAMES],
)
def test_an_old_key_loads_with_a_warning_and_both_at_once_is_an_error(
    caplog: pytest.LogCaptureFixture,
    role: str,
    old: KeyPath,
    new: list[KeyPath],
    value: Any,
    old_shown: str,
    new_shown: str,
) -> None:
    base = example(role)
    for path in new:
        drop(base, path)
    source = f"/etc/geoedge/{role}.toml"
    # The new name loads, without a word.
    with_new = copy.deepcopy(base)
    for path in new:
        put(with_new, path, value)
    with caplog.at_level("WARNING", logger="geoedge.config"):
        expected = load(role, with_new)
    assert deprecations(caplog) == []
    # The old one loads to the same config, and says where it went.
    with_old = copy.deepcopy(base)
    put(with_old, old, value)
    with caplog.at_level("WARNING", logger="geoedge.config"):
        assert load(role, with_old) == expected
    [warning] = deprecations(caplog)
    where = old_shown if old_shown.endswith("]") else f"{old_shown}:"  # a table, or a key
    assert warning.startswith(f"{source}: {where} deprecated: renamed to {new_shown} (")
    # Both at once: an error naming the file, the old key and the new one(s).
    for path in new:
        both = copy.deepcopy(with_old)
        put(both, path, value)
        with pytest.raises(ConfigError) as caught:
            load(role, both)
        assert str(caught.value).startswith(
            f"{source}: {where} renamed to {new_shown}: give only the new key"
        )


@pytest.mark.parametrize(("old", "new"), [(True, "any"), (False, "off")])
def test_a_boolean_proxy_protocol_loads_as_its_version_string(
    caplog: pytest.LogCaptureFixture, old: bool, new: str
) -> None:
    """``true`` accepted v1 and v2 alike, which ``"any"`` keeps doing."""
    data = example("edge")
    [listener] = data["listeners"]
    listener["proxy_protocol"] = old
    if not old:
        del listener["trusted_proxies"]
    with caplog.at_level("WARNING", logger="geoedge.config"):
        [loaded] = load("edge", data).listeners
    assert loaded.proxy_protocol == new
    assert deprecations(caplog) == [
        f"/etc/geoedge/edge.toml: [listeners[0]] proxy_protocol: deprecated:"
        f' {str(old).lower()} is now written "{new}"'
    ]


def test_the_daemons_name_one_idea_the_same_way() -> None:
    """The pairs issue 28 found named apart, by the schemas' own fields."""
    edge_http = {f.name for f in dataclasses.fields(HttpConfig)}
    pool = {f.name for f in dataclasses.fields(PoolConfig)}
    shared = {"first_byte_timeout_s", "between_bytes_timeout_s", "keepalive_timeout_s"}
    shared |= {"long_poll_prefixes"}
    assert shared <= edge_http & pool
    sends = typing.get_args(typing.get_type_hints(PoolConfig)["proxy_protocol"])
    expects = typing.get_args(typing.get_type_hints(ListenerConfig)["proxy_protocol"])
    assert set(sends) == {"off", "v1", "v2"} and set(sends) < set(expects)
    for section in (EdgeSection, OriginSection):  # each daemon's own table
        assert "access_log" in {f.name for f in dataclasses.fields(section)}
    assert "access_log" not in edge_http
    edge_tables = {f.name for f in dataclasses.fields(EdgeConfig)}
    assert "limits" not in edge_tables and "admission" in edge_tables


def shipped_configs() -> list[tuple[str, str, str]]:
    """(role, where, TOML text) of every config the project ships or writes."""
    found = [(role, str(path), path.read_text()) for role, path in EXAMPLES.items()]
    for role in CLOUD_INIT:
        content = written(load_user_data(role))[f"/etc/geoedge/{role}.toml"]["content"]
        found.append((role, f"deploy/cloud-init/{role}.yaml", content))
    edge = host_init.edge_files(host_init.EdgeChoices(nlb_cidr="10.20.0.0/16"))
    origin = host_init.origin_files(host_init.OriginChoices(names=("app.example.com",)))
    for role, files in (("edge", edge), ("origin", origin)):
        [config] = [f for f in files if f.name == f"{role}.toml"]
        found.append((role, f"geoedge init {role}", config.content))
        found.append((role, f"geoedge config --defaults {role}", host_init.defaults_toml(role)))
    return found


#: Old names as they would be written in TOML, a commented-out example included.
OLD_SPELLINGS = {
    "edge": [r"\[limits\]", r"response_timeout_s =", r"proxy_protocol = (true|false)"],
    "origin": [r"response_timeout_s =", r"read_timeout_s =", r"keepalive_idle_s ="],
}


@pytest.mark.parametrize(("role", "where", "text"), shipped_configs(), ids=lambda v: str(v)[:40])
def test_what_the_project_ships_and_writes_uses_no_old_name(
    caplog: pytest.LogCaptureFixture, role: str, where: str, text: str
) -> None:
    """The example configs, the cloud-init user data, ``geoedge init`` (which
    the CloudFormation stacks run at boot) and ``geoedge config --defaults``."""
    for spelling in OLD_SPELLINGS[role]:
        assert not re.search(rf"^(# )?{spelling}", text, re.MULTILINE), (where, spelling)
    if where.startswith("geoedge config --defaults"):
        return  # its required keys are commented out: it loads only with them filled in
    with caplog.at_level("WARNING", logger="geoedge.config"):
        load(role, tomllib.loads(text))
    assert deprecations(caplog) == [], where
    if role == "edge":
        assert "access_log" not in tomllib.loads(text).get("http", {})


def test_docs_and_deploy_files_name_no_old_key_outside_the_lists_of_renames() -> None:
    """docs/*.md, the READMEs and the comments of the deployment files: an old
    name only where a rename is told."""
    root = DEPLOY.parent
    pages = [*sorted((root / "docs").glob("*.md")), root / "README.md"]
    pages += sorted(DEPLOY.rglob("*.md")) + sorted(DEPLOY.rglob("*.yaml"))
    pages += sorted(DEPLOY.rglob("*.yml"))
    old_names = ["response_timeout_s", "read_timeout_s", "keepalive_idle_s", "[limits]"]
    old_names += ["proxy_protocol = true", "[http] access_log"]
    told = ("renamed", "formerly")
    stale = [
        f"{page.relative_to(root)}:{number}: {line.strip()}"
        for page in pages
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if any(name in line for name in old_names)
        and not any(word in line.lower() for word in told)
        and not (page.name == "configuration.md" and line.startswith("| `"))
    ]
    assert stale == []
