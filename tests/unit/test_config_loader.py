"""The typed config loader: every supported type, every error message, round trips.

Error tests assert the message names the file and the key, since that is the
loader's whole point (hypercorn, the counter-example, accepts unknown keys).
"""

import dataclasses
import enum
import ipaddress
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geoedge.config import (
    ConfigError,
    config_from_mapping,
    field_docs,
    load_config,
)
from geoedge.config_render import config_to_toml
from tests.example_budget import examples
from tunnel.mux.settings import SessionConfig

Net = ipaddress.IPv4Network | ipaddress.IPv6Network

DEPLOY_EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config" / "edge.example.toml"


class Mode(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


class Weight(enum.IntEnum):
    LOW = 1
    HIGH = 10


def one_field(tp: Any) -> type:
    """A schema with a single required field ``v`` of type ``tp``."""
    return dataclasses.make_dataclass("One", [("v", tp)], frozen=True, slots=True)


def load_one(tp: Any, toml_text: str, **kwargs: Any) -> Any:
    return config_from_mapping(tomllib.loads(toml_text), one_field(tp), **kwargs).v


# ------------------------------------------------------------------ accepted values

ACCEPTED = [
    (int, "v = 5", 5),
    (int, "v = 0x10", 16),
    (int, "v = -9_223_372_036_854_775_808", -(2**63)),
    (float, "v = 5", 5.0),
    (float, "v = 2.5", 2.5),
    (float, "v = inf", float("inf")),
    (str, 'v = "héllo"', "héllo"),
    (bool, "v = true", True),
    (bool, "v = false", False),
    (Optional[int], "v = 3", 3),  # noqa: UP045 (the spelling under test)
    (int | None, "v = 3", 3),
    (int | str, 'v = "x"', "x"),
    (tuple[int, ...], "v = [1, 2, 3]", (1, 2, 3)),
    (tuple[int, ...], "v = []", ()),
    (list[str], 'v = ["a", "b"]', ["a", "b"]),
    (dict[str, int], "v = {a = 1, b = 2}", {"a": 1, "b": 2}),
    (dict[str, tuple[str, ...]], 'v.a = ["x"]', {"a": ("x",)}),
    (Mode, 'v = "safe"', Mode.SAFE),
    (Mode, 'v = "SAFE"', Mode.SAFE),
    (Weight, "v = 10", Weight.HIGH),
    (Weight, 'v = "LOW"', Weight.LOW),
    (Literal["a", "b"], 'v = "b"', "b"),
    (Literal[1, 2], "v = 2", 2),
    (Path, 'v = "/etc/geoedge/edge.pem"', Path("/etc/geoedge/edge.pem")),
    (Path, 'v = "certs/edge.pem"', Path("certs/edge.pem")),
    (ipaddress.IPv4Network, 'v = "10.0.0.0/8"', ipaddress.IPv4Network("10.0.0.0/8")),
    (ipaddress.IPv4Network, 'v = "10.1.2.3"', ipaddress.IPv4Network("10.1.2.3/32")),
    (ipaddress.IPv6Network, 'v = "fd00::/8"', ipaddress.IPv6Network("fd00::/8")),
    (Net, 'v = "fd00::/8"', ipaddress.IPv6Network("fd00::/8")),
    (Net, 'v = "192.168.0.0/16"', ipaddress.IPv4Network("192.168.0.0/16")),
    (ipaddress.IPv4Address, 'v = "127.0.0.1"', ipaddress.IPv4Address("127.0.0.1")),
    (
        tuple[Net, ...],
        'v = ["::1/128", "127.0.0.0/8"]',
        (ipaddress.IPv6Network("::1/128"), ipaddress.IPv4Network("127.0.0.0/8")),
    ),
    (Any, "v = [1, {a = 2}]", [1, {"a": 2}]),
]


@pytest.mark.parametrize(("tp", "toml_text", "expected"), ACCEPTED)
def test_accepted_values(tp: Any, toml_text: str, expected: Any) -> None:
    value = load_one(tp, toml_text)
    assert value == expected
    assert type(value) is type(expected)


def test_float_field_given_an_int_is_a_float() -> None:
    assert type(load_one(float, "v = 5")) is float


def test_optional_field_absent_takes_its_default() -> None:
    @dataclass(frozen=True, slots=True)
    class Schema:
        v: int | None = None
        w: Path | None = None

    assert config_from_mapping({}, Schema) == Schema(None, None)


def test_relative_path_resolves_against_base_dir(tmp_path: Path) -> None:
    assert load_one(Path, 'v = "certs/a.pem"', base_dir=tmp_path) == tmp_path / "certs/a.pem"
    assert load_one(Path, 'v = "/abs/a.pem"', base_dir=tmp_path) == Path("/abs/a.pem")


# ------------------------------------------------------------------ wrong types

REJECTED = [
    (bool, 'v = "yes"', 'expected boolean, found string "yes"'),
    (bool, "v = 1", "expected boolean, found integer 1"),
    (int, "v = true", "expected integer, found boolean true"),
    (int, "v = 1.5", "expected integer, found float 1.5"),
    (int, 'v = "5"', 'expected integer, found string "5"'),
    (float, 'v = "1.5"', 'expected number, found string "1.5"'),
    (float, "v = false", "expected number, found boolean false"),
    (str, "v = 5", "expected string, found integer 5"),
    (str, "v = [1]", "expected string, found an array"),
    (str, "v = {a = 1}", "expected string, found a table"),
    (str, "v = 1979-05-27", "expected string, found date 1979-05-27"),
    (int | None, 'v = "x"', 'expected integer, found string "x"'),
    (int | str, "v = 1.5", "expected integer or string, found float 1.5"),
    (tuple[int, ...], 'v = "1,2"', 'expected array of integer, found string "1,2"'),
    (list[str], "v = 3", "expected array of string, found integer 3"),
    (dict[str, int], "v = 5", "expected table of integer, found integer 5"),
    (
        Mode,
        'v = "fst"',
        "expected one of 'fast', 'safe', found string \"fst\" (did you mean 'fast'?)",
    ),
    (Mode, "v = 1", "expected one of 'fast', 'safe', found integer 1"),
    (Weight, "v = 2", "expected one of 1, 10, found integer 2"),
    (Weight, "v = true", "expected one of 1, 10, found boolean true"),
    (Literal["a", "b"], 'v = "c"', 'expected one of "a", "b", found string "c"'),
    (Literal[1, 2], "v = true", "expected one of 1, 2, found boolean true"),
    (Path, "v = 5", "expected path, found integer 5"),
    (Path, 'v = ""', "expected a path, found an empty string"),
    (
        ipaddress.IPv4Network,
        'v = "10.0.0.1/8"',
        "expected IPv4 network: 10.0.0.1/8 has host bits set",
    ),
    (
        ipaddress.IPv4Network,
        'v = "fd00::/8"',
        "expected IPv4 network: 'fd00::/8' is an IPv6 network",
    ),
    (ipaddress.IPv6Network, 'v = "bogus"', "expected IPv6 network: 'bogus' does not appear"),
    (ipaddress.IPv6Network, "v = 10", "expected IPv6 network, found integer 10"),
    (Net, 'v = "10.0.0.0/33"', "expected IPv4 network or IPv6 network: "),
]


@pytest.mark.parametrize(("tp", "toml_text", "message"), REJECTED)
def test_rejected_values_name_file_key_expected_and_found(
    tp: Any, toml_text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_one(tp, toml_text, source="edge.toml")
    assert str(caught.value).startswith(f"edge.toml: v: {message}")
    assert caught.value.key == "v"
    assert caught.value.path == "edge.toml"
    assert len(caught.value.problems) == 1


def test_array_item_error_names_its_index() -> None:
    with pytest.raises(ConfigError) as caught:
        load_one(tuple[Net, ...], 'v = ["10.0.0.0/8", "nope", "::/0", 7]', source="o.toml")
    lines = str(caught.value).splitlines()
    assert lines[0].startswith("o.toml: v[1]: expected IPv4 network or IPv6 network: 'nope'")
    assert lines[1] == "o.toml: v[3]: expected IPv4 network or IPv6 network, found integer 7"
    assert [p.key for p in caught.value.problems] == ["v[1]", "v[3]"]


def test_dict_value_error_names_table_and_key() -> None:
    with pytest.raises(ConfigError, match=r'^x\.toml: \[v\] "a b": expected integer'):
        load_one(dict[str, int], 'v = {"a b" = "1"}', source="x.toml")


# ------------------------------------------------------------------ tables and keys


@dataclass(frozen=True, slots=True)
class TLS:
    cert: Path
    """Certificate chain (PEM)."""
    key: Path | None = None
    """Private key (PEM); None when it is in ``cert``."""


@dataclass(frozen=True, slots=True)
class Listener:
    address: str = "0.0.0.0:443"
    """host:port to listen on."""
    proxy_protocol: bool = False
    tls: TLS | None = None
    trusted_proxies: tuple[Net, ...] = ()


@dataclass(frozen=True, slots=True)
class Origin:
    name: str
    weight: Weight = Weight.LOW
    mode: Mode = Mode.FAST


@dataclass(frozen=True, slots=True)
class Edge:
    edge_id: str
    """Name of this edge in logs and metrics.

    Unique per region."""
    log_level: Literal["debug", "info", "warning"] = "info"
    connect_timeout_s: float = 5.0
    listeners: tuple[Listener, ...] = ()
    tunnel: SessionConfig = field(default_factory=SessionConfig)
    origins: tuple[Origin, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    pools: dict[str, Origin] = field(default_factory=dict)
    ca: Path | None = None

    def __post_init__(self) -> None:
        if self.connect_timeout_s <= 0:
            raise ValueError("connect_timeout_s must be positive")


def load_edge(toml_text: str) -> Edge:
    return config_from_mapping(tomllib.loads(toml_text), Edge, source="edge.toml")


def edge_error(toml_text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_edge(toml_text)
    return caught.value


KEY_ERRORS = [
    (
        'edge_id = "a"\n[tunnel]\nping_interval = 3',
        "edge.toml: [tunnel] ping_interval: unknown key (did you mean 'ping_interval_s'?)",
        "tunnel.ping_interval",
    ),
    (
        'edge_id = "a"\nlistner = []',
        "edge.toml: listner: unknown key (did you mean 'listeners'?)",
        "listner",
    ),
    ('edge_id = "a"\nzzz = 1', "edge.toml: zzz: unknown key", "zzz"),
    ("", "edge.toml: edge_id: missing required key (string)", "edge_id"),
    (
        'edge_id = "a"\n[[origins]]\nweight = 1',
        "edge.toml: [origins[0]] name: missing required key (string)",
        "origins[0].name",
    ),
    (
        'edge_id = "a"\n[[listeners]]\n[[listeners]]\naddres = "x"',
        "edge.toml: [listeners[1]] addres: unknown key (did you mean 'address'?)",
        "listeners[1].addres",
    ),
    (
        'edge_id = "a"\n[[listeners]]\ntls = {}',
        "edge.toml: [listeners[0].tls] cert: missing required key (path)",
        "listeners[0].tls.cert",
    ),
    (
        'edge_id = "a"\n[pools.web]\nname = "w"\nwieght = 1',
        "edge.toml: [pools.web] wieght: unknown key (did you mean 'weight'?)",
        "pools.web.wieght",
    ),
    ('edge_id = "a"\ntunnel = 5', "edge.toml: tunnel: expected a table, found integer 5", "tunnel"),
    (
        'edge_id = "a"\nlisteners = [1]',
        "edge.toml: listeners[0]: expected a table, found integer 1",
        "listeners[0]",
    ),
    (
        'edge_id = "a"\nlisteners = {}',
        "edge.toml: listeners: expected array of tables, found a table",
        "listeners",
    ),
]


@pytest.mark.parametrize(("toml_text", "message", "key"), KEY_ERRORS)
def test_key_errors_name_table_key_and_file(toml_text: str, message: str, key: str) -> None:
    error = edge_error(toml_text)
    assert str(error) == message
    assert error.key == key


def test_all_problems_of_a_file_are_reported_at_once() -> None:
    error = edge_error(
        'edje_id = "a"\nlog_level = "loud"\n'
        "[tunnel]\nping_interval = 1\nmax_frame_bytes = true\n"
        '[[listeners]]\nproxy_protocol = "yes"\n'
    )
    assert str(error).splitlines() == [
        "edge.toml: edje_id: unknown key (did you mean 'edge_id'?)",
        "edge.toml: edge_id: missing required key (string)",
        'edge.toml: log_level: expected one of "debug", "info", "warning", found string "loud"',
        'edge.toml: [listeners[0]] proxy_protocol: expected boolean, found string "yes"',
        "edge.toml: [tunnel] ping_interval: unknown key (did you mean 'ping_interval_s'?)",
        "edge.toml: [tunnel] max_frame_bytes: expected integer, found boolean true",
    ]
    assert error.key == "edje_id"


def test_session_config_post_init_error_names_table_and_file() -> None:
    error = edge_error('edge_id = "a"\n[tunnel]\nping_interval_s = 10.0\nmax_frame_bytes = 1')
    message = str(error)
    assert message.startswith("edge.toml: [tunnel] max_frame_bytes must be in [")
    assert message.endswith("; need 0 < ping_interval_s < ping_timeout_s")
    assert len(message.splitlines()) == 1
    assert error.key == "tunnel"


def test_session_config_nested_table_loads() -> None:
    edge = load_edge('edge_id = "a"\n[tunnel]\nping_interval_s = 1\nmax_frame_bytes = 16384')
    assert edge.tunnel == SessionConfig(ping_interval_s=1.0, max_frame_bytes=16384)
    assert type(edge.tunnel.ping_interval_s) is float


def test_root_post_init_error_names_the_file() -> None:
    error = edge_error('edge_id = "a"\nconnect_timeout_s = 0')
    assert str(error) == "edge.toml: connect_timeout_s must be positive"
    assert error.key is None


def test_instances_in_a_mapping_are_taken_as_they_are() -> None:
    tunnel = SessionConfig(ping_interval_s=1.0)
    edge = config_from_mapping({"edge_id": "a", "tunnel": tunnel}, Edge)
    assert edge.tunnel is tunnel


# ------------------------------------------------------------------ files


def test_load_config_resolves_paths_against_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    (conf_dir / "edge.toml").write_text(
        'edge_id = "tokyo-1"\nca = "/pki/ca.pem"\n'
        '[[listeners]]\ntls = { cert = "certs/edge.pem", key = "../keys/edge.key" }\n'
    )
    monkeypatch.chdir(tmp_path)  # a relative path to the file, a cwd elsewhere
    edge = load_config("etc/edge.toml", Edge)
    tls = edge.listeners[0].tls
    assert tls is not None
    assert tls.cert == conf_dir / "certs/edge.pem"
    assert tls.key == conf_dir / "../keys/edge.key"
    assert edge.ca == Path("/pki/ca.pem")


def test_load_config_reports_the_file_as_given(tmp_path: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text('edge_id = "a"\n[tunnel]\nping_interval = 3\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, Edge)
    assert str(caught.value).startswith(f"{path}: [tunnel] ping_interval: unknown key")
    assert caught.value.path == str(path)


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text('edge_id = "a"\n\n[tunnel\nping_interval_s = 1\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, Edge)
    assert str(caught.value).startswith(f"{path}: invalid TOML: ")
    assert "line 3" in str(caught.value)
    assert caught.value.line == 3


def test_duplicate_key_is_a_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text('edge_id = "a"\nedge_id = "b"\n')
    with pytest.raises(ConfigError, match="invalid TOML") as caught:
        load_config(path, Edge)
    assert caught.value.line == 2


def test_missing_file_and_bad_encoding(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read: No such file"):
        load_config(tmp_path / "nope.toml", Edge)
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'edge_id = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"latin1\.toml: not UTF-8 \(byte 14\)"):
        load_config(bad, Edge)


# ------------------------------------------------------------------ schemas


def test_unsupported_schema_types_fail_at_load_time_not_on_first_use() -> None:
    @dataclass(frozen=True)
    class Bad:
        values: set[int] = field(default_factory=set)

    with pytest.raises(TypeError, match="unsupported type in a config schema"):
        config_from_mapping({}, Bad)
    with pytest.raises(TypeError, match="must be a dataclass type"):
        config_from_mapping({}, dict)


def test_field_docs_reads_the_string_after_each_field() -> None:
    docs = field_docs(Edge)
    assert docs["edge_id"] == "Name of this edge in logs and metrics.\n\nUnique per region."
    assert "log_level" not in docs
    assert field_docs(SessionConfig)["ping_interval_s"].startswith("How often we PING")


def test_field_docs_include_inherited_fields() -> None:
    @dataclass(frozen=True)
    class Base:
        a: int = 1
        """From the base."""

    @dataclass(frozen=True)
    class Child(Base):
        b: int = 2
        """From the child."""

    assert field_docs(Child) == {"a": "From the base.", "b": "From the child."}


# ------------------------------------------------------------------ rendering


def sample_edge() -> Edge:
    return Edge(
        edge_id="tokyo-1",
        log_level="debug",
        connect_timeout_s=2.5,
        listeners=(
            Listener(
                address="[::]:443",
                proxy_protocol=True,
                tls=TLS(cert=Path("/etc/geoedge/edge.pem"), key=Path("keys/edge.key")),
                trusted_proxies=(
                    ipaddress.IPv4Network("10.0.0.0/8"),
                    ipaddress.IPv6Network("fd00::/8"),
                ),
            ),
            Listener(tls=TLS(cert=Path("c.pem"))),
            Listener(),
        ),
        tunnel=SessionConfig(ping_interval_s=1.5, max_frame_bytes=32768),
        origins=(Origin("dublin", Weight.HIGH, Mode.SAFE), Origin("frankfurt")),
        headers={"X-Edge": 'tok"yo\\\n\t\x7f\x00é', "with space": ""},
        pools={"web": Origin("web"), "api.v2": Origin("api", Weight.HIGH)},
    )


def test_config_to_toml_round_trips() -> None:
    edge = sample_edge()
    text = config_to_toml(edge)
    assert config_from_mapping(tomllib.loads(text), Edge) == edge


def test_config_to_toml_round_trips_through_a_file(tmp_path: Path) -> None:
    edge = dataclasses.replace(sample_edge(), listeners=(Listener(tls=TLS(Path("/a/c.pem"))),))
    path = tmp_path / "edge.toml"
    path.write_text(config_to_toml(edge))
    assert load_config(path, Edge) == edge


def test_config_to_toml_writes_docs_as_comments_and_unset_optionals() -> None:
    text = config_to_toml(sample_edge())
    assert "# Name of this edge in logs and metrics.\n#\n# Unique per region.\nedge_id =" in text
    assert (
        "# How often we PING to measure RTT and prove the peer alive.\nping_interval_s = 1.5"
        in text
    )
    assert "# ca =  (not set)" in text
    assert "[[listeners]]\n# host:port to listen on.\naddress = " in text
    assert '[pools."api.v2"]' in text


def test_defaults_of_a_schema_render_with_required_keys_commented() -> None:
    text = config_to_toml(Edge)
    assert "# edge_id =  (required: string)" in text
    assert "[tunnel]" in text
    parsed = tomllib.loads(text)
    assert "edge_id" not in parsed
    assert config_from_mapping({**parsed, "edge_id": "x"}, Edge) == Edge(edge_id="x")


def test_required_nested_table_renders_its_defaults() -> None:
    @dataclass(frozen=True)
    class Inner:
        a: int = 1

    @dataclass(frozen=True)
    class Outer:
        inner: Inner

    assert config_to_toml(Outer) == "[inner]\na = 1\n"


def test_config_to_toml_refuses_non_configs() -> None:
    with pytest.raises(TypeError):
        config_to_toml({"a": 1})


@dataclass(frozen=True)
class Values:
    text: str
    number: float
    items: tuple[int, ...]
    keys: dict[str, bool]


@settings(max_examples=examples(200), deadline=None)
@given(
    text=st.text(),
    number=st.floats(allow_nan=False),
    items=st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=5),
    keys=st.dictionaries(st.text(max_size=8), st.booleans(), max_size=4),
)
def test_any_values_round_trip(
    text: str, number: float, items: list[int], keys: dict[str, bool]
) -> None:
    values = Values(text, number, tuple(items), keys)
    assert config_from_mapping(tomllib.loads(config_to_toml(values)), Values) == values


def test_a_renamed_key_still_loads_with_a_warning_naming_the_new_key_and_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One vocabulary: the edge's access log moved to [edge] access_log, as
    the origin's is [origin] access_log. The old place keeps working."""
    from edge.config import EdgeConfig
    from geoedge.config_render import config_to_toml

    new = load_config(DEPLOY_EXAMPLE, EdgeConfig)
    old_text = (
        DEPLOY_EXAMPLE.read_text()
        .replace('access_log = "/var/log/geoedge/access.log"\n', "")
        .replace("[http]\n", '[http]\naccess_log = "/var/log/geoedge/access.log"\n', 1)
    )
    path = tmp_path / "edge.toml"
    path.write_text(old_text)
    with caplog.at_level("WARNING", logger="geoedge.config"):
        old = load_config(path, EdgeConfig)
    assert old.edge.access_log == new.edge.access_log == "/var/log/geoedge/access.log"
    [record] = [r for r in caplog.records if r.name == "geoedge.config"]
    assert record.getMessage() == (
        f"{path}: [http] access_log: deprecated: renamed to [edge] access_log (move it there)"
    )
    # Both at once is an error naming the file, not a silent choice.
    path.write_text(old_text.replace("[edge]\n", '[edge]\naccess_log = "-"\n', 1))
    with pytest.raises(ConfigError) as caught:
        load_config(path, EdgeConfig)
    assert str(caught.value) == (
        f"{path}: [http] access_log: renamed to [edge] access_log: give only the new key"
        " (both are set)"
    )
    # What is rendered (init, --defaults) uses the new name only.
    assert "[http]\naccess_log" not in config_to_toml(new)
