"""``geoedge init edge|origin|node --out DIR``: the files one host needs, ready to copy.

For an edge or an origin: the config, rendered from the schema the daemon
loads (:func:`geoedge.config_render.config_to_toml`: every key with its value
and its docstring as a comment, so it is also the reference), the systemd
unit(s), the sysctl file, and EC2 user data (cloud-init) carrying that same
config. For a Node.js backend host: the ``geoedge-node@.service`` template and
the sample app. Units, sysctl and cloud-init are the shipped files
(:mod:`geoedge.assets`) with the host's choices filled in; nothing is
installed: :func:`install_steps` says where each file goes.

The schemas are looked up by name (:data:`SCHEMAS`), not imported at the top:
the shared runtime sits below the daemons (``edge`` and ``origin`` import it),
and a tool here that renders their configs must not make that a circle.

Paths: every file a config names lives under ``etc_dir`` (``/etc/geoedge``),
with the names ``geoedge pki`` writes (docs/deployment.md, section 3). Another
``etc_dir`` is carried into the unit's ``--config`` and the cloud-init too, so
the files stay consistent with each other.
"""

from __future__ import annotations

import importlib
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from geoedge import assets
from geoedge.config import ConfigError, config_from_mapping, schema_fields
from geoedge.config_render import config_to_toml
from geoedge.pki import write_file_atomically
from geoedge.version import package_version

__all__ = [
    "DEFAULT_ETC",
    "NODE_PORTS",
    "SCHEMAS",
    "EdgeChoices",
    "HostFile",
    "InitError",
    "MetricsChoices",
    "OriginChoices",
    "defaults_toml",
    "edge_files",
    "install_steps",
    "load_schema",
    "metrics_files",
    "node_files",
    "origin_files",
    "write_host_files",
]

Role = Literal["edge", "origin"]

#: Config schema of each daemon, by ``module:class``.
SCHEMAS: dict[str, str] = {"edge": "edge.config:EdgeConfig", "origin": "origin.config:OriginConfig"}
DEFAULT_ETC = Path("/etc/geoedge")
#: Ports of the sample Node.js backends next to an origin (geoedge-node@PORT).
NODE_PORTS = (3001, 3002, 3003, 3004)
#: The example wheel URL in the shipped cloud-init files, replaced by ``--wheel-url``.
EXAMPLE_WHEEL_URL = "https://downloads.example.com/geoedge/geoedge-0.1.0-py3-none-any.whl"
#: The example edge id in the shipped edge cloud-init, replaced by the edge's id.
EXAMPLE_EDGE_ID = "tokyo-1"
EXAMPLE_ORIGIN_ID = "dublin-1"


#: The tunnel tuning deploy/config/edge.example.toml explains, for links
#: between regions (~100-300 ms): the first round trip after a tunnel comes up
#: (before the RTT is measured) opens windows wide enough for a 768 KB response
#: instead of three round trips. The schema's defaults are the wire's
#: (tunnel/PROTOCOL.md), which suit any link; a host that `geoedge init` writes
#: is one of a fleet, so it gets these.
LONG_LINK_TUNNEL: dict[str, Any] = {
    "initial_stream_window_bytes": 1024 * 1024,
    "initial_connection_window_bytes": 32 * 1024 * 1024,
}


class InitError(ValueError):
    """A choice given to ``geoedge init`` cannot make a valid host; the message says which."""


@dataclass(frozen=True, slots=True)
class HostFile:
    """One file for one host."""

    name: str
    """Where it is written, relative to ``--out``."""
    content: str
    mode: int
    """Its mode there and on the host (0640 for a config: it names key files)."""
    destination: str | None
    """Where it goes on the host; None for files that are not copied as they are
    (the cloud-init is EC2 user data)."""
    owner: str = "root:root"


@dataclass(frozen=True, slots=True)
class EdgeChoices:
    """What differs between edge hosts; everything else takes the schema's default."""

    edge_id: str = "edge-1"
    origins: tuple[str, ...] = ("origin.example.com:7443",)
    """``host:port`` of each origin's tunnel listener; the first is the primary."""
    names: tuple[str, ...] = ("app.example.com",)
    """The names users connect to (SNI of the server certificate)."""
    nlb_cidr: str | None = None
    """Behind an NLB sending PROXY v2: the VPC CIDR its nodes come from."""
    acme: bool = False
    """The certificates users see come from the origin's ACME client ([acme]
    enabled, no certificate files); else from files in ``etc_dir``/tls."""
    etc_dir: Path = DEFAULT_ETC
    wheel_url: str | None = None


@dataclass(frozen=True, slots=True)
class OriginChoices:
    origin_id: str = "origin-1"
    edges: tuple[str, ...] = ("edge-1",)
    """Edge ids admitted (their ``geoedge pki peer --role edge --id``)."""
    backends: tuple[str, ...] = tuple(f"127.0.0.1:{port}" for port in NODE_PORTS)
    """Node.js backends, ``host:port``; the default is the sample app's units here."""
    names: tuple[str, ...] = ()
    """Host names the pool serves; empty: it is the default pool for every name."""
    tunnel_address: str = "0.0.0.0:7443"
    acme_domains: tuple[str, ...] = ()
    """ACME ([acme], docs/acme.md): the names of one certificate the origin keeps
    issued for every edge; empty: no [acme]. A wildcard adds DNS-01 by Route 53."""
    acme_contact: tuple[str, ...] = ()
    acme_agree_terms: bool = False
    acme_production: bool = False
    """Let's Encrypt's production CA; else its staging CA (start there)."""
    etc_dir: Path = DEFAULT_ETC
    wheel_url: str | None = None


# ----------------------------------------------------------------------------- schemas


def load_schema(role: str) -> type:
    """The config dataclass of ``edge`` or ``origin``."""
    try:
        module_name, _, class_name = SCHEMAS[role].partition(":")
    except KeyError:
        raise InitError(f"no config schema for {role!r} (one of: {', '.join(SCHEMAS)})") from None
    schema: type = getattr(importlib.import_module(module_name), class_name)
    return schema


def defaults_toml(role: str) -> str:
    """``geoedge config --defaults ROLE``: every key, its default and its
    docstring; every table, the ones with no default entry (``[[origins]]``,
    ``[[pools]]``, ``[redirect]``...) as a commented-out example taken from
    what ``geoedge init`` writes."""
    header = (
        f"# Every key of {role}.toml with its default (geoedge {package_version()}).\n"
        "# Keys shown as comments have no default: they are required, or unset.\n"
        "# Tables shown as comments are examples: optional tables, and one entry\n"
        "# of each array of tables ([[...]]); uncomment and edit them.\n\n"
    )
    example = (
        edge_config_mapping(EdgeChoices(nlb_cidr="10.20.0.0/16"))
        if role == "edge"
        else origin_config_mapping(OriginChoices(names=("app.example.com",)))
    )
    example = _with_examples(role, example)
    return header + config_to_toml(load_schema(role), example=example)


def _with_examples(role: str, mapping: dict[str, Any]) -> dict[str, Any]:
    """Values for the example entries that ``geoedge init`` does not write."""
    if role == "origin":
        [pool] = mapping["pools"]
        pool["dns"] = {"name": "app.service.consul", "type": "A", "port": 3000}
        mapping["acme"] = {
            "contact": ["mailto:ops@example.com"],
            "agree_to_terms": True,
            "certificates": [{"id": "app", "domains": ["app.example.com", "*.app.example.com"]}],
            "dns": {"provider": "route53"},
        }
    return mapping


def _render(role: Role, mapping: dict[str, Any], header: str) -> str:
    """Validate ``mapping`` with the daemon's own loader, then render it in full."""
    try:
        config: object = config_from_mapping(mapping, load_schema(role), source=f"{role}.toml")
    except (ConfigError, ValueError) as exc:  # a choice the schema refuses
        raise InitError(str(exc)) from None
    return header + config_to_toml(config)


# ------------------------------------------------------------------------------- edge


def _origin_name(host: str, taken: list[str]) -> str:
    try:
        ipaddress.ip_address(host)
        base = "origin"
    except ValueError:
        base = host.split(".", 1)[0] or "origin"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def _split_host_port(text: str, what: str) -> tuple[str, int]:
    from tunnel.aio.transport import parse_host_port

    try:
        return parse_host_port(text)
    except ValueError as exc:
        raise InitError(f"{what}: {exc}") from None


def edge_config_mapping(choices: EdgeChoices) -> dict[str, Any]:
    etc = choices.etc_dir
    pki = etc / "pki"
    origins: list[dict[str, Any]] = []
    for index, address in enumerate(choices.origins):
        host, _ = _split_host_port(address, "--origin")
        origin: dict[str, Any] = {
            "name": _origin_name(host, [o["name"] for o in origins]),
            "weight": 10 if index == 0 and len(choices.origins) > 1 else 1,
            "tunnel": {
                "address": address,
                "server_name": host,
                "cert": str(pki / f"edge-{choices.edge_id}.pem"),
                "key": str(pki / f"edge-{choices.edge_id}-key.pem"),
                "ca": str(pki / "ca.pem"),
            },
        }
        origins.append(origin)
    listener: dict[str, Any] = {"address": "0.0.0.0:443"}
    if choices.nlb_cidr is not None:
        listener |= {"proxy_protocol": "v2", "trusted_proxies": [choices.nlb_cidr]}
    return {
        "edge": {"id": choices.edge_id, "access_log": "/var/log/geoedge/access.log"},
        "listeners": [listener],
        "redirect": {"address": "0.0.0.0:80"},
        **_server_certificates(choices),
        "origins": origins,
        "tunnel": dict(LONG_LINK_TUNNEL),
    }


def _server_certificates(choices: EdgeChoices) -> dict[str, Any]:
    """Files (the default), or ACME's: files take precedence for their names, so
    an ACME edge is one with none."""
    if choices.acme:
        return {"tls": {}, "acme": {"enabled": True}}
    etc = choices.etc_dir
    certificate = {
        "cert": str(etc / "tls" / "app-ecdsa.pem"),
        "key": str(etc / "tls" / "app-ecdsa-key.pem"),
        "names": list(choices.names),
    }
    return {"tls": {"certificates": [certificate]}}


def edge_files(choices: EdgeChoices) -> list[HostFile]:
    etc = choices.etc_dir
    edge_id = choices.edge_id
    header = _header(
        f"edge.toml of edge {edge_id}",
        "edge",
        etc,
        [
            f"{etc}/pki/ca.pem, edge-{edge_id}.pem, edge-{edge_id}-key.pem: its tunnel "
            f"certificate (geoedge pki peer --role edge --id {edge_id})",
            "the server certificates users see: from the origin's ACME client ([acme] "
            "on the origin, docs/acme.md), kept in /var/lib/geoedge/edge-acme"
            if choices.acme
            else f"{etc}/tls/app-ecdsa.pem, app-ecdsa-key.pem: the server certificate users "
            f"see, for {', '.join(choices.names)} (a public CA, or geoedge pki server)",
        ],
    )
    config = _render("edge", edge_config_mapping(choices), header)
    user_data = _user_data("edge", config, etc, choices.wheel_url)
    user_data = user_data.replace(EXAMPLE_EDGE_ID, edge_id)
    return [
        _config_file("edge", config, etc),
        _shipped_unit("geoedge-edge.service", etc),
        _shipped_unit("geoedge-edge.socket", etc),
        _sysctl_file(),
        HostFile("cloud-init.yaml", user_data, 0o600, None),
    ]


# ----------------------------------------------------------------------------- origin


def origin_config_mapping(choices: OriginChoices) -> dict[str, Any]:
    pki = choices.etc_dir / "pki"
    for backend in choices.backends:
        _split_host_port(backend, "--backend")
    pool: dict[str, Any] = {
        "name": "app",
        "default": True,
        "hosts": list(choices.names),
        "health": {"path": "/health"},
        "backends": [{"address": address} for address in choices.backends],
    }
    return {
        "tunnel_listener": {
            "address": choices.tunnel_address,
            "transport": "tls",
            "cert": str(pki / "origin.pem"),
            "key": str(pki / "origin-key.pem"),
            "ca": str(pki / "ca.pem"),
            "allowed_identities": list(choices.edges),
        },
        "origin": {"id": choices.origin_id, "access_log": "/var/log/geoedge/origin-access.log"},
        "tunnel": dict(LONG_LINK_TUNNEL),
        "pools": [pool],
        **_acme(choices),
    }


def _acme(choices: OriginChoices) -> dict[str, Any]:
    """``[acme]`` for ``--acme-domain``: one certificate ("app") for those names."""
    if not choices.acme_domains:
        return {}
    if not choices.acme_agree_terms:
        raise InitError(
            "--acme-domain needs --acme-agree-terms: you agree to the CA's terms of service"
            " (Let's Encrypt's: https://letsencrypt.org/repository/)"
        )
    acme: dict[str, Any] = {
        "staging": not choices.acme_production,
        "contact": [c if c.startswith("mailto:") else f"mailto:{c}" for c in choices.acme_contact],
        "agree_to_terms": True,
        "certificates": [{"id": "app", "domains": list(choices.acme_domains)}],
    }
    if any(name.startswith("*.") for name in choices.acme_domains):
        acme["dns"] = {"provider": "route53"}
    return {"acme": acme}


def origin_files(choices: OriginChoices) -> list[HostFile]:
    etc = choices.etc_dir
    header = _header(
        f"origin.toml of origin {choices.origin_id}",
        "origin",
        etc,
        [
            f"{etc}/pki/ca.pem, origin.pem, origin-key.pem: its tunnel certificate "
            f"(geoedge pki peer --role origin --id {choices.origin_id} --dns <its name> "
            "--out origin)",
            *(
                [
                    "[acme]: edges with [acme] enabled (geoedge init edge --acme) on ports 80 "
                    "and 443 of the names; for a wildcard, Route 53 rights for this host's "
                    "role (docs/acme.md)"
                ]
                if choices.acme_domains
                else []
            ),
        ],
    )
    config = _render("origin", origin_config_mapping(choices), header)
    user_data = _user_data("origin", config, etc, choices.wheel_url)
    user_data = user_data.replace(EXAMPLE_ORIGIN_ID, choices.origin_id)
    return [
        _config_file("origin", config, etc),
        _shipped_unit("geoedge-origin.service", etc),
        _socket_unit("geoedge-origin.socket", "0.0.0.0:7443", choices.tunnel_address),
        _shipped_unit("geoedge-node@.service", etc),
        _sysctl_file(),
        HostFile("cloud-init.yaml", user_data, 0o600, None),
    ]


# ---------------------------------------------------------------------------- metrics


@dataclass(frozen=True, slots=True)
class MetricsChoices:
    """Where one host's Prometheus agent sends what it scrapes."""

    role: Role
    instance: str
    """The ``instance`` label of every series: ``<edge or origin id>-<EC2 instance id>``."""
    region: str
    workspace: str
    """The Amazon Managed Service for Prometheus workspace id (``ws-...``)."""
    workspace_region: str
    admin: str | None = None
    """The daemon's admin address; default: the schema's."""


def metrics_files(choices: MetricsChoices) -> list[HostFile]:
    """``prometheus-agent.yml`` for this host and the ``/etc/default/prometheus``
    that runs Debian's prometheus package as that agent."""
    admin = choices.admin or _admin_default(choices.role)
    url = (
        f"https://aps-workspaces.{choices.workspace_region}.amazonaws.com/workspaces/"
        f"{choices.workspace}/api/v1/remote_write"
    )
    text = assets.deploy_file("monitoring/prometheus-agent.yml").read_text()
    _, _, body = text.partition("\nglobal:")
    body = "global:" + body
    for placeholder, value in (
        ("GEOEDGE_ADMIN", admin),
        ("GEOEDGE_INSTANCE", choices.instance),
        ("GEOEDGE_REMOTE_WRITE", url),
        ("GEOEDGE_WORKSPACE_REGION", choices.workspace_region),
        ("GEOEDGE_REGION", choices.region),
    ):
        body = body.replace(placeholder, value)
    config = f"# Written by `geoedge init metrics` (geoedge {package_version()}).\n" + body
    arguments = (
        "# Written by `geoedge init metrics`: Debian's prometheus as a scraping agent.\n"
        'ARGS="--enable-feature=agent --config.file=/etc/prometheus/geoedge-agent.yml '
        '--storage.agent.path=/var/lib/prometheus/agent"\n'
    )
    return [
        HostFile("prometheus-agent.yml", config, 0o644, "/etc/prometheus/geoedge-agent.yml"),
        HostFile("prometheus.default", arguments, 0o644, "/etc/default/prometheus"),
    ]


def _admin_default(role: Role) -> str:
    admin = schema_fields(load_schema(role))["admin"].default
    return str(admin.address)


# ------------------------------------------------------------------------------- node


def node_files() -> list[HostFile]:
    """The unit template and the sample app (``node-app/``, without node_modules)."""
    files = [_shipped_unit("geoedge-node@.service", DEFAULT_ETC)]
    app = assets.node_app_dir()
    for name in assets.NODE_APP_FILES:
        files.append(
            HostFile(
                f"node-app/{name}",
                (app / name).read_text(),
                0o644,
                f"/opt/geoedge/node-app/{name}",
            )
        )
    return files


# ------------------------------------------------------------------------------ shared


def _header(title: str, role: Role, etc: Path, needs: Sequence[str]) -> str:
    lines = [
        f"{title}, written by `geoedge init {role}` (geoedge {package_version()}).",
        "Every key is here with its value and what it means; unchanged keys hold",
        f"the defaults (`geoedge config --defaults {role}` prints them all).",
        f"Install as {etc}/{role}.toml (root:geoedge, mode 0640), then check it:",
        f"  geoedge-{role} --config {etc}/{role}.toml --check",
        "It reads these files (docs/deployment.md, sections 1-3):",
        *(f"  {need}" for need in needs),
    ]
    return "".join(f"# {line}\n" for line in lines) + "\n"


def _config_file(role: Role, config: str, etc: Path) -> HostFile:
    return HostFile(f"{role}.toml", config, 0o640, f"{etc}/{role}.toml", owner="root:geoedge")


def _retarget(text: str, etc: Path) -> str:
    """Shipped files name /etc/geoedge; carry another ``etc_dir`` into them."""
    return text if etc == DEFAULT_ETC else text.replace(f"{DEFAULT_ETC}/", f"{etc}/")


def _shipped_unit(name: str, etc: Path) -> HostFile:
    text = _retarget(assets.deploy_file(f"systemd/{name}").read_text(), etc)
    return HostFile(name, text, 0o644, f"/etc/systemd/system/{name}")


def _socket_unit(name: str, shipped: str, address: str) -> HostFile:
    """A shipped socket unit listening on ``address`` instead of ``shipped``: the
    daemon takes a passed socket only where its config listens."""
    text = assets.deploy_file(f"systemd/{name}").read_text()
    text = text.replace(f"ListenStream={shipped}", f"ListenStream={address}")
    return HostFile(name, text, 0o644, f"/etc/systemd/system/{name}")


def _sysctl_file() -> HostFile:
    text = assets.deploy_file("sysctl/99-geoedge.conf").read_text()
    return HostFile("99-geoedge.conf", text, 0o644, "/etc/sysctl.d/99-geoedge.conf")


#: The shipped files the user data carries copies of (host path -> file under
#: deploy/). ``geoedge init`` writes them without their comment lines: with
#: a config of every key and its documentation, the user data would not fit
#: the 16 KiB EC2 allows (gzipped). The config keeps its comments: it is the
#: file an operator edits; the commented units are in the wheel and deploy/.
TERSE_COPIES = {
    "/etc/sysctl.d/99-geoedge.conf": "sysctl/99-geoedge.conf",
    "/etc/systemd/system/geoedge-edge.service": "systemd/geoedge-edge.service",
    "/etc/systemd/system/geoedge-edge.socket": "systemd/geoedge-edge.socket",
    "/etc/systemd/system/geoedge-origin.service": "systemd/geoedge-origin.service",
    "/etc/systemd/system/geoedge-origin.socket": "systemd/geoedge-origin.socket",
    "/etc/systemd/system/geoedge-node@.service": "systemd/geoedge-node@.service",
}


def without_comments(text: str, source: str) -> str:
    """``text`` (a systemd unit or a sysctl file, where a line whose first
    non-blank character is ``#`` or ``;`` is a comment) without its comment
    lines and repeated blank lines, under one line naming the commented file."""
    kept: list[str] = [f"# deploy/{source} of geoedge without its comments (the wheel has them)\n"]
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith(("#", ";")):
            continue
        if not line.strip() and (not kept[-1].strip() or len(kept) == 1):
            continue
        kept.append(line)
    while not kept[-1].strip():
        kept.pop()
    return "".join(kept)


def _user_data(role: Role, config: str, etc: Path, wheel_url: str | None) -> str:
    """The shipped cloud-init with this config in place of its example one, and
    its copies of shipped files without their comments (:data:`TERSE_COPIES`)."""
    text = assets.deploy_file(f"cloud-init/{role}.yaml").read_text()
    text = replace_block_content(text, f"{DEFAULT_ETC}/{role}.toml", config)
    for path, source in TERSE_COPIES.items():
        if f"  - path: {path}\n" in text:
            terse = without_comments(assets.deploy_file(source).read_text(), source)
            text = replace_block_content(text, path, terse)
    if wheel_url is not None:
        text = text.replace(EXAMPLE_WHEEL_URL, wheel_url)
    return _retarget(text, etc)


def replace_block_content(user_data: str, path: str, content: str) -> str:
    """Replace the ``content: |`` block of the ``write_files`` entry for ``path``.

    Text, not YAML, so the file keeps its comments; the entry must be laid out
    as in the shipped files (``  - path:`` then ``    content: |`` and the
    block indented by six spaces).
    """
    lines = user_data.splitlines(keepends=True)
    try:
        start = lines.index(f"  - path: {path}\n")
        header = next(i for i in range(start + 1, len(lines)) if lines[i] == "    content: |\n")
    except (ValueError, StopIteration):
        raise InitError(f"the shipped cloud-init has no write_files entry for {path}") from None
    end = header + 1
    while end < len(lines) and (lines[end].startswith("      ") or not lines[end].strip()):
        end += 1
    while end > header + 1 and not lines[end - 1].strip():
        end -= 1  # blank lines before the next entry are not part of the block
    block = [f"      {line}" if line.strip() else "\n" for line in content.splitlines(True)]
    if block and not block[-1].endswith("\n"):
        block[-1] += "\n"
    return "".join(lines[: header + 1] + block + lines[end:])


def write_host_files(files: Sequence[HostFile], out: Path, *, force: bool = False) -> list[Path]:
    """Write ``files`` under ``out``; refuse to overwrite unless ``force``."""
    targets = [out / f.name for f in files]
    existing = [str(path) for path in targets if path.exists()]
    if existing and not force:
        raise InitError(f"would overwrite {', '.join(existing)} (use --force)")
    for f, path in zip(files, targets, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomically(path, f.content.encode(), mode=f.mode)
    return targets


def install_steps(role: str, files: Sequence[HostFile], out: Path) -> list[str]:
    """Shell commands that put ``files`` (written under ``out``) in place, in order."""
    steps = []
    if role != "node":
        steps.append("useradd --system --shell /usr/sbin/nologin --no-create-home geoedge  # once")
    for f in files:
        if f.destination is None or f.name.startswith("node-app/"):
            continue
        owner, group = f.owner.split(":")
        src = os.path.join(out, f.name)
        steps.append(f"install -D -o {owner} -g {group} -m {f.mode:04o} {src} {f.destination}")
        if f.name.endswith(".toml"):
            steps.append(f"# and the certificates {f.name} names (its first lines say which)")
    if role == "node":
        steps += [
            f"install -d /opt/geoedge && cp -rT {out}/node-app /opt/geoedge/node-app",
            "cd /opt/geoedge/node-app && npm ci --omit=dev",
            "systemctl daemon-reload && systemctl enable --now "
            + " ".join(f"geoedge-node@{port}" for port in NODE_PORTS),
        ]
        return steps
    steps.append("sysctl --system")
    if role == "origin":
        steps.append("# the sample Node.js backends: geoedge init node --out DIR, then its steps")
    config = next(f.destination for f in files if f.name == f"{role}.toml")
    steps.append(f"geoedge-{role} --config {config} --check")
    steps.append(
        "systemctl daemon-reload && systemctl enable --now "
        f"geoedge-{role}.socket geoedge-{role}.service"
    )
    return steps
