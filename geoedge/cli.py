"""The ``geoedge`` command: PKI and WireGuard tooling, host files, the local demo.

Each subcommand is a thin shell over a library function (:mod:`geoedge.pki`,
:mod:`geoedge.wireguard`, :mod:`geoedge.host_init`, :mod:`geoedge.release`,
:mod:`geoedge.demo`), so everything the command does can also be done,
and is tested, from Python. The demo and the config schemas are imported only
when asked for: they pull in the daemons, which the PKI commands on a bare CA
host do not need.

Exit status: 0 on success, 1 when the request cannot be honoured (the message
says why), 2 for a usage error (argparse's convention).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from geoedge import acme_cli, assets, host_init, pki, release, wireguard
from geoedge.version import add_version_option, package_version

__all__ = ["build_parser", "main"]

PROG = "geoedge"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["demo"]:
        # Everything after "demo" belongs to the demo, --help included; argparse's
        # REMAINDER cannot pass an option-like first argument through.
        return _run_demo(args_list[1:])
    if args_list[:1] == ["release"]:
        return release.main(args_list[1:])
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help, or a usage error already printed by argparse
        return exc.code if isinstance(exc.code, int) else 2
    if not hasattr(args, "handler"):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args) or 0)
    except (
        pki.PkiError,
        wireguard.WireguardToolingError,
        host_init.InitError,
        assets.AssetsError,
        acme_cli.AcmeCliError,
    ) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="geo-edge TLS termination with persistent tunnels"
    )
    add_version_option(parser)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_pki(commands)
    _add_wireguard(commands)
    _add_init(commands)
    _add_config(commands)
    acme_cli.add_acme(commands)
    # Listed for --help only: main() hands "demo ..." to the demo before parsing.
    commands.add_parser("demo", help="run origin, edge and sample Node.js backends on localhost")
    commands.add_parser(
        "release", help="versioned installs: install, activate, rollback, list (geoedge.release)"
    )
    version = commands.add_parser("version", help="print the version")
    version.set_defaults(handler=_run_version)
    return parser


# --- pki -----------------------------------------------------------------------------


def _add_pki(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pki_parser = commands.add_parser("pki", help="private CA, server and tunnel certificates")
    sub = pki_parser.add_subparsers(title="pki commands", metavar="PKI_COMMAND", required=True)

    init = sub.add_parser("init", help="create a CA (ca.pem, ca-key.pem)")
    init.add_argument("--dir", required=True, type=Path, help="CA directory")
    init.add_argument("--name", default="geoedge private CA", help="CA common name")
    init.add_argument("--days", type=int, default=3650)
    init.add_argument("--force", action="store_true", help="replace an existing CA")
    init.set_defaults(handler=_pki_init)

    server = sub.add_parser("server", help="issue a TLS server certificate for the edge")
    server.add_argument("--dir", required=True, type=Path, help="CA directory")
    server.add_argument(
        "--name",
        action="append",
        required=True,
        dest="names",
        help="DNS name, *.wildcard or IP address (repeat; the first is the CN)",
    )
    server.add_argument("--rsa", action="store_true", help="RSA-2048 key instead of ECDSA P-256")
    server.add_argument("--out", default="server", help="basename of the files (default: server)")
    server.add_argument("--out-dir", type=Path, help="where to write (default: --dir)")
    server.add_argument("--days", type=int, default=825)
    server.set_defaults(handler=_pki_server)

    peer = sub.add_parser("peer", help="issue a tunnel mutual-TLS certificate")
    peer.add_argument("--dir", required=True, type=Path, help="CA directory")
    peer.add_argument("--role", required=True, choices=["edge", "origin"])
    peer.add_argument("--id", required=True, dest="identity", help="identity, e.g. tokyo-1")
    peer.add_argument(
        "--dns", action="append", default=[], dest="dns_names", help="DNS SAN (repeat)"
    )
    peer.add_argument("--out", help="basename of the files (default: <role>-<id>)")
    peer.add_argument("--out-dir", type=Path, help="where to write (default: --dir)")
    peer.add_argument("--days", type=int, default=825)
    peer.set_defaults(handler=_pki_peer)

    renew = sub.add_parser(
        "renew",
        help="issue tunnel certificates again: same identity, role and names, a new key",
    )
    renew.add_argument("--dir", required=True, type=Path, help="CA directory (old or new CA)")
    renew.add_argument("files", nargs="+", type=Path, metavar="CERT", help="the .pem to renew")
    renew.add_argument("--days", type=int, default=825)
    renew.add_argument("--out-dir", type=Path, help="where to write (default: beside each file)")
    renew.set_defaults(handler=_pki_renew)

    show = sub.add_parser("show", help="subject, SANs, identity and expiry of certificates")
    show.add_argument("files", nargs="+", type=Path, metavar="FILE")
    show.set_defaults(handler=_pki_show)


def _pki_init(args: argparse.Namespace) -> int:
    paths = pki.create_ca(args.dir, name=args.name, days=args.days, overwrite=args.force)
    _print_written(paths)
    return 0


def _pki_server(args: argparse.Namespace) -> int:
    paths = pki.issue_server_cert(
        args.dir,
        args.out_dir or args.dir,
        args.out,
        args.names,
        key_type="rsa" if args.rsa else "ecdsa",
        days=args.days,
    )
    _print_written(paths)
    return 0


def _pki_peer(args: argparse.Namespace) -> int:
    paths = pki.issue_peer_cert(
        args.dir,
        args.out_dir or args.dir,
        args.out or f"{args.role}-{args.identity}",
        args.identity,
        role=args.role,
        dns_names=args.dns_names,
        days=args.days,
    )
    _print_written(paths)
    return 0


def _pki_renew(args: argparse.Namespace) -> int:
    ca = pki.load_ca(args.dir)
    for path in args.files:
        paths = pki.renew_peer_cert(ca, path, days=args.days, out_dir=args.out_dir)
        _print_written(paths)
    return 0


def _pki_show(args: argparse.Namespace) -> int:
    print("\n\n".join(pki.describe_certificate(path) for path in args.files))
    return 0


def _print_written(paths: pki.CertPaths) -> None:
    print(f"wrote {paths.cert}")
    print(f"wrote {paths.key} (mode 0600)")


# --- wireguard -----------------------------------------------------------------------


def _add_wireguard(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    wg_parser = commands.add_parser("wireguard", help="WireGuard keys and configs")
    sub = wg_parser.add_subparsers(title="wireguard commands", metavar="WG_COMMAND", required=True)

    keys = sub.add_parser("keys", help="generate a key pair")
    keys.add_argument(
        "--out", type=Path, help="write PREFIX.key (mode 0600) and PREFIX.pub instead of printing"
    )
    keys.set_defaults(handler=_wg_keys)

    mesh = sub.add_parser("mesh", help="wg-quick configs for an origin and its edges")
    mesh.add_argument("--origin-endpoint", required=True, help="public HOST:PORT of the origin")
    mesh.add_argument("--origin-ip", required=True, help="the origin's WireGuard address")
    mesh.add_argument(
        "--edge",
        action="append",
        required=True,
        dest="edges",
        metavar="ID=ADDRESS",
        help="an edge and its WireGuard address (repeat)",
    )
    mesh.add_argument("--network", help="WireGuard network (default: the origin's /24 or /64)")
    mesh.add_argument("--tunnel-port", type=int, default=wireguard.DEFAULT_TUNNEL_PORT)
    mesh.add_argument("--out", required=True, type=Path, help="output directory")
    mesh.add_argument(
        "--rotate-keys", action="store_true", help="new keys even where configs exist in --out"
    )
    mesh.set_defaults(handler=_wg_mesh)


def _wg_keys(args: argparse.Namespace) -> int:
    pair = wireguard.generate_keypair()
    if args.out is None:
        print(f"PrivateKey = {pair.private}")
        print(f"PublicKey = {pair.public}")
        return 0
    prefix: Path = args.out
    prefix.parent.mkdir(parents=True, exist_ok=True)
    private_path = prefix.with_name(prefix.name + ".key")
    public_path = prefix.with_name(prefix.name + ".pub")
    pki.write_file_atomically(private_path, f"{pair.private}\n".encode(), mode=0o600)
    pki.write_file_atomically(public_path, f"{pair.public}\n".encode(), mode=0o644)
    print(f"wrote {private_path} (mode 0600)")
    print(f"wrote {public_path}: {pair.public}")
    return 0


def _wg_mesh(args: argparse.Namespace) -> int:
    edges = [wireguard.parse_edge_assignment(text) for text in args.edges]
    keys = (
        {} if args.rotate_keys or not args.out.exists() else wireguard.read_existing_keys(args.out)
    )
    mesh = wireguard.plan_mesh(
        args.origin_endpoint,
        args.origin_ip,
        edges,
        network=args.network,
        tunnel_port=args.tunnel_port,
        keys=keys,
    )
    for path in wireguard.write_mesh(mesh, args.out):
        print(f"wrote {path} (mode 0600)")
    members = {"origin", *dict(edges)}
    reused = sorted(name for name in keys if name in members)
    if reused:
        print(f"reused existing keys of: {', '.join(reused)}")
    for name in sorted(set(keys) - members):
        stale = args.out / wireguard.edge_config_file(name)
        print(f"note: {stale} is not part of this mesh (left alone)", file=sys.stderr)
    print()
    print(wireguard.origin_listener_snippet(mesh))
    for edge in mesh.edges:
        print()
        print(wireguard.edge_snippet(mesh, edge.name))
    return 0


# --- init, config ---------------------------------------------------------------------


def _add_init(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = commands.add_parser(
        "init",
        help="write one host's config, units, sysctl file and cloud-init",
        description="Write the files one host needs into --out, ready to copy: for "
        "an edge or an origin the config (every key, commented), the systemd "
        "unit(s), the sysctl file and EC2 user data; for a Node.js backend host "
        "the geoedge-node@.service template and the sample app. Prints where "
        "each file goes.",
    )
    sub = init.add_subparsers(title="roles", metavar="ROLE", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", required=True, type=Path, help="output directory")
    common.add_argument("--force", action="store_true", help="overwrite existing files")

    roles = argparse.ArgumentParser(add_help=False)
    roles.add_argument(
        "--etc",
        type=Path,
        default=host_init.DEFAULT_ETC,
        help="where the config and certificates live on the host (/etc/geoedge)",
    )
    roles.add_argument(
        "--wheel-url",
        help="the geoedge wheel (or pip URL) the cloud-init installs "
        "(default: a placeholder to edit)",
    )

    edge = sub.add_parser("edge", parents=[common, roles], help="an edge host")
    edge.add_argument("--id", dest="edge_id", default="edge-1", help="the edge id (edge-1)")
    edge.add_argument(
        "--origin",
        action="append",
        dest="origins",
        metavar="HOST:PORT",
        help="an origin's tunnel address (repeat; the first is the primary; "
        "default origin.example.com:7443)",
    )
    edge.add_argument(
        "--name",
        action="append",
        dest="names",
        help="a name users connect to (repeat; default app.example.com)",
    )
    edge.add_argument("--nlb-cidr", help="behind an NLB with PROXY v2: the VPC CIDR")
    edge.add_argument(
        "--acme",
        action="store_true",
        help="take the certificates users see from the origin's ACME client (docs/acme.md)",
    )
    edge.set_defaults(handler=_init_edge)

    origin = sub.add_parser("origin", parents=[common, roles], help="an origin host")
    origin.add_argument("--id", dest="origin_id", default="origin-1", help="origin id")
    origin.add_argument(
        "--edge", action="append", dest="edges", metavar="ID", help="an edge id to admit (repeat)"
    )
    origin.add_argument(
        "--backend",
        action="append",
        dest="backends",
        metavar="HOST:PORT",
        help="a Node.js backend (repeat; default: the sample app on 127.0.0.1:3001-3004)",
    )
    origin.add_argument(
        "--name", action="append", dest="names", help="a host name the pool serves (repeat)"
    )
    origin.add_argument(
        "--acme-domain",
        action="append",
        dest="acme_domains",
        metavar="NAME",
        help="keep a certificate for NAME issued for every edge by ACME (repeat; docs/acme.md)",
    )
    origin.add_argument(
        "--acme-contact", action="append", metavar="EMAIL", help="the ACME account's contact"
    )
    origin.add_argument(
        "--acme-agree-terms", action="store_true", help="you agree to the CA's terms of service"
    )
    origin.add_argument(
        "--acme-production",
        action="store_true",
        help="Let's Encrypt's production CA (default: its staging CA)",
    )
    origin.set_defaults(handler=_init_origin)

    node = sub.add_parser("node", parents=[common], help="a Node.js backend host")
    node.set_defaults(handler=_init_node)

    metrics = sub.add_parser(
        "metrics",
        parents=[common],
        help="a host's Prometheus agent: scrape the daemon, remote-write to a workspace",
    )
    metrics.add_argument("--role", required=True, choices=["edge", "origin"])
    metrics.add_argument("--instance", required=True, help="the instance label (<id>-<i-...>)")
    metrics.add_argument("--region", required=True, help="this host's AWS region")
    metrics.add_argument("--workspace", required=True, help="Amazon Managed Prometheus ws-...")
    metrics.add_argument("--workspace-region", required=True, help="the workspace's region")
    metrics.add_argument("--admin", help="the daemon's admin address (default: the schema's)")
    metrics.set_defaults(handler=_init_metrics)


def _init_edge(args: argparse.Namespace) -> int:
    defaults = host_init.EdgeChoices()
    choices = host_init.EdgeChoices(
        edge_id=args.edge_id,
        origins=tuple(args.origins or defaults.origins),
        names=tuple(args.names or defaults.names),
        nlb_cidr=args.nlb_cidr,
        acme=args.acme,
        etc_dir=args.etc,
        wheel_url=args.wheel_url,
    )
    return _write_init("edge", host_init.edge_files(choices), args)


def _init_origin(args: argparse.Namespace) -> int:
    defaults = host_init.OriginChoices()
    choices = host_init.OriginChoices(
        origin_id=args.origin_id,
        edges=tuple(args.edges or defaults.edges),
        backends=tuple(args.backends or defaults.backends),
        names=tuple(args.names or ()),
        acme_domains=tuple(args.acme_domains or ()),
        acme_contact=tuple(args.acme_contact or ()),
        acme_agree_terms=args.acme_agree_terms,
        acme_production=args.acme_production,
        etc_dir=args.etc,
        wheel_url=args.wheel_url,
    )
    return _write_init("origin", host_init.origin_files(choices), args)


def _init_node(args: argparse.Namespace) -> int:
    return _write_init("node", host_init.node_files(), args)


def _init_metrics(args: argparse.Namespace) -> int:
    choices = host_init.MetricsChoices(
        role=args.role,
        instance=args.instance,
        region=args.region,
        workspace=args.workspace,
        workspace_region=args.workspace_region,
        admin=args.admin,
    )
    for path in host_init.write_host_files(
        host_init.metrics_files(choices), args.out, force=args.force
    ):
        print(f"wrote {path}")
    return 0


def _write_init(role: str, files: list[host_init.HostFile], args: argparse.Namespace) -> int:
    for path in host_init.write_host_files(files, args.out, force=args.force):
        print(f"wrote {path}")
    print("\nto install on the host, as root:")
    for step in host_init.install_steps(role, files, args.out):
        print(f"  {step}")
    if role != "node":
        print(f"EC2 user data instead: gzip -9 -c {args.out}/cloud-init.yaml (docs/deployment.md)")
    return 0


def _add_config(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = commands.add_parser(
        "config", help="print a daemon's full default config, or the configuration reference"
    )
    what = config.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--defaults",
        choices=sorted(host_init.SCHEMAS),
        metavar="ROLE",
        help="edge or origin: every key and table with its default, commented",
    )
    what.add_argument(
        "--reference",
        action="store_true",
        help="every key of both daemons as Markdown (docs/configuration.md)",
    )
    config.set_defaults(handler=_config)


def _config(args: argparse.Namespace) -> int:
    if args.reference:
        from geoedge.config_reference import reference_markdown

        schemas = [(role, host_init.load_schema(role)) for role in ("edge", "origin")]
        sys.stdout.write(reference_markdown(schemas))
    else:
        sys.stdout.write(host_init.defaults_toml(args.defaults))
    return 0


# --- demo, version -------------------------------------------------------------------


def _run_demo(demo_args: list[str]) -> int:
    try:
        demo = importlib.import_module("geoedge.demo")
    except ModuleNotFoundError as exc:
        if exc.name != "geoedge.demo":
            raise  # a dependency of the demo is missing: show the real error
        print(f"{PROG}: error: this installation has no demo (geoedge.demo)", file=sys.stderr)
        return 1
    return int(demo.main(demo_args) or 0)


def _run_version(args: argparse.Namespace) -> int:
    print(f"{PROG} {package_version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
