"""Renamed keys and values (geoedge.config_renames) on small schemas: every
shape a rename can take, the warning each gives, and the error for a key
given under both names. The daemons' own renames: test_config_vocabulary.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pytest

from geoedge.config import ConfigError, config_from_mapping
from geoedge.config_renames import apply_renames, rename_table


@dataclass(frozen=True)
class Entry:
    name: str
    first_s: float = 1.0
    between_s: float = 1.0
    mode: Literal["off", "v1", "v2", "any"] = "off"


@dataclass(frozen=True)
class Section:
    log: str = "-"


@dataclass(frozen=True)
class Caps:
    most: int = 10


@dataclass(frozen=True)
class Root:
    RENAMED_KEYS: ClassVar[dict[str, str | tuple[str, ...]]] = {
        "http.log": "section.log",
        "limits": "caps",
        "entries[].old_first_s": "entries[].first_s",
        "entries[].both_s": ("entries[].first_s", "entries[].between_s"),
    }
    RENAMED_VALUES: ClassVar[dict[str, tuple[tuple[object, object], ...]]] = {
        "entries[].mode": ((True, "any"), (False, "off")),
    }

    section: Section = field(default_factory=Section)
    caps: Caps = field(default_factory=Caps)
    entries: tuple[Entry, ...] = ()


def load(data: Mapping[str, object]) -> Root:
    return config_from_mapping(data, Root, source="root.toml")


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "geoedge.config"]


def test_a_key_moved_between_tables(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="geoedge.config"):
        old = load({"http": {"log": "/var/log/x"}})
    assert old == load({"section": {"log": "/var/log/x"}}) == Root(Section("/var/log/x"))
    assert warnings(caplog) == [
        "root.toml: [http] log: deprecated: renamed to [section] log (move it there)"
    ]


def test_a_whole_table_renamed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="geoedge.config"):
        assert load({"limits": {"most": 3}}).caps == Caps(3)
    assert warnings(caplog) == ["root.toml: [limits] deprecated: renamed to [caps] (move it there)"]
    with pytest.raises(ConfigError) as caught:
        load({"limits": {"most": 3}, "caps": {"most": 4}})
    assert str(caught.value) == (
        "root.toml: [limits] renamed to [caps]: give only the new key (both are set)"
    )


def test_a_key_in_each_entry_of_an_array(caplog: pytest.LogCaptureFixture) -> None:
    data = {
        "entries": [
            {"name": "a", "old_first_s": 5.0},
            {"name": "b"},
            {"name": "c", "old_first_s": 7},
        ]
    }
    with caplog.at_level("WARNING", logger="geoedge.config"):
        root = load(data)
    assert [e.first_s for e in root.entries] == [5.0, 1.0, 7.0]
    assert warnings(caplog) == [
        f"root.toml: [entries[{i}]] old_first_s: deprecated: renamed to first_s (move it there)"
        for i in (0, 2)
    ]
    assert data["entries"][0] == {"name": "a", "old_first_s": 5.0}, "the caller's mapping is kept"


def test_one_old_key_that_became_two_sets_both(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="geoedge.config"):
        [entry] = load({"entries": [{"name": "a", "both_s": 9.0}]}).entries
    assert (entry.first_s, entry.between_s) == (9.0, 9.0)
    assert warnings(caplog) == [
        "root.toml: [entries[0]] both_s: deprecated: renamed to first_s and between_s"
        " (it sets each of them: give those)"
    ]
    # Either new key beside the old one is an error naming all three.
    for new in ("first_s", "between_s"):
        with pytest.raises(ConfigError) as caught:
            load({"entries": [{"name": "a", "both_s": 9.0, new: 1.0}]})
        assert str(caught.value) == (
            "root.toml: [entries[0]] both_s: renamed to first_s and between_s:"
            " give only the new keys (both are set)"
        )


def test_both_names_at_once_is_an_error_and_other_problems_are_reported_too() -> None:
    with pytest.raises(ConfigError) as caught:
        load({"http": {"log": "a"}, "section": {"log": "b"}, "caps": {"mots": 1}})
    assert str(caught.value).splitlines() == [
        "root.toml: [http] log: renamed to [section] log: give only the new key (both are set)",
        "root.toml: [caps] mots: unknown key (did you mean 'most'?)",
    ]


def test_an_old_value_is_read_as_its_new_spelling(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="geoedge.config"):
        root = load({"entries": [{"name": "a", "mode": True}, {"name": "b", "mode": False}]})
    assert [e.mode for e in root.entries] == ["any", "off"]
    assert warnings(caplog) == [
        'root.toml: [entries[0]] mode: deprecated: true is now written "any"',
        'root.toml: [entries[1]] mode: deprecated: false is now written "off"',
    ]
    # The new spellings load without a word; a value of another type is not taken for one.
    caplog.clear()
    with caplog.at_level("WARNING", logger="geoedge.config"):
        assert load({"entries": [{"name": "a", "mode": "v2"}]}).entries[0].mode == "v2"
    assert warnings(caplog) == []
    with pytest.raises(ConfigError, match=r"\[entries\[0\]\] mode: expected one of"):
        load({"entries": [{"name": "a", "mode": 1}]})


def test_a_schema_without_renames_leaves_the_mapping_as_it_is() -> None:
    data: dict[str, object] = {"caps": {"most": 1}}
    out, deprecated, errors = apply_renames(data, Caps)
    assert (out, deprecated, errors) == (data, [], [])


def test_a_rename_out_of_an_array_entry_is_a_schema_bug() -> None:
    @dataclass(frozen=True)
    class Bad:
        RENAMED_KEYS: ClassVar[dict[str, str]] = {"entries[].name": "section.log"}
        entries: tuple[Entry, ...] = ()
        section: Section = field(default_factory=Section)

    with pytest.raises(TypeError, match="moves out of an array"):
        config_from_mapping({}, Bad)


def test_the_reference_lists_every_rename() -> None:
    assert rename_table(Root) == [
        ("`[http] log`", "`[section] log`"),
        ("`[limits]`", "`[caps]`"),
        ("`[[entries]] old_first_s`", "`[[entries]] first_s`"),
        ("`[[entries]] both_s`", "`[[entries]] first_s` and `[[entries]] between_s`"),
        ("`[[entries]] mode` = `true`", '`[[entries]] mode` = `"any"`'),
        ("`[[entries]] mode` = `false`", '`[[entries]] mode` = `"off"`'),
    ]
