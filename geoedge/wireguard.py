"""WireGuard tooling: keys and wg-quick configs for an origin and its edges.

The alternative to mutual TLS (DESIGN.md): each edge and the origin join a
small WireGuard network, and the tunnel runs as plain TCP inside it. The
origin's tunnel listener binds to its WireGuard address and admits only the
edges' WireGuard addresses; WireGuard has already authenticated the peer by
its key, so the address *is* the identity.

The topology is a star, not a full mesh: edges talk to the origin only.

- origin: ``ListenPort`` = the port of its public endpoint, one ``[Peer]`` per
  edge whose ``AllowedIPs`` is that edge's tunnel address ``/32`` (``/128``);
- edge: one ``[Peer]``, the origin, with its ``Endpoint``, ``AllowedIPs`` = the
  origin's tunnel address only, and ``PersistentKeepalive = 25`` so that NAT
  and stateful firewalls in front of the edge keep the mapping the origin
  needs to reach back (the interval wg-quick's documentation recommends).

Keys and the wg-quick format come from the ``wireguard-tools`` package (a pure
Python implementation of ``wg``); this module only builds the topology. Keys
found in existing configs in the output directory are reused, so adding an
edge does not re-key the others.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from wireguard_tools import WireguardConfig, WireguardKey, WireguardPeer

from geoedge.pki import write_file_atomically

__all__ = [
    "DEFAULT_TUNNEL_PORT",
    "PERSISTENT_KEEPALIVE_S",
    "Keypair",
    "Mesh",
    "MeshMember",
    "WireguardToolingError",
    "edge_config",
    "edge_config_file",
    "edge_snippet",
    "generate_keypair",
    "origin_config",
    "origin_listener_snippet",
    "parse_edge_assignment",
    "plan_mesh",
    "read_existing_keys",
    "render",
    "write_mesh",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ORIGIN_NAME = "origin"
ORIGIN_CONFIG_FILE = "origin-wg0.conf"
DEFAULT_TUNNEL_PORT = 7443
PERSISTENT_KEEPALIVE_S = 25
_DEFAULT_PREFIX = {4: 24, 6: 64}
_EDGE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class WireguardToolingError(ValueError):
    """Bad input to the mesh planner: the message names the value and what is wrong."""


@dataclass(frozen=True, slots=True)
class Keypair:
    """A WireGuard (Curve25519) key pair; ``public`` is derived from ``private``."""

    private: WireguardKey
    public: WireguardKey


@dataclass(frozen=True, slots=True)
class MeshMember:
    """One host of the WireGuard network: ``origin`` or an edge id."""

    name: str
    address: IPAddress
    keys: Keypair


@dataclass(frozen=True, slots=True)
class Mesh:
    """The origin, its edges and where the origin listens: everything the configs need."""

    endpoint_host: str
    endpoint_port: int
    network: IPNetwork
    origin: MeshMember
    edges: tuple[MeshMember, ...]
    tunnel_port: int = DEFAULT_TUNNEL_PORT

    def edge(self, edge_id: str) -> MeshMember:
        for member in self.edges:
            if member.name == edge_id:
                return member
        raise WireguardToolingError(f"no edge called {edge_id!r} in this mesh")


def generate_keypair() -> Keypair:
    private = WireguardKey.generate()
    return Keypair(private=private, public=private.public_key())


def keypair_from_private(private: WireguardKey | str) -> Keypair:
    key = WireguardKey(private)
    return Keypair(private=key, public=key.public_key())


def parse_edge_assignment(text: str) -> tuple[str, str]:
    """``"tokyo-1=10.99.0.11"`` → ``("tokyo-1", "10.99.0.11")`` (the CLI's ``--edge``)."""
    edge_id, sep, address = text.partition("=")
    if not sep or not edge_id or not address:
        raise WireguardToolingError(
            f"--edge must look like ID=ADDRESS (tokyo-1=10.99.0.11), got {text!r}"
        )
    return edge_id.strip(), address.strip()


def plan_mesh(
    origin_endpoint: str,
    origin_ip: str,
    edges: Iterable[tuple[str, str]],
    *,
    network: str | None = None,
    tunnel_port: int = DEFAULT_TUNNEL_PORT,
    keys: Mapping[str, Keypair] | None = None,
) -> Mesh:
    """Validate the topology and give every member a key pair (reused from ``keys``).

    ``network`` defaults to the origin address's /24 (/64 for IPv6); every
    address must lie inside it, be a host address and be used once.
    """
    host, port = _split_endpoint(origin_endpoint)
    origin_address = _address(origin_ip, "--origin-ip")
    net = _network(network, origin_address)
    known = dict(keys or {})
    taken: dict[IPAddress, str] = {}
    members: list[MeshMember] = []
    for name, text in [(ORIGIN_NAME, origin_ip), *edges]:
        if name != ORIGIN_NAME or members:
            _check_edge_id(name, [m.name for m in members])
        address = _address(text, f"address of {name!r}")
        if address not in net or address in (net.network_address, net.broadcast_address):
            raise WireguardToolingError(f"address {address} of {name!r} is not a host of {net}")
        if address in taken:
            raise WireguardToolingError(
                f"address {address} is given to both {taken[address]!r} and {name!r}"
            )
        taken[address] = name
        members.append(MeshMember(name, address, known.get(name) or generate_keypair()))
    if len(members) < 2:
        raise WireguardToolingError("a mesh needs at least one edge (--edge ID=ADDRESS)")
    if not 0 < tunnel_port < 65536:
        raise WireguardToolingError(f"tunnel port must be 1..65535, got {tunnel_port}")
    return Mesh(host, port, net, members[0], tuple(members[1:]), tunnel_port)


#: 1500 minus WireGuard's 80 octets of IPv6+UDP+WireGuard overhead. Without it
#: wg-quick derives the MTU from the route, 9001 inside an EC2 VPC, and packets
#: that leave the region (MTU 1500) get fragmented.
WIREGUARD_MTU = 1420


def origin_config(mesh: Mesh) -> WireguardConfig:
    """The origin's wg-quick config: listening, one ``[Peer]`` per edge."""
    config = WireguardConfig(
        private_key=mesh.origin.keys.private,
        listen_port=mesh.endpoint_port,
        addresses=[_interface(mesh.origin.address, mesh.network)],
        mtu=WIREGUARD_MTU,
    )
    for edge in mesh.edges:
        config.add_peer(
            WireguardPeer(
                public_key=edge.keys.public,
                allowed_ips=[_host_route(edge.address)],
                friendly_name=edge.name,
            )
        )
    return config


def edge_config(mesh: Mesh, edge_id: str) -> WireguardConfig:
    """An edge's wg-quick config: one ``[Peer]``, the origin, kept alive every 25 s."""
    edge = mesh.edge(edge_id)
    config = WireguardConfig(
        private_key=edge.keys.private,
        addresses=[_interface(edge.address, mesh.network)],
        mtu=WIREGUARD_MTU,
    )
    config.add_peer(
        WireguardPeer(
            public_key=mesh.origin.keys.public,
            endpoint_host=mesh.endpoint_host,
            endpoint_port=mesh.endpoint_port,
            persistent_keepalive=PERSISTENT_KEEPALIVE_S,
            allowed_ips=[_host_route(mesh.origin.address)],
            friendly_name=ORIGIN_NAME,
        )
    )
    return config


def render(config: WireguardConfig) -> str:
    """The wg-quick text of ``config``.

    ``wireguard-tools`` writes an IPv6 endpoint without brackets
    (``Endpoint = fd00::1:51820``), which wg-quick cannot parse: add them.
    """
    text = config.to_wgconfig(wgquick_format=True)
    for peer in config.peers.values():
        if isinstance(peer.endpoint_host, ipaddress.IPv6Address):
            bare = f"Endpoint = {peer.endpoint_host}:{peer.endpoint_port}"
            text = text.replace(bare, f"Endpoint = [{peer.endpoint_host}]:{peer.endpoint_port}")
    return text


def edge_config_file(edge_id: str) -> str:
    return f"edge-{edge_id}-wg0.conf"


def read_existing_keys(out_dir: str | Path) -> dict[str, Keypair]:
    """Key pairs of the members whose configs already exist in ``out_dir``, by member name."""
    directory = Path(out_dir)
    found: dict[str, Keypair] = {}
    candidates = [(ORIGIN_NAME, directory / ORIGIN_CONFIG_FILE)]
    for path in sorted(directory.glob("edge-*-wg0.conf")):
        candidates.append((path.name[len("edge-") : -len("-wg0.conf")], path))
    for name, path in candidates:
        if not path.exists():
            continue
        try:
            with path.open() as f:
                parsed = WireguardConfig.from_wgconfig(f)
        except (OSError, ValueError) as exc:
            raise WireguardToolingError(f"{path}: cannot reuse its key: {exc}") from exc
        if parsed.private_key is None:
            raise WireguardToolingError(f"{path}: no PrivateKey in [Interface]")
        found[name] = keypair_from_private(parsed.private_key)
    return found


def write_mesh(mesh: Mesh, out_dir: str | Path) -> list[Path]:
    """Write ``origin-wg0.conf`` and ``edge-<id>-wg0.conf`` (mode 0600: they hold keys)."""
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    files = [(directory / ORIGIN_CONFIG_FILE, origin_config(mesh))]
    files += [(directory / edge_config_file(e.name), edge_config(mesh, e.name)) for e in mesh.edges]
    for path, config in files:
        write_file_atomically(path, render(config).encode(), mode=0o600)
    return [path for path, _ in files]


def origin_listener_snippet(mesh: Mesh) -> str:
    """The origin's ``[tunnel_listener]`` for plain TCP on its WireGuard address."""
    peers = ", ".join(f'"{_host_route(e.address)}"' for e in mesh.edges)
    return "\n".join(
        [
            "# origin: plain TCP inside WireGuard, edges admitted by their WireGuard address",
            "[tunnel_listener]",
            'transport = "tcp"',
            f'address = "{_host_port(mesh.origin.address, mesh.tunnel_port)}"',
            f"allowed_peers = [{peers}]",
        ]
    )


def edge_snippet(mesh: Mesh, edge_id: str) -> str:
    """What an edge dials: the origin's WireGuard address, plain TCP.

    An ``[[origins]]`` entry of ``edge.toml`` (:class:`edge.config.OriginConfig`,
    whose ``tunnel`` table is :class:`tunnel.aio.transport.TunnelDialConfig`).
    """
    edge = mesh.edge(edge_id)
    return "\n".join(
        [
            f"# edge {edge_id}: dial the origin inside WireGuard (interface {edge.address})",
            "[[origins]]",
            f'name = "{ORIGIN_NAME}"',
            "[origins.tunnel]",
            'transport = "tcp"',
            f'address = "{_host_port(mesh.origin.address, mesh.tunnel_port)}"',
        ]
    )


# --- helpers -------------------------------------------------------------------------


def _split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port_text = endpoint.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise WireguardToolingError(
            f"--origin-endpoint must be HOST:PORT (origin.example:51820, [2001:db8::1]:51820), "
            f"got {endpoint!r}"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        _address(host, "--origin-endpoint host")
    elif ":" in host:
        raise WireguardToolingError(
            f"--origin-endpoint: put an IPv6 address in brackets ([{host}]:{port_text})"
        )
    return host, int(port_text)


def _address(text: str, what: str) -> IPAddress:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise WireguardToolingError(f"{what}: {text!r} is not an IP address") from None


def _network(text: str | None, origin: IPAddress) -> IPNetwork:
    if text is None:
        return ipaddress.ip_interface(f"{origin}/{_DEFAULT_PREFIX[origin.version]}").network
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise WireguardToolingError(f"--network: {text!r} is not a CIDR network") from None
    if net.version != origin.version:
        raise WireguardToolingError(f"--network {net} and --origin-ip {origin} differ in family")
    return net


def _check_edge_id(name: str, taken: list[str]) -> None:
    if not _EDGE_ID_RE.match(name) or name == ORIGIN_NAME:
        raise WireguardToolingError(
            f"edge id {name!r} must be 1..63 of [A-Za-z0-9._-] starting with a letter or digit "
            f"(and not {ORIGIN_NAME!r})"
        )
    if name in taken:
        raise WireguardToolingError(f"edge id {name!r} is given twice")


def _interface(
    address: IPAddress, net: IPNetwork
) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    return ipaddress.ip_interface(f"{address}/{net.prefixlen}")


def _host_route(address: IPAddress) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    return ipaddress.ip_interface(f"{address}/{address.max_prefixlen}")


def _host_port(address: IPAddress, port: int) -> str:
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
