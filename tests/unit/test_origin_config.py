"""origin.toml: the example config loads, and wrong configs are refused naming
the file and the key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from geoedge import pki
from geoedge.config import ConfigError, config_from_mapping
from geoedge.config_render import config_to_toml
from origin.__main__ import main
from origin.config import OriginConfig, load_origin_config, normalize_host

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "config" / "origin.example.toml"

MINIMAL = """
[tunnel_listener]
address = "127.0.0.1:7443"
transport = "tcp"
allowed_peers = ["10.77.0.0/24"]

[[pools]]
name = "web"
default = true

[[pools.backends]]
address = "127.0.0.1:3001"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "origin.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_example_config_loads() -> None:
    config = load_origin_config(EXAMPLE)
    web, api = config.pools
    assert web.default and web.algorithm == "least_connections" and len(web.backends) == 4
    assert web.health is not None and web.health.rise == 2
    assert api.dns is not None and api.dns.type == "SRV" and api.proxy_protocol == "v2"
    assert config.tunnel_listener.transport == "tls"
    assert config.origin.drain_timeout_s == 30.0


def test_example_systemd_unit_outlasts_the_drain() -> None:
    unit = (ROOT / "deploy" / "systemd" / "geoedge-origin.service").read_text()
    drain = load_origin_config(EXAMPLE).origin.drain_timeout_s
    stop = next(line for line in unit.splitlines() if line.startswith("TimeoutStopSec="))
    assert float(stop.split("=")[1]) > drain
    reload = "/usr/local/bin/geoedge-origin --config /etc/geoedge/origin.toml --reload $MAINPID"
    assert f"ExecReload={reload}" in unit
    assert "KillSignal=SIGTERM" in unit
    assert "--config /etc/geoedge/origin.toml" in unit


def test_minimal_config_and_defaults(tmp_path: Path) -> None:
    config = load_origin_config(write(tmp_path, MINIMAL))
    (web,) = config.pools
    assert web.connect_retries == 2 and web.proxy_protocol == "off" and web.health is None
    assert config.origin.workers == 0
    assert config.admin.address == "127.0.0.1:7445"


def test_rendered_config_loads_back_equal(tmp_path: Path) -> None:
    config = load_origin_config(EXAMPLE)
    path = tmp_path / "again.toml"
    path.write_text(config_to_toml(config))
    assert load_origin_config(path) == config


@pytest.mark.parametrize(
    ("keys", "table", "key", "message"),
    [
        ("", "[pools.health]\nrise = 0", "pools[0].health", "rise and fall"),
        ("", "[pools.health]\nintervall_s = 1", "pools[0].health.intervall_s", "did you mean"),
        ('algorithm = "fastest"', "", "pools[0].algorithm", "one of"),
        ('proxy_protocol = "v3"', "", "pools[0].proxy_protocol", "one of"),
        ("", '[pools.dns]\nname = "x.test"\ntype = "A"', "pools[0].dns", "needs a port"),
        (
            "",
            '[pools.dns]\nname = "x"\ntype = "SRV"\nnameservers = ["dns.test"]',
            "pools[0].dns",
            "not an IP address",
        ),
    ],
)
def test_bad_pool_settings_name_the_key(
    tmp_path: Path, keys: str, table: str, key: str, message: str
) -> None:
    """``keys`` go into [[pools]] itself, ``table`` is a sub-table of it."""
    text = textwrap.dedent(MINIMAL).replace("default = true\n", f"default = true\n{keys}\n")
    text = text.replace("[[pools.backends]]", f"{table}\n\n[[pools.backends]]")
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_origin_config(path)
    assert str(path) in str(info.value)
    assert info.value.key == key
    assert message in str(info.value)


def test_cross_pool_rules(tmp_path: Path) -> None:
    base = textwrap.dedent(MINIMAL)
    second = base[base.index("[[pools]]") :].replace('name = "web"', 'name = "web"')
    with pytest.raises(ConfigError, match="pool names must be unique"):
        load_origin_config(write(tmp_path, base + second))
    third = second.replace('name = "web"', 'name = "two"')
    with pytest.raises(ConfigError, match="more than one default pool"):
        load_origin_config(write(tmp_path, base + third))


def test_pool_needs_backends_and_bare_hosts() -> None:
    listener = {"address": "127.0.0.1:1", "transport": "tcp", "allowed_peers": ["10.0.0.0/8"]}
    with pytest.raises(ConfigError, match="needs backends or a dns table"):
        config_from_mapping({"tunnel_listener": listener, "pools": [{"name": "x"}]}, OriginConfig)
    with pytest.raises(ConfigError, match="without port"):
        config_from_mapping(
            {
                "tunnel_listener": listener,
                "pools": [
                    {"name": "x", "hosts": ["a.test:443"], "backends": [{"address": "127.0.0.1:1"}]}
                ],
            },
            OriginConfig,
        )
    with pytest.raises(ConfigError, match=r"host 'a\.test' is in pools 'x' and 'y'"):
        config_from_mapping(
            {
                "tunnel_listener": listener,
                "pools": [
                    {"name": n, "hosts": ["a.test"], "backends": [{"address": "127.0.0.1:1"}]}
                    for n in ("x", "y")
                ],
            },
            OriginConfig,
        )


def test_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--check`` opens the files the example names: missing here, then made
    by ``geoedge pki`` where the example expects them."""
    assert main(["--config", str(EXAMPLE), "--check"]) == 2
    err = capsys.readouterr().err
    assert "[tunnel_listener] cert: /etc/geoedge/pki/origin.pem: cannot read" in err
    root = tmp_path / "etc" / "geoedge"
    pki.create_ca(tmp_path / "ca")
    pki.issue_peer_cert(tmp_path / "ca", root / "pki", "origin", "dublin", role="origin")
    (root / "pki" / "ca.pem").write_bytes((tmp_path / "ca" / pki.CA_CERT_FILE).read_bytes())
    moved = tmp_path / "origin.toml"
    moved.write_text(EXAMPLE.read_text().replace("/etc/geoedge/", f"{root}/"))
    assert main(["--config", str(moved), "--check"]) == 0
    assert "ok (2 pool(s))" in capsys.readouterr().out
    bad = write(tmp_path, MINIMAL.replace("[[pools.backends]]", "[[pools.backendz]]"))
    assert main(["--config", str(bad), "--check"]) == 2
    assert "backendz: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "host"),
    [
        ("Example.COM:443", "example.com"),
        ("[::1]:80", "::1"),
        ("a.test.", "a.test"),
        ("2001:db8::1", "2001:db8::1"),
        ("  h  ", "h"),
    ],
)
def test_normalize_host(text: str, host: str) -> None:
    assert normalize_host(text) == host
