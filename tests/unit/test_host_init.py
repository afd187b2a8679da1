"""``geoedge init`` and ``geoedge config --defaults``: files for one host that the
daemons' own loader accepts, that agree with the shipped units and cloud-init,
and that say everything (every key of the schema, with its docstring)."""

from __future__ import annotations

import dataclasses
import gzip
import re
import shutil
import stat
import subprocess
import tomllib
import typing
from pathlib import Path

import pytest

from edge.config import EdgeConfig
from geoedge import cli, host_init
from geoedge.config import config_from_mapping, field_docs, load_config
from origin.config import OriginConfig
from tests.unit.test_deploy_files import (
    DEPLOY,
    USER_DATA_LIMIT_BYTES,
    _schema_keys,
    parse_unit,
)

yaml = pytest.importorskip("yaml")


def missing_keys(schema: type, text: str) -> list[str]:
    """Keys of ``schema`` the rendered ``text`` neither sets nor shows as unset."""
    missing = _schema_keys(schema, tomllib.loads(text), "")
    return [key for key in missing if f"# {key.rsplit('.', 1)[-1]} =  (not set)" not in text]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_init_edge_writes_a_complete_config_the_daemon_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(
        [
            "init", "edge", "--out", str(tmp_path), "--id", "tokyo-1",
            "--origin", "origin.example.com:7443", "--origin", "origin-london.example.com:7443",
            "--name", "app.example.com", "--name", "www.example.com",
            "--nlb-cidr", "10.20.0.0/16",
        ],
        capsys,
    )  # fmt: skip
    assert status == 0, err
    config = load_config(tmp_path / "edge.toml", EdgeConfig)
    assert config.edge.id == "tokyo-1"
    assert [o.tunnel.address for o in config.origins] == [
        "origin.example.com:7443",
        "origin-london.example.com:7443",
    ]
    assert [o.name for o in config.origins] == ["origin", "origin-london"]
    assert config.origins[0].weight > config.origins[1].weight
    assert config.origins[0].tunnel.cert == Path("/etc/geoedge/pki/edge-tokyo-1.pem")
    [listener] = config.listeners
    assert listener.proxy_protocol == "v2" and str(listener.trusted_proxies[0]) == "10.20.0.0/16"
    assert config.tls.certificates[0].names == ("app.example.com", "www.example.com")
    text = (tmp_path / "edge.toml").read_text()
    # Every key written out, each documented field with its docstring above it.
    assert missing_keys(EdgeConfig, text) == []
    for doc in field_docs(typing.get_type_hints(EdgeConfig)["edge"]).values():
        assert f"# {doc.splitlines()[0]}" in text
    assert stat.S_IMODE((tmp_path / "edge.toml").stat().st_mode) == 0o640
    # The unit and the sysctl file are the shipped ones.
    unit = DEPLOY / "systemd" / "geoedge-edge.service"
    assert (tmp_path / unit.name).read_text() == unit.read_text()
    sysctl = DEPLOY / "sysctl" / "99-geoedge.conf"
    assert (tmp_path / sysctl.name).read_text() == sysctl.read_text()
    # Where each goes is printed, in order, ending with the check and the start.
    assert (
        f"install -D -o root -g geoedge -m 0640 {tmp_path}/edge.toml /etc/geoedge/edge.toml" in out
    )
    steps = [line.strip() for line in out.splitlines()]
    assert steps.index("sysctl --system") < steps.index(
        "geoedge-edge --config /etc/geoedge/edge.toml --check"
    )


def _user_data(path: Path) -> dict:
    text = path.read_text()
    assert text.startswith("#cloud-config\n")
    assert len(gzip.compress(text.encode(), 9)) < USER_DATA_LIMIT_BYTES
    return yaml.safe_load(text)


def test_init_edge_cloud_init_carries_the_same_config_and_wheel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = "https://artifacts.example.net/geoedge-0.1.0-py3-none-any.whl"
    status, _, err = run(
        ["init", "edge", "--out", str(tmp_path), "--id", "osaka-2", "--wheel-url", wheel], capsys
    )
    assert status == 0, err
    data = _user_data(tmp_path / "cloud-init.yaml")
    files = {entry["path"]: entry for entry in data["write_files"]}
    assert files["/etc/geoedge/edge.toml"]["content"] == (tmp_path / "edge.toml").read_text()
    assert files["/etc/geoedge/install.env"]["content"] == f"GEOEDGE_WHEEL_URL={wheel}\n"
    # The certificate placeholders follow the id.
    assert "/etc/geoedge/pki/edge-osaka-2-key.pem" in files
    assert "tokyo-1" not in (tmp_path / "cloud-init.yaml").read_text()
    shipped = yaml.safe_load((DEPLOY / "cloud-init" / "edge.yaml").read_text())
    assert data["runcmd"] == [
        [part.replace("tokyo-1", "osaka-2") for part in c] if isinstance(c, list) else c
        for c in shipped["runcmd"]
    ]


def test_init_origin_admits_the_edges_and_balances_the_sample_backends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["init", "origin", "--out", str(tmp_path), "--id", "dublin-1"]
    status, _, err = run([*argv, "--edge", "tokyo-1", "--edge", "virginia-1"], capsys)
    assert status == 0, err
    config = load_config(tmp_path / "origin.toml", OriginConfig)
    assert config.origin.id == "dublin-1"
    assert config.tunnel_listener.allowed_identities == ("tokyo-1", "virginia-1")
    [pool] = config.pools
    assert pool.default and pool.health is not None
    ports = [int(b.address.rsplit(":", 1)[1]) for b in pool.backends]
    assert ports == list(host_init.NODE_PORTS)
    # systemd holds the tunnel listener where the config listens (socket activation).
    socket_unit = (tmp_path / "geoedge-origin.socket").read_text()
    assert f"ListenStream={config.tunnel_listener.address}\n" in socket_unit
    assert missing_keys(OriginConfig, (tmp_path / "origin.toml").read_text()) == []
    # The node template comes along, and the cloud-init starts one per port.
    template = DEPLOY / "systemd" / "geoedge-node@.service"
    assert (tmp_path / template.name).read_text() == template.read_text()
    data = _user_data(tmp_path / "cloud-init.yaml")
    enable = next(c for c in data["runcmd"] if "geoedge-node@3001.service" in c)
    assert [int(x) for x in re.findall(r"@(\d+)\.", " ".join(enable))] == ports
    files = {entry["path"]: entry for entry in data["write_files"]}
    assert files["/etc/geoedge/origin.toml"]["content"] == (tmp_path / "origin.toml").read_text()


def test_init_with_acme_writes_edges_that_take_certificates_from_the_origin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--acme`` (edge) and ``--acme-domain`` (origin): the configs the
    CloudFormation path renders when its ServerCertificates parameter is acme."""
    status, _, err = run(["init", "edge", "--out", str(tmp_path / "e"), "--acme"], capsys)
    assert status == 0, err
    edge = load_config(tmp_path / "e" / "edge.toml", EdgeConfig)
    assert edge.acme.enabled and edge.tls.certificates == ()
    # The store is the unit's StateDirectory, and the unit beside it says so.
    unit = (tmp_path / "e" / "geoedge-edge.service").read_text()
    assert str(edge.acme.store_dir) == "/var/lib/" + re.findall(r"StateDirectory=(.+)", unit)[0]

    argv = ["init", "origin", "--out", str(tmp_path / "o"), "--acme-domain", "app.example.com"]
    argv += ["--acme-domain", "*.app.example.com", "--acme-contact", "ops@example.com"]
    status, _, err = run(argv, capsys)
    assert status == 1 and "--acme-agree-terms" in err  # no account without the terms
    status, _, err = run([*argv, "--acme-agree-terms"], capsys)
    assert status == 0, err
    origin = load_config(tmp_path / "o" / "origin.toml", OriginConfig)
    assert origin.acme is not None
    assert origin.acme.staging and origin.acme.directory.startswith("https://acme-staging-v02.")
    assert origin.acme.contact == ("mailto:ops@example.com",)
    [certificate] = origin.acme.certificates
    assert certificate.domains == ("app.example.com", "*.app.example.com")
    assert origin.acme.dns is not None and origin.acme.dns.provider == "route53"  # the wildcard
    unit = (tmp_path / "o" / "geoedge-origin.service").read_text()
    state = "/var/lib/" + re.findall(r"StateDirectory=(.+)", unit)[0]
    assert str(origin.acme.state_dir) == state
    status, _, err = run([*argv, "--acme-agree-terms", "--acme-production", "--force"], capsys)
    assert status == 0, err
    production = load_config(tmp_path / "o" / "origin.toml", OriginConfig)
    assert production.acme is not None and not production.acme.staging


def test_init_node_writes_the_template_and_the_app_without_modules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(["init", "node", "--out", str(tmp_path)], capsys)
    assert status == 0, err
    app = sorted(p.name for p in (tmp_path / "node-app").iterdir())
    assert app == sorted(
        ["server.js", "proxy.js", "package.json", "package-lock.json", "README.md"]
    )
    for name in app:
        assert (tmp_path / "node-app" / name).read_bytes() == (
            DEPLOY / "node-app" / name
        ).read_bytes()
    service = parse_unit((tmp_path / "geoedge-node@.service").read_text())["Service"]
    assert service["WorkingDirectory"] == ["/opt/geoedge/node-app"]
    assert "cd /opt/geoedge/node-app && npm ci --omit=dev" in out


def test_init_with_another_etc_dir_keeps_the_files_consistent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    etc = tmp_path / "etc-geoedge"
    status, _, err = run(
        ["init", "edge", "--out", str(tmp_path / "out"), "--etc", str(etc)], capsys
    )
    assert status == 0, err
    out = tmp_path / "out"
    config = load_config(out / "edge.toml", EdgeConfig)
    assert config.origins[0].tunnel.ca == etc / "pki" / "ca.pem"
    [exec_start] = parse_unit((out / "geoedge-edge.service").read_text())["Service"]["ExecStart"]
    assert exec_start.endswith(f"--config {etc}/edge.toml")
    files = {e["path"]: e for e in _user_data(out / "cloud-init.yaml")["write_files"]}
    assert f"{etc}/edge.toml" in files and f"{etc}/pki/ca.pem" in files


def test_init_refuses_to_overwrite_and_bad_choices_say_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["init", "edge", "--out", str(tmp_path)], capsys)[0] == 0
    before = (tmp_path / "edge.toml").read_text()
    status, _, err = run(["init", "edge", "--out", str(tmp_path), "--id", "other"], capsys)
    assert status == 1
    assert f"would overwrite {tmp_path}/edge.toml" in err and "--force" in err
    assert (tmp_path / "edge.toml").read_text() == before
    assert run(["init", "edge", "--out", str(tmp_path), "--force", "--id", "x"], capsys)[0] == 0
    assert 'id = "x"' in (tmp_path / "edge.toml").read_text()

    status, _, err = run(["init", "edge", "--out", str(tmp_path / "b"), "--origin", "nope"], capsys)
    assert status == 1 and "--origin: 'nope': expected host:port" in err
    status, _, err = run(
        ["init", "edge", "--out", str(tmp_path / "c"), "--nlb-cidr", "10.0.0.1/8"], capsys
    )
    assert status == 1 and "trusted_proxies" in err and "Traceback" not in err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


@pytest.mark.parametrize(("role", "schema"), [("edge", EdgeConfig), ("origin", OriginConfig)])
def test_config_defaults_prints_every_key_of_the_schema(
    role: str, schema: type, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(["config", "--defaults", role], capsys)
    assert status == 0
    # Uncommenting nothing, it is valid TOML; its values are the schema's defaults.
    data = tomllib.loads(out)
    for f in dataclasses.fields(schema):
        name = f.name
        assert re.search(rf"^(# )?(\[+)?{name}\b", out, flags=re.MULTILINE), name
        if name in data and not isinstance(data[name], dict | list):
            assert data[name] == f.default
    assert f"Every key of {role}.toml" in out


def schema_key_paths(schema: type, path: str = "") -> set[str]:
    """Every key of ``schema`` as ``table.sub.key`` (arrays of tables without
    an index): the whole schema, walked."""
    from geoedge.config_render import _array_item_schema, _table_schema

    hints = typing.get_type_hints(schema)
    keys: set[str] = set()
    for f in dataclasses.fields(schema):
        tp = hints[f.name]
        nested = _table_schema(tp) or _array_item_schema(tp)
        if nested is not None:
            keys |= schema_key_paths(nested, f"{path}{f.name}.")
        else:
            keys.add(f"{path}{f.name}")
    return keys


_HEADER = re.compile(r"^(?:# )?\[\[?([A-Za-z0-9_.]+)\]\]?$")
_KEY = re.compile(r"^(?:# )?([a-z][a-z0-9_]*) = ")


def printed_key_paths(text: str) -> set[str]:
    """Every key ``config --defaults`` prints, set or commented, under its table."""
    keys: set[str] = set()
    table = ""
    for line in text.splitlines():
        if header := _HEADER.match(line):
            table = header.group(1) + "."
        elif key := _KEY.match(line):
            keys.add(table + key.group(1))
    return keys


def uncommented(text: str) -> str:
    """The defaults with their example tables and example values switched on
    (``# e.g. key = value`` in place of the default line before it)."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("# e.g. "):
            key = _KEY.match(line[len("# e.g. ") :])
            assert key is not None and out[-1].startswith(key.group(1) + " = "), line
            out[-1] = line[len("# e.g. ") :]
            continue
        if line.startswith("# ") and (_HEADER.match(line) or _KEY.match(line)):
            if "(not set)" in line or re.search(r"=\s+\(required", line):
                continue
            line = re.sub(r"  \((required: [^)]*|not set by default)\)$", "", line[2:])
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize(("role", "schema"), [("edge", EdgeConfig), ("origin", OriginConfig)])
def test_config_defaults_prints_every_table_and_key_the_schema_has(
    role: str, schema: type, capsys: pytest.CaptureFixture[str]
) -> None:
    """Arrays of tables ([[origins]], [[tls.certificates]], [[pools]] and their
    sub-tables) and optional tables ([redirect], [pools.dns]) included, as one
    commented example entry each; uncommented, the example is a valid config."""
    status, out, _ = run(["config", "--defaults", role], capsys)
    assert status == 0
    assert printed_key_paths(out) == schema_key_paths(schema)
    for table in {"edge": ["[[origins]]", "[[tls.certificates]]", "[origins.tunnel]",
                           "[redirect]"],
                  "origin": ["[[pools]]", "[[pools.backends]]", "[pools.health]",
                             "[pools.dns]", "[pools.passive]"]}[role]:  # fmt: skip
        assert f"\n# {table}\n" in out or f"\n{table}\n" in out, table
    example = config_from_mapping(tomllib.loads(uncommented(out)), schema, source=role)
    assert example is not None


def test_config_defaults_of_a_section_load_back_equal() -> None:
    """The rendered defaults are the loader's defaults: what ``config --defaults``
    shows for [http] is exactly what an empty [http] table gives."""
    from edge.config import HttpConfig

    text = host_init.defaults_toml("edge")
    section = "[http]\n" + text.split("\n[http]\n", 1)[1].split("\n[tunnel]\n", 1)[0]
    parsed = tomllib.loads(section)["http"]
    assert config_from_mapping(parsed, HttpConfig) == HttpConfig()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool: make test installs it")
@pytest.mark.parametrize(("role", "port"), [("edge", 7444), ("origin", 7445)])
def test_init_metrics_writes_an_agent_config_prometheus_accepts(
    role: str, port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(
        ["init", "metrics", "--out", str(tmp_path), "--role", role, "--instance", "x-i-0abc",
         "--region", "ap-northeast-1", "--workspace", "ws-0123", "--workspace-region",
         "eu-west-1"],
        capsys,
    )  # fmt: skip
    assert status == 0, err
    config = tmp_path / "prometheus-agent.yml"
    check = subprocess.run(
        ["promtool", "check", "config", "--agent", str(config)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    data = yaml.safe_load(config.read_text())
    [geoedge] = [job for job in data["scrape_configs"] if job["job_name"] == "geoedge"]
    # It scrapes the address the daemon's admin listens on by default.
    assert geoedge["static_configs"][0]["targets"] == [f"127.0.0.1:{port}"]
    assert {r["replacement"] for r in geoedge["relabel_configs"]} == {"x-i-0abc"}
    [write] = data["remote_write"]
    assert write["url"].startswith("https://aps-workspaces.eu-west-1.amazonaws.com/")
    assert "ws-0123" in write["url"] and write["sigv4"] == {"region": "eu-west-1"}
    assert "GEOEDGE_" not in config.read_text().split("global:", 1)[1]
    assert "--enable-feature=agent" in (tmp_path / "prometheus.default").read_text()


def test_the_configuration_reference_in_docs_is_generated_and_current(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/configuration.md is what ``geoedge config --reference`` prints
    (``make docs``), and it names every key of both schemas."""
    status, out, _ = run(["config", "--reference"], capsys)
    assert status == 0
    committed = (DEPLOY.parent / "docs" / "configuration.md").read_text()
    assert committed == out, "docs/configuration.md is stale: run make docs"
    for role, schema in (("edge", EdgeConfig), ("origin", OriginConfig)):
        section = out.split(f"## {role}.toml", 1)[1].split("\n## ", 1)[0]
        for key in schema_key_paths(schema):
            table, _, name = key.rpartition(".")
            assert re.search(
                rf"### `\[\[?{re.escape(table)}\]\]?`\n(.|\n)*?\| `{name}` \|", section
            ), key


def _settings(text: str) -> list[str]:
    """A unit's or sysctl file's lines that are not comments or blank."""
    return [
        line
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", ";"))
    ]


@pytest.mark.parametrize("role", ["edge", "origin"])
def test_init_user_data_fits_ec2_and_carries_every_setting_of_the_shipped_units(
    role: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the config of every key and its documentation, the copies of the
    units and the sysctl file go without their comments, setting for setting,
    and the whole stays under EC2's 16 KiB with room for the config to grow."""
    argv = ["init", role, "--out", str(tmp_path), "--id", f"{role}-1"]
    status, _, err = run([*argv, "--edge", "tokyo-1"] if role == "origin" else argv, capsys)
    assert status == 0, err
    text = (tmp_path / "cloud-init.yaml").read_text()
    assert len(gzip.compress(text.encode(), 9)) < USER_DATA_LIMIT_BYTES - 2048
    files = {
        entry["path"]: entry["content"]
        for entry in _user_data(tmp_path / "cloud-init.yaml")["write_files"]
    }
    copies = [path for path in host_init.TERSE_COPIES if path in files]
    assert len(copies) >= 3, copies
    for path in copies:
        shipped = (DEPLOY / host_init.TERSE_COPIES[path]).read_text()
        assert _settings(files[path]) == _settings(shipped), path
        assert files[path].startswith(f"# deploy/{host_init.TERSE_COPIES[path]} ")
    # The config keeps its documentation: it is the file an operator edits.
    assert files[f"/etc/geoedge/{role}.toml"] == (tmp_path / f"{role}.toml").read_text()
    assert files[f"/etc/geoedge/{role}.toml"].count("\n# ") > 50
