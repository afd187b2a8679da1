"""WireGuard tooling: keys, the origin/edge star, and configs that parse back."""

from __future__ import annotations

import ipaddress
import re
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from wireguard_tools import WireguardConfig, WireguardKey

from geoedge import cli
from geoedge import wireguard as wg

EDGES = [("tokyo-1", "10.99.0.11"), ("dublin-1", "10.99.0.12")]


def plan(**kwargs) -> wg.Mesh:
    return wg.plan_mesh("origin.example:51820", "10.99.0.1", EDGES, **kwargs)


def parse(path: Path) -> WireguardConfig:
    with path.open() as f:
        return WireguardConfig.from_wgconfig(f)


def only_peer(config: WireguardConfig):
    assert len(config.peers) == 1
    return next(iter(config.peers.values()))


def test_generated_keys_are_valid_curve25519_pairs() -> None:
    seen = set()
    for _ in range(8):
        pair = wg.generate_keypair()
        raw = pair.private.keydata
        assert len(raw) == 32
        # Clamped as RFC 7748 says, as `wg genkey` does.
        assert raw[0] & 7 == 0 and raw[31] & 0x80 == 0 and raw[31] & 0x40
        # Derive the public key with an independent implementation.
        derived = X25519PrivateKey.from_private_bytes(raw).public_key().public_bytes_raw()
        assert pair.public.keydata == derived
        seen.add(raw)
    assert len(seen) == 8


def test_origin_config_lists_every_edge_by_its_tunnel_address(tmp_path: Path) -> None:
    mesh = plan()
    wg.write_mesh(mesh, tmp_path)
    origin = parse(tmp_path / "origin-wg0.conf")
    assert origin.private_key == mesh.origin.keys.private
    assert origin.listen_port == 51820
    assert origin.addresses == [ipaddress.ip_interface("10.99.0.1/24")]
    by_key = {str(k): p for k, p in origin.peers.items()}
    assert set(by_key) == {str(e.keys.public) for e in mesh.edges}
    for edge in mesh.edges:
        peer = by_key[str(edge.keys.public)]
        assert peer.allowed_ips == [ipaddress.ip_interface(f"{edge.address}/32")]
        assert peer.endpoint_host is None  # the origin waits for edges to call
        assert peer.friendly_name == edge.name


@pytest.mark.parametrize(("edge_id", "address"), EDGES)
def test_edge_config_points_at_the_origin_only(tmp_path: Path, edge_id: str, address: str) -> None:
    mesh = plan()
    wg.write_mesh(mesh, tmp_path)
    edge = parse(tmp_path / f"edge-{edge_id}-wg0.conf")
    assert edge.private_key == mesh.edge(edge_id).keys.private
    assert edge.listen_port is None
    assert edge.addresses == [ipaddress.ip_interface(f"{address}/24")]
    peer = only_peer(edge)
    assert peer.public_key == mesh.origin.keys.public
    assert (peer.endpoint_host, peer.endpoint_port) == ("origin.example", 51820)
    assert peer.allowed_ips == [ipaddress.ip_interface("10.99.0.1/32")]
    assert peer.persistent_keepalive == 25


def test_the_two_ends_of_each_link_hold_each_others_public_keys(tmp_path: Path) -> None:
    wg.write_mesh(plan(), tmp_path)
    origin = parse(tmp_path / "origin-wg0.conf")
    assert origin.private_key is not None
    for edge_id, _ in EDGES:
        edge = parse(tmp_path / f"edge-{edge_id}-wg0.conf")
        assert edge.private_key is not None
        assert only_peer(edge).public_key == origin.private_key.public_key()
        assert edge.private_key.public_key() in origin.peers


def test_config_files_are_private(tmp_path: Path) -> None:
    paths = wg.write_mesh(plan(), tmp_path)
    assert sorted(p.name for p in paths) == [
        "edge-dublin-1-wg0.conf",
        "edge-tokyo-1-wg0.conf",
        "origin-wg0.conf",
    ]
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_existing_keys_are_reused_when_an_edge_is_added(tmp_path: Path) -> None:
    first = plan()
    wg.write_mesh(first, tmp_path)
    keys = wg.read_existing_keys(tmp_path)
    assert set(keys) == {"origin", "tokyo-1", "dublin-1"}
    second = wg.plan_mesh(
        "origin.example:51820", "10.99.0.1", [*EDGES, ("sydney-1", "10.99.0.13")], keys=keys
    )
    assert second.origin.keys == first.origin.keys
    assert second.edge("tokyo-1").keys == first.edge("tokyo-1").keys
    assert second.edge("sydney-1").keys.private not in {m.keys.private for m in first.edges}


def test_ipv6_endpoint_is_bracketed_and_parses_back(tmp_path: Path) -> None:
    mesh = wg.plan_mesh("[2001:db8::1]:51820", "fd00:99::1", [("a", "fd00:99::2")])
    text = wg.render(wg.edge_config(mesh, "a"))
    assert "Endpoint = [2001:db8::1]:51820" in text
    wg.write_mesh(mesh, tmp_path)
    peer = only_peer(parse(tmp_path / "edge-a-wg0.conf"))
    assert peer.endpoint_host == ipaddress.ip_address("2001:db8::1")
    assert peer.allowed_ips == [ipaddress.ip_interface("fd00:99::1/128")]


def test_snippets_match_the_mesh() -> None:
    mesh = plan()
    origin = wg.origin_listener_snippet(mesh)
    assert "[tunnel_listener]" in origin.splitlines()
    assert 'transport = "tcp"' in origin.splitlines()
    assert 'address = "10.99.0.1:7443"' in origin.splitlines()
    assert 'allowed_peers = ["10.99.0.11/32", "10.99.0.12/32"]' in origin.splitlines()
    edge = wg.edge_snippet(mesh, "tokyo-1").splitlines()
    assert 'address = "10.99.0.1:7443"' in edge and 'transport = "tcp"' in edge


def test_snippets_load_with_the_daemons_schemas() -> None:
    """What `geoedge wireguard mesh` prints must be accepted by the config loader."""
    import tomllib

    from edge.config import OriginConfig as EdgeOriginConfig
    from geoedge.config import config_from_mapping
    from tunnel.aio.transport import TunnelListenerConfig

    mesh = plan()
    listener = tomllib.loads(wg.origin_listener_snippet(mesh))["tunnel_listener"]
    loaded = config_from_mapping(listener, TunnelListenerConfig)
    assert loaded.transport == "tcp" and len(loaded.allowed_peers) == 2
    origins = tomllib.loads(wg.edge_snippet(mesh, "tokyo-1"))["origins"]
    dial = config_from_mapping(origins[0], EdgeOriginConfig)
    assert dial.tunnel.address == "10.99.0.1:7443" and dial.tunnel.transport == "tcp"


def test_wireguard_configs_set_an_mtu_that_survives_leaving_the_vpc(tmp_path: Path) -> None:
    mesh = plan()
    assert wg.origin_config(mesh).mtu == 1420
    assert wg.edge_config(mesh, "tokyo-1").mtu == 1420


@pytest.mark.parametrize(
    ("endpoint", "origin_ip", "edges", "network", "message"),
    [
        ("origin.example", "10.99.0.1", EDGES, None, "HOST:PORT"),
        ("origin.example:0", "10.99.0.1", EDGES, None, "HOST:PORT"),
        ("2001:db8::1:51820", "10.99.0.1", EDGES, None, "brackets"),
        ("o:1", "10.99.0.300", EDGES, None, "not an IP address"),
        ("o:1", "10.99.0.1", [], None, "at least one edge"),
        ("o:1", "10.99.0.1", [("a", "10.98.0.2")], None, "not a host of 10.99.0.0/24"),
        ("o:1", "10.99.0.1", [("a", "10.99.0.255")], None, "not a host of"),
        ("o:1", "10.99.0.1", [("a", "10.99.0.1")], None, "given to both 'origin' and 'a'"),
        ("o:1", "10.99.0.1", [("a", "10.99.0.2"), ("a", "10.99.0.3")], None, "given twice"),
        ("o:1", "10.99.0.1", [("origin", "10.99.0.2")], None, "edge id 'origin'"),
        ("o:1", "10.99.0.1", [("to kyo", "10.99.0.2")], None, "edge id 'to kyo'"),
        ("o:1", "10.99.0.1", [("a", "10.99.0.2")], "fd00::/64", "differ in family"),
        ("o:1", "10.99.0.1", [("a", "10.99.0.2")], "banana", "not a CIDR"),
    ],
)
def test_bad_topologies_are_refused_with_a_reason(
    endpoint: str, origin_ip: str, edges, network: str | None, message: str
) -> None:
    with pytest.raises(wg.WireguardToolingError, match=re.escape(message)):
        wg.plan_mesh(endpoint, origin_ip, edges, network=network)


def test_a_wider_network_admits_more_edges() -> None:
    mesh = wg.plan_mesh("o:51820", "10.99.0.1", [("a", "10.99.1.5")], network="10.99.0.0/16")
    assert str(wg.origin_config(mesh).addresses[0]) == "10.99.0.1/16"


@pytest.mark.parametrize("text", ["tokyo-1", "=10.0.0.1", "tokyo-1="])
def test_edge_assignment_needs_id_and_address(text: str) -> None:
    with pytest.raises(wg.WireguardToolingError, match="ID=ADDRESS"):
        wg.parse_edge_assignment(text)


def test_edge_assignment_parses() -> None:
    assert wg.parse_edge_assignment("tokyo-1=10.99.0.11") == ("tokyo-1", "10.99.0.11")


def test_unreadable_existing_config_is_named(tmp_path: Path) -> None:
    (tmp_path / "origin-wg0.conf").write_text("[Interface]\nPrivateKey = short\n")
    with pytest.raises(wg.WireguardToolingError, match=r"origin-wg0\.conf"):
        wg.read_existing_keys(tmp_path)


def test_keypair_from_private_round_trips() -> None:
    pair = wg.generate_keypair()
    assert wg.keypair_from_private(str(pair.private)) == pair
    assert wg.keypair_from_private(WireguardKey(pair.private.hex)) == pair


# --- the geoedge wireguard command ---------------------------------------------------------


def test_cli_mesh_writes_configs_and_prints_the_listener_snippet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "wireguard",
        "mesh",
        "--origin-endpoint",
        "origin.example:51820",
        "--origin-ip",
        "10.99.0.1",
        "--edge",
        "tokyo-1=10.99.0.11",
        "--edge",
        "dublin-1=10.99.0.12",
        "--out",
        str(tmp_path),
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert 'address = "10.99.0.1:7443"' in out
    assert 'allowed_peers = ["10.99.0.11/32", "10.99.0.12/32"]' in out
    origin = parse(tmp_path / "origin-wg0.conf")
    edge = parse(tmp_path / "edge-tokyo-1-wg0.conf")
    assert origin.private_key is not None and edge.private_key is not None
    assert only_peer(edge).public_key == origin.private_key.public_key()
    # Run again: keys are kept, so deployed peers need no change.
    assert cli.main(argv) == 0
    assert "reused existing keys of: dublin-1, origin, tokyo-1" in capsys.readouterr().out
    assert parse(tmp_path / "origin-wg0.conf").private_key == origin.private_key
    assert cli.main([*argv, "--rotate-keys"]) == 0
    assert parse(tmp_path / "origin-wg0.conf").private_key != origin.private_key


def test_cli_mesh_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["wireguard", "mesh", "--origin-endpoint", "o:51820", "--origin-ip", "10.99.0.1"]
    assert cli.main([*argv, "--edge", "tokyo-1", "--out", str(tmp_path)]) == 1
    assert "--edge must look like ID=ADDRESS" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_cli_keys_prints_a_matching_pair(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["wireguard", "keys"]) == 0
    lines = dict(line.split(" = ", 1) for line in capsys.readouterr().out.splitlines())
    assert WireguardKey(lines["PrivateKey"]).public_key() == WireguardKey(lines["PublicKey"])


def test_cli_keys_writes_a_private_key_file(tmp_path: Path) -> None:
    assert cli.main(["wireguard", "keys", "--out", str(tmp_path / "edge")]) == 0
    private = WireguardKey((tmp_path / "edge.key").read_text().strip())
    assert private.public_key() == WireguardKey((tmp_path / "edge.pub").read_text().strip())
    assert stat.S_IMODE((tmp_path / "edge.key").stat().st_mode) == 0o600


def test_cli_mesh_notes_configs_of_edges_no_longer_in_the_mesh(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["wireguard", "mesh", "--origin-endpoint", "o:51820", "--origin-ip", "10.99.0.1"]
    out = ["--out", str(tmp_path)]
    assert cli.main([*argv, "--edge", "a=10.99.0.2", "--edge", "b=10.99.0.3", *out]) == 0
    capsys.readouterr()
    assert cli.main([*argv, "--edge", "a=10.99.0.2", *out]) == 0
    assert f"{tmp_path / 'edge-b-wg0.conf'} is not part of this mesh" in capsys.readouterr().err
    assert len(parse(tmp_path / "origin-wg0.conf").peers) == 1


def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.startswith("geoedge ")
