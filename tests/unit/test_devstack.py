"""The renderers of :mod:`geoedge.devstack` write configs the daemons' own
loaders accept, with the values they were given: a renderer cannot drift from
the schema unnoticed."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.config import EdgeConfig
from geoedge import devstack
from geoedge.config import load_config
from origin.config import load_origin_config


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> devstack.DevPki:
    return devstack.make_dev_pki(
        tmp_path_factory.mktemp("devpki"), edge_id="unit-edge", origin_id="unit-origin"
    )


def test_edge_toml_with_every_table_loads(keys: devstack.DevPki, tmp_path: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text(
        devstack.edge_toml(
            keys,
            comment="every option",
            edge_id=keys.edge_id,
            https_port=8443,
            admin_port=9100,
            origins=[("origin-a", 7000), ("origin-b", 7001)],
            workers=2,
            drain_timeout_s=1.5,
            access_log=tmp_path / "access.log",
            admission={"max_connections": 1000, "max_connections_per_client_ip": 100},
            tunnel={"ping_interval_s": 0.5, "ping_timeout_s": 2.0},
            origin_tunnel={"connections": 3, "connect_timeout_s": 2.0},
        )
    )
    config = load_config(path, EdgeConfig)
    assert (config.edge.id, config.edge.workers, config.edge.drain_timeout_s) == (
        "unit-edge",
        2,
        1.5,
    )
    assert config.listeners[0].address == "127.0.0.1:8443"
    assert config.admin.address == "127.0.0.1:9100"
    assert config.edge.access_log == str(tmp_path / "access.log")
    assert config.admission.max_connections == 1000
    assert config.admission.max_connections_per_client_ip == 100
    assert config.tunnel.ping_interval_s == 0.5
    assert [origin.name for origin in config.origins] == ["origin-a", "origin-b"]
    tunnel = config.origins[1].tunnel
    assert (tunnel.address, tunnel.connections) == ("127.0.0.1:7001", 3)
    assert tunnel.ca == keys.ca


def test_edge_toml_with_defaults_loads(keys: devstack.DevPki, tmp_path: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text(
        devstack.edge_toml(
            keys,
            edge_id=keys.edge_id,
            https_port=8443,
            admin_port=9100,
            origins=[(keys.origin_id, 7000)],
            access_log="",
        )
    )
    config = load_config(path, EdgeConfig)
    assert config.edge.access_log == ""
    assert config.edge.drain_timeout_s == 5.0


def test_origin_toml_with_every_table_loads(keys: devstack.DevPki, tmp_path: Path) -> None:
    path = tmp_path / "origin.toml"
    path.write_text(
        devstack.origin_toml(
            keys,
            comment="every option",
            origin_id=keys.origin_id,
            tunnel_port=7000,
            admin_port=9200,
            allowed_identities=[keys.edge_id, "another-edge"],
            backends=[3000, 3001],
            pool="node",
            health=devstack.HealthCheck("/health", interval_s=0.5, timeout_s=0.4),
            workers=1,
            drain_timeout_s=2.0,
            log_level="warning",
            access_log="",
            log_json=False,
            tunnel={"ping_interval_s": 0.5, "ping_timeout_s": 2.0},
            listener_keys='transport = "tls"\n',
            pool_keys='algorithm = "least_connections"\n',
        )
    )
    config = load_origin_config(path)
    assert (config.origin.id, config.origin.drain_timeout_s) == ("unit-origin", 2.0)
    assert (config.origin.log_level, config.origin.access_log) == ("warning", "")
    assert config.origin.log_json is False
    assert config.tunnel_listener.address == "127.0.0.1:7000"
    assert list(config.tunnel_listener.allowed_identities) == ["unit-edge", "another-edge"]
    assert config.admin.address == "127.0.0.1:9200"
    (pool,) = config.pools
    assert (pool.name, pool.default) == ("node", True)
    assert [backend.address for backend in pool.backends] == [
        "127.0.0.1:3000",
        "127.0.0.1:3001",
    ]
    assert pool.health is not None
    assert (pool.health.path, pool.health.interval_s, pool.health.timeout_s) == (
        "/health",
        0.5,
        0.4,
    )


def test_origin_toml_with_defaults_loads(keys: devstack.DevPki, tmp_path: Path) -> None:
    path = tmp_path / "origin.toml"
    path.write_text(
        devstack.origin_toml(
            keys,
            origin_id=keys.origin_id,
            tunnel_port=7000,
            admin_port=9200,
            allowed_identities=[keys.edge_id],
            backends=[3000],
        )
    )
    config = load_origin_config(path)
    assert config.pools[0].name == "app"
    assert list(config.tunnel_listener.allowed_identities) == ["unit-edge"]


def test_the_callers_configs_load(tmp_path: Path) -> None:
    """What the demo and the load tests write, as they write it."""
    from geoedge import demo
    from loadtests import edge_stack, soak_stack

    demo_keys = demo.write_pki(tmp_path / "demo")
    bench_keys = edge_stack.make_pki(tmp_path / "bench")
    soak_keys = soak_stack.make_pki(tmp_path / "soak")
    bench_ports = edge_stack.Ports()
    soak_ports = soak_stack.Ports.allocate(2)
    rendered = {
        "demo-edge": demo.edge_toml(demo_keys, tmp_path, 8443, 9100, 7000),
        "demo-origin": demo.origin_toml(demo_keys, 7000, 9200, [3000, 3001]),
        "bench-edge": edge_stack.edge_toml(bench_keys, bench_ports),
        "bench-origin": edge_stack.origin_toml(bench_keys, bench_ports),
        "soak-edge": soak_stack.edge_toml(soak_keys, soak_ports),
        "soak-origin": soak_stack.origin_toml(soak_keys, soak_ports),
    }
    for name, text in rendered.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        if name.endswith("-edge"):
            assert load_config(path, EdgeConfig).edge.id == name
        else:
            assert load_origin_config(path).origin.id == name
