"""The deployment materials in ``deploy/``: each file parses, and agrees with the code
and with the other files.

What could silently rot here is agreement: a key renamed in a schema but not in
the example config, a copy of the unit in the cloud-init user data that no
longer matches the unit, a sysctl bound below what the daemon asks for, a
README command with a flag the CLI does not have. Each test pins one such
agreement. Certificates do not exist at ``/etc/geoedge`` in a test: the config
loader only stores paths (the TLS store opens them later), so the example loads
as is, and a second test issues real certificates with ``geoedge pki`` under a
temporary directory to check that the names line up and the files load.
"""

from __future__ import annotations

import dataclasses
import gzip
import inspect
import ipaddress
import json
import re
import shutil
import subprocess
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest

from edge.config import EdgeConfig
from edge.tls import CertificateStore
from geoedge import cli, pki, release
from geoedge.config import config_from_mapping, load_config
from geoedge.listening import bind_listener
from origin.config import AdminConfig as OriginAdminConfig
from origin.config import OriginConfig
from tunnel.aio.connection import NOTSENT_LOWAT_BYTES
from tunnel.aio.transport import (
    TunnelDialConfig,
    TunnelListenerConfig,
    dial_ssl_context,
    parse_host_port,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EDGE_EXAMPLE = DEPLOY / "config" / "edge.example.toml"
CACHE_EXAMPLE = DEPLOY / "config" / "cache.example.toml"
EDGE_UNIT = DEPLOY / "systemd" / "geoedge-edge.service"
ORIGIN_UNIT = DEPLOY / "systemd" / "geoedge-origin.service"
NODE_UNIT = DEPLOY / "systemd" / "geoedge-node@.service"
UNITS = (EDGE_UNIT, ORIGIN_UNIT, NODE_UNIT)
SYSCTL = DEPLOY / "sysctl" / "99-geoedge.conf"
CLOUD_INIT = {
    "edge": DEPLOY / "cloud-init" / "edge.yaml",
    "origin": DEPLOY / "cloud-init" / "origin.yaml",
}
RECORDS = DEPLOY / "dns" / "route53-latency-records.json"
HEALTHCHECKS = DEPLOY / "dns" / "route53-healthchecks.json"
README = DEPLOY.parent / "docs" / "deployment.md"
#: EC2's limit on user data, before base64 (the files are sent gzipped).
USER_DATA_LIMIT_BYTES = 16 * 1024


def edge_example() -> EdgeConfig:
    return load_config(EDGE_EXAMPLE, EdgeConfig)


# ------------------------------------------------------------------ edge.example.toml


def test_edge_example_loads_as_described() -> None:
    config = edge_example()
    assert config.edge.id == "tokyo-1"
    [listener] = config.listeners
    assert listener.proxy_protocol == "v2"
    assert listener.trusted_proxies == (ipaddress.ip_network("10.20.0.0/16"),)
    assert config.redirect is not None
    assert "/.well-known/acme-challenge/" in config.redirect.pass_through_prefixes
    ecdsa, rsa = config.tls.certificates
    assert "ecdsa" in ecdsa.key.name and "rsa" in rsa.key.name
    assert ecdsa.names == rsa.names
    assert [o.name for o in config.origins] == ["dublin", "london"]
    assert config.origins[0].weight > config.origins[1].weight
    assert all(o.tunnel.transport == "tls" for o in config.origins)
    assert ipaddress.ip_address(parse_host_port(config.admin.address)[0]).is_loopback
    # Every file the edge reads lives under /etc/geoedge.
    paths = [p for c in config.tls.certificates for p in (c.cert, c.key)]
    paths += [p for o in config.origins for p in (o.tunnel.cert, o.tunnel.key, o.tunnel.ca)]
    assert all(p is not None and p.is_relative_to("/etc/geoedge") for p in paths)


def _schema_keys(
    schema: type, table: dict[str, Any], where: str, commented: frozenset[str] = frozenset()
) -> list[str]:
    """Fields of ``schema`` (recursively) that ``table`` does not write out. A
    field whose default is None (TOML cannot write it) may be shown as a
    comment, ``# name = ...``, instead: those names are in ``commented``."""
    hints = typing.get_type_hints(schema)
    missing = []
    for f in dataclasses.fields(schema):
        if f.name not in table:
            if not (f.default is None and f.name in commented):
                missing.append(f"{where}{f.name}")
            continue
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        value = table[f.name]
        if dataclasses.is_dataclass(inner[0]) and isinstance(value, dict):
            missing += _schema_keys(inner[0], value, f"{where}{f.name}.", commented)
        elif typing.get_origin(tp) is tuple and value and isinstance(value[0], dict):
            item = typing.get_args(tp)[0]
            for i, element in enumerate(value):
                missing += _schema_keys(item, element, f"{where}{f.name}[{i}].", commented)
    return missing


def test_edge_example_writes_out_every_key() -> None:
    """DESIGN principle 10: every default is written in the example config too
    (the cache's and the compressor's in cache.example.toml, appended to it)."""
    text = EDGE_EXAMPLE.read_text() + "\n" + CACHE_EXAMPLE.read_text()
    commented = frozenset(re.findall(r"^# ([a-z_]+) = ", text, re.MULTILINE))
    assert _schema_keys(EdgeConfig, tomllib.loads(text), "", commented) == []


def test_cache_example_appended_to_the_edge_example_loads_with_the_cache_on(
    tmp_path: Path,
) -> None:
    """Issue 30's checks append cache.example.toml as it stands to a working config."""
    both = tmp_path / "edge.toml"
    both.write_text(EDGE_EXAMPLE.read_text() + "\n" + CACHE_EXAMPLE.read_text())
    config = load_config(both, EdgeConfig)
    assert config.cache.enabled and config.compression.enabled
    # Every other value is the default, written out (one place for defaults).
    defaults = {"enabled": True}
    assert dataclasses.replace(config.cache, **defaults) == dataclasses.replace(
        type(config.cache)(), **defaults
    )
    assert dataclasses.replace(config.compression, **defaults) == dataclasses.replace(
        type(config.compression)(), **defaults
    )


def test_every_key_of_the_cache_example_is_commented() -> None:
    lines = CACHE_EXAMPLE.read_text().splitlines()
    for index, line in enumerate(lines):
        if re.match(r"^[a-z_]+ = ", line):
            above = lines[index - 1]
            assert above.startswith("#"), f"{line!r} has no comment above it"


def test_edge_example_loads_with_certificates_from_geoedge_pki(tmp_path: Path) -> None:
    """The file names the example expects are the ones ``geoedge pki`` writes, and
    the TLS store and the tunnel dialer load them."""
    root = tmp_path / "etc" / "geoedge"
    ca = tmp_path / "ca"
    pki.create_ca(ca)
    pki.issue_peer_cert(ca, root / "pki", "edge-tokyo-1", "tokyo-1", role="edge")
    shutil.copy(ca / pki.CA_CERT_FILE, root / "pki" / "ca.pem")
    names = ["app.example.com", "www.example.com"]
    pki.issue_server_cert(ca, root / "tls", "app-ecdsa", names)
    pki.issue_server_cert(ca, root / "tls", "app-rsa", names, key_type="rsa")
    moved = tmp_path / "edge.toml"
    moved.write_text(EDGE_EXAMPLE.read_text().replace("/etc/geoedge/", f"{root}/"))

    config = load_config(moved, EdgeConfig)
    store = CertificateStore(config.tls)
    assert store.context_for("app.example.com") is store.context
    for origin in config.origins:
        assert dial_ssl_context(origin.tunnel) is not None


# ------------------------------------------------------------------------- systemd


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as ``{section: {key: [values...]}}`` (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        if line.startswith("[") and line.rstrip().endswith("]"):
            current = sections.setdefault(line.strip()[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"line {number}: not key=value: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit_service(unit: Path) -> dict[str, list[str]]:
    return parse_unit(unit.read_text())["Service"]


def one(service: dict[str, list[str]], key: str) -> str:
    [value] = service[key]
    return value


def test_edge_unit_runs_the_daemon_as_described() -> None:
    service = unit_service(EDGE_UNIT)
    assert one(service, "ExecStart") == (
        "/usr/local/bin/geoedge-edge --config /etc/geoedge/edge.toml"
    )
    assert one(service, "AmbientCapabilities") == "CAP_NET_BIND_SERVICE"
    assert one(service, "ReadWritePaths") == "/var/log/geoedge"
    # The drain must finish (plus closing the tunnels) before systemd SIGKILLs.
    assert float(one(service, "TimeoutStopSec")) >= edge_example().edge.drain_timeout_s + 5
    # The access log is written where the unit allows writing.
    access_log = Path(edge_example().edge.access_log)
    assert access_log.is_relative_to(one(service, "ReadWritePaths"))


def test_origin_and_node_units_run_what_the_origin_config_names() -> None:
    service = unit_service(ORIGIN_UNIT)
    assert one(service, "ExecStart") == (
        "/usr/local/bin/geoedge-origin --config /etc/geoedge/origin.toml"
    )
    assert one(service, "CapabilityBoundingSet") == ""
    node = unit_service(NODE_UNIT)
    assert one(node, "ExecStart") == "/usr/bin/node server.js %i"
    assert one(node, "WorkingDirectory") == "/opt/geoedge/node-app"
    assert one(node, "DynamicUser") == "yes"
    assert "geoedge-origin.service" in parse_unit(NODE_UNIT.read_text())["Unit"]["Before"]


#: What every unit sets the same way: how it starts, stops, restarts, is hardened.
SHARED_SERVICE_SETTINGS = {
    "KillMode": "mixed",
    "KillSignal": "SIGTERM",
    "TimeoutStopSec": "45",
    "Restart": "on-failure",
    "RestartSec": "2",
    "RestartPreventExitStatus": "2",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "PrivateMounts": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "ProtectProc": "invisible",
    "LockPersonality": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "RestrictNamespaces": "yes",
    "RemoveIPC": "yes",
    "SystemCallArchitectures": "native",
    "SystemCallErrorNumber": "EPERM",
    "UMask": "0077",
}


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_units_share_one_layout(unit: Path) -> None:
    sections = parse_unit(unit.read_text())
    service = sections["Service"]
    for key, value in SHARED_SERVICE_SETTINGS.items():
        assert service.get(key) == [value], f"{unit.name}: {key}"
    assert service["SystemCallFilter"][0] == "@system-service"
    assert "~@privileged" in service["SystemCallFilter"][1].split()
    # A Documentation= link must lead somewhere; there is no stable one to give.
    assert "Documentation" not in sections["Unit"], unit.name
    assert sections["Unit"]["StartLimitIntervalSec"] == ["120"]
    assert sections["Unit"]["StartLimitBurst"] == ["10"]
    assert sections["Install"] == {"WantedBy": ["multi-user.target"]}
    # Daemons run the pip-installed console script, linked into /usr/local/bin.
    binary = one(service, "ExecStart").split()[0]
    assert binary in {
        "/usr/local/bin/geoedge-edge",
        "/usr/local/bin/geoedge-origin",
        "/usr/bin/node",
    }
    if binary.startswith("/usr/local/bin/"):
        # The daemons speak sd_notify (tests/integration/test_systemd.py) and take
        # their listening sockets from a .socket unit of the same name.
        assert one(service, "Type") == "notify" and one(service, "NotifyAccess") == "main"
        assert one(service, "WatchdogSec") == "30"
        assert one(service, "Sockets") == unit.name.replace(".service", ".socket")
        binary_config = one(service, "ExecStart")
        assert one(service, "ExecReload") == f"{binary_config} --reload $MAINPID"
        assert one(service, "User") == one(service, "Group") == "geoedge"
        assert one(service, "LimitNOFILE") == "1048576"
        assert "ExecStartPre" not in service, "the daemon checks its config itself (exit 2)"
    else:
        assert one(service, "Type") == "exec"  # Node does not speak sd_notify


SOCKETS = (DEPLOY / "systemd" / "geoedge-edge.socket", DEPLOY / "systemd" / "geoedge-origin.socket")


@pytest.mark.parametrize("socket_unit", SOCKETS, ids=lambda u: u.name)
def test_socket_units_pass_verify_and_listen_where_the_examples_do(
    socket_unit: Path, tmp_path: Path
) -> None:
    sections = parse_unit(socket_unit.read_text())
    listen = sections["Socket"]["ListenStream"]
    service = socket_unit.name.replace(".socket", ".service")
    assert sections["Socket"]["Service"] == [service]
    assert all(address.startswith("0.0.0.0:") for address in listen), "IPv4 as configured"
    if socket_unit.name == "geoedge-edge.socket":
        assert listen == ["0.0.0.0:443", "0.0.0.0:80"]
    else:
        assert listen == ["0.0.0.0:7443"]
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package: systemd)")
    copy = _verify_copy(DEPLOY / "systemd" / service, tmp_path)
    (tmp_path / socket_unit.name).write_text(socket_unit.read_text())
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(tmp_path / socket_unit.name), str(copy)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def _verify_copy(unit: Path, directory: Path) -> Path:
    """``unit`` in ``directory``, its programs replaced by a stand-in (verify checks
    that ExecStart exists), a template as one instance (verify skips templates)."""
    stand_in = directory / "stand-in"
    stand_in.write_text("#!/bin/sh\n")
    stand_in.chmod(0o755)
    text = re.sub(r"/usr/local/bin/geoedge-\w+|/usr/bin/node", str(stand_in), unit.read_text())
    copy = directory / unit.name.replace("@.", "@3001.")
    copy.write_text(text)
    return copy


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_unit_passes_systemd_analyze_verify(unit: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package: systemd)")
    copy = _verify_copy(unit, tmp_path)
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=30
    )
    # Unknown keys are only warnings (exit 0): any output at all is a failure.
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


#: The exposure ``systemd-analyze security`` gives each unit (docs/deployment.md
#: records them); a change that loosens a unit must say so here.
SECURITY_EXPOSURE = {EDGE_UNIT.name: 1.5, ORIGIN_UNIT.name: 1.1, NODE_UNIT.name: 1.2}


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_unit_security_exposure_is_as_recorded(unit: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package: systemd)")
    copy = _verify_copy(unit, tmp_path)
    result = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", copy.name],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze has no --offline (systemd < 252)")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d)", result.stdout)
    assert match, result.stdout[-500:] + result.stderr
    assert float(match.group(1)) <= SECURITY_EXPOSURE[unit.name], match.group(0)
    row = f"| `{unit.name}` | "
    [line] = [line for line in README.read_text().splitlines() if line.startswith(row)]
    assert line.endswith(f"| {SECURITY_EXPOSURE[unit.name]} OK |"), line


# -------------------------------------------------------------------------- sysctl


def parse_sysctl(text: str) -> dict[str, str]:
    """``key = value`` lines. Each setting follows a comment saying why, or another
    setting of the same explained group (``rmem_max`` then ``wmem_max``)."""
    settings: dict[str, str] = {}
    previous = "blank"
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            previous = "blank"
            continue
        if stripped.startswith("#"):
            previous = "comment"
            continue
        match = re.fullmatch(r"([a-z0-9_]+(?:\.[a-z0-9_-]+)+) = (\S(?:.*\S)?)", line)
        assert match, f"line {number}: not 'key = value': {line!r}"
        key, value = match.groups()
        assert key not in settings, f"line {number}: {key} is set twice"
        assert previous != "blank", f"line {number}: {key} has no comment saying why"
        settings[key] = value
        previous = "setting"
    return settings


REQUIRED_SYSCTLS = {
    "net.ipv4.tcp_slow_start_after_idle": "0",
    "net.ipv4.tcp_notsent_lowat": str(NOTSENT_LOWAT_BYTES),
    "net.core.default_qdisc": "fq",
    "net.ipv4.tcp_congestion_control": "bbr",
}
#: Not visible in a network namespace other than the first: tolerated as absent.
INIT_NETNS_ONLY = {"net.core.default_qdisc"}


def test_sysctl_lines_parse_and_carry_the_required_settings() -> None:
    settings = parse_sysctl(SYSCTL.read_text())
    for key, value in REQUIRED_SYSCTLS.items():
        assert settings.get(key) == value, key
    for key in (
        "net.core.rmem_max",
        "net.core.wmem_max",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
        "net.core.somaxconn",
        "net.ipv4.tcp_max_syn_backlog",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_fin_timeout",
        "fs.file-max",
    ):
        assert key in settings, key


def test_sysctl_keys_exist_in_this_kernel() -> None:
    proc = Path("/proc/sys")
    if not (proc / "net" / "ipv4").is_dir():
        pytest.skip("no /proc/sys/net/ipv4 here")
    for key in parse_sysctl(SYSCTL.read_text()):
        path = proc.joinpath(*key.split("."))
        assert path.exists() or key in INIT_NETNS_ONLY, f"{key}: no {path}"


def test_sysctl_bounds_fit_what_the_daemons_ask_for() -> None:
    settings = parse_sysctl(SYSCTL.read_text())
    config = edge_example()
    for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
        low, default, high = map(int, settings[key].split())
        assert low <= default <= high, key
        # A stream's window must fit in flight on one TCP connection.
        assert high >= config.tunnel.max_stream_window_bytes, key
    backlog = inspect.signature(bind_listener).parameters["backlog"].default
    assert int(settings["net.core.somaxconn"]) >= backlog
    # Ephemeral ports must never collide with a port a geoedge service listens on.
    first, last = map(int, settings["net.ipv4.ip_local_port_range"].split())
    assert first < last <= 65535
    listening = [parse_host_port(x.address)[1] for x in config.listeners]
    listening += [parse_host_port(config.admin.address)[1]]
    listening += [parse_host_port(o.tunnel.address)[1] for o in config.origins]
    listening += [parse_host_port(OriginAdminConfig().address)[1]]
    assert all(port < first for port in listening), listening
    assert int(settings["fs.file-max"]) >= 2 * int(
        parse_unit(EDGE_UNIT.read_text())["Service"]["LimitNOFILE"][0]
    )


# ---------------------------------------------------------------------- cloud-init


def load_user_data(role: str) -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    text = CLOUD_INIT[role].read_text()
    assert text.startswith("#cloud-config\n"), "cloud-init needs this first line"
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def written(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    files = {entry["path"]: entry for entry in data["write_files"]}
    assert len(files) == len(data["write_files"]), "a path is written twice"
    return files


def runcmd_lines(data: dict[str, Any]) -> list[str]:
    return [" ".join(c) if isinstance(c, list) else c for c in data["runcmd"]]


@pytest.mark.parametrize("role", ["edge", "origin"])
def test_user_data_parses_and_creates_the_user_before_using_it(role: str) -> None:
    data = load_user_data(role)
    assert set(data) <= {"package_update", "packages", "users", "write_files", "runcmd"}
    assert "python3-venv" in data["packages"]
    default, user = data["users"]
    assert default == "default", "without it the AMI's login user is not created"
    assert user["name"] == "geoedge" and user["system"] is True
    for path, entry in written(data).items():
        assert isinstance(entry["content"], str) and entry["content"].endswith("\n"), path
        assert re.fullmatch(r"0[0-7]{3}", entry["permissions"]), path
        # write_files runs before users-groups: a file owned by the new user or
        # group must wait for the final stage.
        if "geoedge" in entry.get("owner", ""):
            assert entry.get("defer") is True, f"{path}: owned by geoedge but not deferred"
        if path.endswith("-key.pem"):
            assert entry["permissions"] == "0640", path
    assert len(gzip.compress(CLOUD_INIT[role].read_bytes(), 9)) < USER_DATA_LIMIT_BYTES


@pytest.mark.parametrize(
    ("role", "unit"),
    [("edge", EDGE_UNIT), ("origin", ORIGIN_UNIT), ("origin", NODE_UNIT)],
)
def test_user_data_carries_exact_copies(role: str, unit: Path) -> None:
    files = written(load_user_data(role))
    assert files["/etc/sysctl.d/99-geoedge.conf"]["content"] == SYSCTL.read_text()
    copy = files[f"/etc/systemd/system/{unit.name}"]["content"]
    assert copy == unit.read_text(), f"copy {unit} into {CLOUD_INIT[role]}"
    if unit == NODE_UNIT:
        return
    socket_unit = unit.with_suffix(".socket")
    copy = files[f"/etc/systemd/system/{socket_unit.name}"]["content"]
    assert copy == socket_unit.read_text(), f"copy {socket_unit} into {CLOUD_INIT[role]}"
    assert f"systemctl enable --now {socket_unit.name} {unit.name}" in runcmd_lines(
        load_user_data(role)
    )


@pytest.mark.parametrize(
    ("role", "schema", "unit"),
    [("edge", EdgeConfig, EDGE_UNIT), ("origin", OriginConfig, ORIGIN_UNIT)],
)
def test_user_data_config_loads_and_its_files_are_written(
    role: str, schema: type, unit: Path
) -> None:
    data = load_user_data(role)
    files = written(data)
    path = f"/etc/geoedge/{role}.toml"
    config = config_from_mapping(tomllib.loads(files[path]["content"]), schema, source=path)
    needed = [v for v in _paths_in(config) if v.suffix == ".pem"]
    assert needed and all(str(p) in files for p in needed), needed
    commands = runcmd_lines(data)
    # The release is a variable set in one place, a wheel URL.
    [env] = [line for line in files["/etc/geoedge/install.env"]["content"].splitlines()]
    name, _, url = env.partition("=")
    assert name == "GEOEDGE_WHEEL_URL" and re.fullmatch(r"https://\S+\.whl", url), env
    # The one install path: the wheel's release tool, its lock, the current link.
    [install] = [c for c in commands if "geoedge.release install" in c]
    assert install == install_step("edge"), "the same install step on every host"
    check = subprocess.run(["bash", "-n"], input=install, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert "amazon-ssm-agent" in install.split("geoedge.release")[0]  # shell access first
    enable_daemon = f"systemctl enable --now geoedge-{role}.socket geoedge-{role}.service"
    assert enable_daemon in commands
    assert commands.index(install) < commands.index(enable_daemon)
    assert "pip install" not in CLOUD_INIT[role].read_text(), "installs go through geoedge.release"

    # The unit runs the command the release tool links through /opt/geoedge/current.
    unit_text = files[f"/etc/systemd/system/geoedge-{role}.service"]["content"]
    [exec_start] = parse_unit(unit_text)["Service"]["ExecStart"]
    binary, *args = exec_start.split()
    assert args == ["--config", path]
    assert Path(binary) == release.DEFAULT_BIN_DIR / f"geoedge-{role}"
    assert f"geoedge-{role}" in release.COMMANDS and "--bin-dir /usr/local/bin" in install


def install_step(role: str) -> str:
    [install] = [c for c in runcmd_lines(load_user_data(role)) if "geoedge.release" in c]
    return install


def test_origin_user_data_runs_the_sample_app_as_its_backends() -> None:
    data = load_user_data("origin")
    assert {"nodejs", "npm"} <= set(data["packages"])
    files = written(data)
    config = config_from_mapping(
        tomllib.loads(files["/etc/geoedge/origin.toml"]["content"]), OriginConfig
    )
    backends = [b.address for pool in config.pools for b in pool.backends]
    ports = sorted(int(parse_host_port(b)[1]) for b in backends)
    commands = runcmd_lines(data)
    enable = next(c for c in commands if "geoedge-node@" in c and "enable" in c)
    assert sorted(int(x) for x in re.findall(r"geoedge-node@(\d+)\.service", enable)) == ports
    # The app comes out of the installed wheel, its modules from its lock file.
    init = commands.index("/usr/local/bin/geoedge init node --out /run/geoedge-node")
    npm = next(i for i, c in enumerate(commands) if "npm ci --omit=dev" in c)
    assert (
        init
        < npm
        < commands.index(enable)
        < commands.index("systemctl enable --now geoedge-origin.socket geoedge-origin.service")
    )
    assert "cd /opt/geoedge/node-app" in commands[npm]


def _paths_in(obj: Any) -> list[Path]:
    if isinstance(obj, Path):
        return [obj]
    if dataclasses.is_dataclass(obj):
        return [p for f in dataclasses.fields(obj) for p in _paths_in(getattr(obj, f.name))]
    if isinstance(obj, tuple):
        return [p for item in obj for p in _paths_in(item)]
    return []


@pytest.mark.parametrize("role", ["edge", "origin"])
def test_user_data_passes_cloud_init_schema(role: str) -> None:
    tool = shutil.which("cloud-init")
    if tool is None:
        pytest.skip("cloud-init is not installed")
    result = subprocess.run(
        [tool, "schema", "--config-file", str(CLOUD_INIT[role])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------- DNS

HEALTHCHECK_REF = "REPLACE-with-id-of:"


def test_latency_records_have_one_region_each_and_known_health_checks() -> None:
    batch = json.loads(RECORDS.read_text())
    checks = json.loads(HEALTHCHECKS.read_text())["HealthChecks"]
    records = [change["ResourceRecordSet"] for change in batch["Changes"]]
    assert {change["Action"] for change in batch["Changes"]} <= {"CREATE", "UPSERT"}
    assert len(records) >= 2
    assert len({(r["Name"], r["Type"]) for r in records}) == 1, "one name, one type"
    identifiers = [r["SetIdentifier"] for r in records]
    regions = [r["Region"] for r in records]
    assert len(set(identifiers)) == len(identifiers)
    assert len(set(regions)) == len(regions), "latency records need one region each"
    assert all(re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region) for region in regions)
    for record in records:
        if "AliasTarget" in record:
            assert record["AliasTarget"]["EvaluateTargetHealth"] is True
            assert "TTL" not in record and "ResourceRecords" not in record
        else:
            assert record["TTL"] <= 60 and record["ResourceRecords"], record["SetIdentifier"]
            assert "HealthCheckId" in record, "without a check a dead edge keeps its users"
        if "HealthCheckId" in record:
            name = record["HealthCheckId"].removeprefix(HEALTHCHECK_REF)
            assert name in checks, f"{record['SetIdentifier']}: no health check {name!r}"


def test_health_checks_are_create_requests() -> None:
    checks = json.loads(HEALTHCHECKS.read_text())["HealthChecks"]
    references = [c["CallerReference"] for c in checks.values()]
    assert len(set(references)) == len(references), "CallerReference must be unique"
    readiness = edge_example().http.readiness_path
    for name, request in checks.items():
        assert set(request) == {"CallerReference", "HealthCheckConfig"}, name
        check = request["HealthCheckConfig"]
        assert check["Type"] in {"HTTP", "HTTPS", "TCP"}, name
        assert "IPAddress" in check or "FullyQualifiedDomainName" in check, name
        assert check["RequestInterval"] in {10, 30} and 1 <= check["FailureThreshold"] <= 10
        if check["Type"] == "TCP":
            assert "ResourcePath" not in check, name
        else:  # the edge's own answer, on a traffic port: readiness, not a backend's
            assert check["ResourcePath"] == readiness, name
            assert check["Port"] in {80, 443}, name


# -------------------------------------------------------------------------- README


def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.DOTALL)


def readme_commands(program: str) -> list[list[str]]:
    commands = []
    for block in readme_blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            words = line.split("#", 1)[0].split()
            if words[:1] == [program]:
                commands.append(words[1:])
    return commands


def test_readme_pki_and_wireguard_commands_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's ``geoedge`` command lines, run in order, produce the files
    the example configs name."""
    monkeypatch.chdir(tmp_path)
    commands = readme_commands("geoedge")
    assert any(c[:2] == ["pki", "init"] for c in commands)
    assert any(c[:2] == ["wireguard", "mesh"] for c in commands)
    for argv in commands:
        # Run in tmp_path: a README command that writes elsewhere is not run here.
        assert not [a for a in argv if a.startswith("/")], f"absolute path in geoedge {argv}"
    for argv in commands:
        assert cli.main(argv) == 0, f"geoedge {' '.join(argv)}: {capsys.readouterr().err}"
    config = edge_example()
    issued = tmp_path / "issued" / config.edge.id
    assert (issued / config.origins[0].tunnel.cert.name).is_file()
    assert (issued / config.origins[0].tunnel.key.name).is_file()
    origin_cert = tmp_path / "issued" / "dublin-1" / "origin.pem"
    assert pki.peer_identity(pki.load_certificate(origin_cert)) == "dublin-1"
    assert (tmp_path / "wg" / "origin-wg0.conf").is_file()


def test_readme_wireguard_snippet_fits_the_schemas() -> None:
    [snippet] = [b for b in readme_blocks("toml") if "tunnel_listener" in b]
    data = tomllib.loads(snippet)
    listener = config_from_mapping(data["tunnel_listener"], TunnelListenerConfig)
    dial = config_from_mapping(data["origins"]["tunnel"], TunnelDialConfig)
    assert listener.transport == dial.transport == "tcp"
    assert parse_host_port(dial.address) == parse_host_port(listener.address)


def test_readme_names_files_that_exist() -> None:
    text = README.read_text()
    assert "loadtests/locustfile.py" in (DEPLOY.parent / "docs" / "operations.md").read_text()
    names = re.findall(
        r"`deploy/((?:config|systemd|sysctl|cloud-init|dns|aws|monitoring)/[\w.@-]+)`", text
    )
    assert len(names) > 10
    for name in names:
        if DEPLOY / name == ORIGIN_UNIT or name == "config/origin.example.toml":
            continue  # another engineer's files, checked by their tests
        assert (DEPLOY / name).exists(), name
