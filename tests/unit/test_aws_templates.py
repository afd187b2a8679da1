"""The CloudFormation templates in ``deploy/aws/``: clean under cfn-lint, and in
agreement with the rest: the NLB as section 8 of docs/deployment.md describes it,
user data that is valid cloud-config and valid shell, whose ``geoedge init``
renders a config naming exactly the certificate files it fetches, latency
records whose health checks probe their own NLB, and a walk-through whose
``aws cloudformation deploy`` commands give every required parameter and no
unknown one."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge.config import AdminConfig, EdgeConfig, HttpConfig
from geoedge import cli
from geoedge.config import load_config
from tests.unit.test_deploy_files import (
    DEPLOY,
    EDGE_UNIT,
    README,
    USER_DATA_LIMIT_BYTES,
    parse_unit,
)

yaml = pytest.importorskip("yaml")

EDGE_REGION = DEPLOY / "aws" / "edge-region.yaml"
LATENCY_DNS = DEPLOY / "aws" / "latency-dns.yaml"
TEMPLATES = (EDGE_REGION, LATENCY_DNS)


class _CfnLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short forms (``!Ref X`` -> ``{"Ref": "X"}``)."""


def _construct(loader: _CfnLoader, suffix: str, node: Any) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _construct)


def load(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=_CfnLoader)  # a SafeLoader subclass


def resources(path: Path, kind: str) -> dict[str, dict[str, Any]]:
    return {
        name: r["Properties"] for name, r in load(path)["Resources"].items() if r["Type"] == kind
    }


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_template_passes_cfn_lint(template: Path) -> None:
    lint = Path(sys.executable).with_name("cfn-lint")
    if not lint.exists() and shutil.which("cfn-lint") is None:
        pytest.skip("cfn-lint is not installed (pip install -e '.[test]')")
    command = str(lint) if lint.exists() else "cfn-lint"
    result = subprocess.run(
        [command, "--format", "parseable", str(template)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # Warnings and informational findings count too: any output is a failure.
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


# ------------------------------------------------------------------------ the NLB


def attributes(props: dict[str, Any]) -> dict[str, str]:
    return {a["Key"]: a["Value"] for a in props.get("TargetGroupAttributes", [])}


#: The edge's own readiness answer on its traffic ports, and its admin address.
READINESS_PATH = HttpConfig().readiness_path
ADMIN = AdminConfig().address


def test_nlb_sends_proxy_v2_on_443_only_and_checks_readiness_on_the_edge() -> None:
    """Readiness sends users: the target groups ask the edge itself (a usable
    tunnel), not a backend through it, on both traffic ports."""
    groups = resources(EDGE_REGION, "AWS::ElasticLoadBalancingV2::TargetGroup")
    by_port = {props["Port"]: props for props in groups.values()}
    https, http = by_port[443], by_port[80]
    assert attributes(https)["proxy_protocol_v2.enabled"] == "true"
    assert "proxy_protocol_v2.enabled" not in attributes(http)  # the redirect reads none
    for props in (https, http):
        assert attributes(props)["preserve_client_ip.enabled"] == "false"
        assert props["HealthCheckPort"] == "traffic-port"
        assert props["HealthCheckPath"] == READINESS_PATH
        assert props["Matcher"] == {"HttpCode": "200"}  # 503 (not ready) takes it out
        # The drain the NLB grants, then the edge's own: both fit the unit's stop timeout.
        delay = int(attributes(props)["deregistration_delay.timeout_seconds"])
        [stop] = parse_unit(EDGE_UNIT.read_text())["Service"]["TimeoutStopSec"]
        assert delay <= int(stop)
    assert https["HealthCheckProtocol"] == "HTTPS" and http["HealthCheckProtocol"] == "HTTP"
    listeners = resources(EDGE_REGION, "AWS::ElasticLoadBalancingV2::Listener")
    names = {props["Port"]: name for name, props in groups.items()}
    for props in listeners.values():
        [action] = props["DefaultActions"]
        assert action["TargetGroupArn"] == {"Ref": names[props["Port"]]}
    [group] = resources(EDGE_REGION, "AWS::AutoScaling::AutoScalingGroup").values()
    assert sorted(g["Ref"] for g in group["TargetGroupARNs"]) == sorted(names.values())


def test_only_liveness_replaces_a_host() -> None:
    """The group never replaces an edge for being not ready (ELB checks are
    readiness): EC2 status checks, and the host's own /livez reporter."""
    [group] = resources(EDGE_REGION, "AWS::AutoScaling::AutoScalingGroup").values()
    assert group["HealthCheckType"] == "EC2"
    tags = {t["Key"]: t for t in group["Tags"]}
    _, data = user_data()
    files = {f["path"]: f for f in data["write_files"]}
    reporter = files["/usr/local/sbin/geoedge-liveness"]["content"]
    assert f"http://{ADMIN}/livez" in reporter
    assert "/readyz" not in reporter and READINESS_PATH not in reporter
    assert "set-instance-health" in reporter and "--health-status Unhealthy" in reporter
    assert "--should-respect-grace-period" in reporter
    check = subprocess.run(["sh", "-n"], input=reporter, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    timer = parse_unit(files["/etc/systemd/system/geoedge-liveness.timer"]["content"])
    assert timer["Timer"]["OnUnitActiveSec"] == ["30s"]
    assert "systemctl enable --now geoedge-liveness.timer" in data["runcmd"][0]
    # The instance role may set the health of its own group's instances only.
    [role] = resources(EDGE_REGION, "AWS::IAM::Role").values()
    [policy] = role["Policies"]
    [statement] = [
        s
        for s in policy["PolicyDocument"]["Statement"]
        if isinstance(s, dict) and s.get("Action") == "autoscaling:SetInstanceHealth"
    ]
    [(condition_key, value)] = statement["Condition"]["StringEquals"].items()
    tag = condition_key.split("/", 1)[1]
    assert tag in tags and value == tags[tag]["Value"] == {"Ref": "EdgeId"}


def test_edges_accept_traffic_from_the_nlb_only() -> None:
    groups = resources(EDGE_REGION, "AWS::EC2::SecurityGroup")
    edge = groups["EdgeSecurityGroup"]["SecurityGroupIngress"]
    for rule in edge:
        if rule["IpProtocol"] == "tcp":
            assert rule["FromPort"] in {80, 443}
            assert rule["SourceSecurityGroupId"] == {"Ref": "NlbSecurityGroup"}
            assert "CidrIp" not in rule
        else:  # Path MTU discovery: ICMP "fragmentation needed" only
            assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("icmp", 3, 4)
    [nlb] = resources(EDGE_REGION, "AWS::ElasticLoadBalancingV2::LoadBalancer").values()
    assert nlb["SecurityGroups"] == [{"Ref": "NlbSecurityGroup"}]
    assert nlb["Type"] == "network" and nlb["Scheme"] == "internet-facing"


def test_instance_role_reads_only_its_certificates_and_wheel() -> None:
    [role] = resources(EDGE_REGION, "AWS::IAM::Role").values()
    [policy] = role["Policies"]
    statements = policy["PolicyDocument"]["Statement"]
    ssm = statements[0]
    assert ssm["Action"] == ["ssm:GetParameter", "ssm:GetParameters"]
    assert ssm["Resource"]["Fn::Sub"].endswith(":parameter${CertificateParameterPath}/*")
    conditional = [s["Fn::If"] for s in statements if "Fn::If" in s]
    assert [c[0] for c in conditional] == ["CustomKmsKey", "SendMetrics", "WheelFromS3"]
    assert conditional[1][1]["Action"] == "aps:RemoteWrite"
    assert conditional[2][1]["Action"] == "s3:GetObject"
    # Shell access: SSM Session Manager (the agent is installed at boot).
    assert role["ManagedPolicyArns"] == [
        {"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"}
    ]


# ---------------------------------------------------------------------- user data

SAMPLE = {
    "WheelUrl": "s3://geoedge-artifacts/geoedge-0.1.0-py3-none-any.whl",
    "CertificateParameterPath": "/geoedge/tokyo",
    "EdgeId": "tokyo",
    "AWS::Region": "ap-northeast-1",
    "MetricsWorkspaceId": "ws-0123",
    "MetricsWorkspaceRegion": "eu-west-1",
    "VpcCidr": "10.20.0.0/16",
    "Origins": "origin.example.com:7443 --origin origin-london.example.com:7443",
    "Names": "app.example.com --name www.example.com",
    "ServerCertificates": "ssm",
    "AcmeFlag": "",
}
#: SAMPLE's changes with ServerCertificates=acme (the Sub variable's !If).
ACME = {"ServerCertificates": "acme", "AcmeFlag": "--acme"}


def user_data(values: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """The launch template's user data with ``SAMPLE`` (and ``values``)
    substituted, and it parsed."""
    [template] = resources(EDGE_REGION, "AWS::EC2::LaunchTemplate").values()
    body, variables = template["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Sub"]
    parameters = set(load(EDGE_REGION)["Parameters"])
    used = set(re.findall(r"\$\{([^}!]+)\}", body))
    # Everything substituted is a parameter, a pseudo parameter or a Sub variable.
    assert used <= parameters | set(variables) | {"AWS::Region"}, used
    assert set(variables) == {"Origins", "Names", "AcmeFlag"}
    assert variables["AcmeFlag"] == {"Fn::If": ["UseAcme", "--acme", ""]}
    assert load(EDGE_REGION)["Conditions"]["UseAcme"] == {
        "Fn::Equals": [{"Ref": "ServerCertificates"}, "acme"]
    }
    sample = SAMPLE | (values or {})
    text = re.sub(r"\$\{([^}!]+)\}", lambda m: sample[m.group(1)], body)
    assert text.startswith("#cloud-config\n")
    assert len(text.encode()) < USER_DATA_LIMIT_BYTES  # not compressed: CFN cannot gzip
    return text, yaml.safe_load(text)


def install_script(values: dict[str, str] | None = None) -> str:
    _, data = user_data(values)
    [script] = data["runcmd"]
    env = {
        e.split("=", 1)[0]: e.split("=", 1)[1]
        for f in data["write_files"]
        if f["path"] == "/etc/geoedge/install.env"
        for e in f["content"].splitlines()
    }
    assert env["GEOEDGE_EDGE_ID"] == SAMPLE["EdgeId"]
    return script.replace('"$GEOEDGE_EDGE_ID"', "tokyo").replace("$GEOEDGE_EDGE_ID", "tokyo")


def test_user_data_is_cloud_config_and_shell() -> None:
    _, data = user_data()
    assert set(data) <= {"package_update", "packages", "users", "write_files", "runcmd"}
    assert {"python3-venv", "awscli", "prometheus", "prometheus-node-exporter"} <= set(
        data["packages"]
    )
    assert data["users"][0] == "default" and data["users"][1]["name"] == "geoedge"
    [script] = data["runcmd"]
    assert script.startswith("set -eu\n")
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    order = [
        "dpkg -i /run/amazon-ssm-agent.deb",
        "python3 -m geoedge.release install",
        "geoedge init edge",
        "fetch server-key.pem",
        "geoedge-edge --config /etc/geoedge/edge.toml --check",
        "systemctl enable --now geoedge-edge.socket geoedge-edge.service",
        "geoedge init metrics",
    ]
    positions = [script.index(step) for step in order]
    assert positions == sorted(positions), order
    # The one install path: the wheel's own release tool, its lock, a current link.
    assert "pip install" not in script
    assert "--activate --bin-dir /usr/local/bin" in script


def test_the_metrics_agent_scrapes_the_edge_into_the_workspace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = install_script().replace("\\\n", " ")
    [line] = [x for x in script.splitlines() if "geoedge init metrics" in x]
    argv = shlex.split(
        line.strip()
        .replace('"$GEOEDGE_EDGE_ID-$id"', "tokyo-i-0abc")
        .replace('"$AWS_REGION"', "ap-northeast-1")
        .replace('"$GEOEDGE_METRICS_WORKSPACE"', "ws-0123")
        .replace('"$GEOEDGE_METRICS_REGION"', "eu-west-1")
    )[1:]
    argv[argv.index("--out") + 1] = str(tmp_path)
    assert cli.main(argv) == 0, capsys.readouterr().err
    agent = yaml.safe_load((tmp_path / "prometheus-agent.yml").read_text())
    targets = [t for job in agent["scrape_configs"] for t in job["static_configs"][0]["targets"]]
    assert ADMIN in targets
    assert "/etc/prometheus/geoedge-agent.yml" in script


def fetched_files(script: str, server_certificates: str) -> set[str]:
    """The files the install script fetches from SSM when the install.env's
    GEOEDGE_SERVER_CERTIFICATES is ``server_certificates`` (its one ``if``)."""
    fetched, skipping = set(), False
    for line in (x.strip() for x in script.splitlines()):
        if line.startswith('if [ "$GEOEDGE_SERVER_CERTIFICATES" = '):
            skipping = line.split("= ", 1)[1].split(" ]", 1)[0] != server_certificates
        elif line == "fi":
            skipping = False
        elif line.startswith("fetch ") and not skipping:
            fetched.add(shlex.split(line)[2])
    return fetched


@pytest.mark.parametrize("mode", ["ssm", "acme"])
def test_init_in_the_user_data_names_exactly_the_files_it_fetches(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ssm: the server certificate's files from SSM; acme: none, [acme] enabled
    (ServerCertificates, the stack's switch to ACME)."""
    script = install_script(ACME if mode == "acme" else None)
    joined = script.replace("\\\n", " ")
    [init_line] = [line for line in joined.splitlines() if "geoedge init edge" in line]
    argv = shlex.split(init_line.strip())[1:]
    out = argv.index("--out")
    argv[out + 1] = str(tmp_path)
    assert cli.main(argv) == 0, capsys.readouterr().err
    config = load_config(tmp_path / "edge.toml", EdgeConfig)
    assert config.edge.id == "tokyo"
    assert [o.tunnel.address for o in config.origins] == [
        "origin.example.com:7443",
        "origin-london.example.com:7443",
    ]
    if mode == "acme":
        assert config.acme.enabled and config.tls.certificates == ()
    else:
        assert not config.acme.enabled
        assert config.tls.certificates[0].names == ("app.example.com", "www.example.com")
    [listener] = config.listeners
    assert listener.proxy_protocol == "v2" and [str(n) for n in listener.trusted_proxies] == [
        SAMPLE["VpcCidr"]
    ]
    named = {str(p) for c in config.tls.certificates for p in (c.cert, c.key)}
    named |= {str(p) for o in config.origins for p in (o.tunnel.cert, o.tunnel.key, o.tunnel.ca)}
    assert fetched_files(script, mode) == named
    # The files installed from init are the ones the unit and sysctl need.
    for name in ("edge.toml", "geoedge-edge.service", "99-geoedge.conf"):
        assert f"/run/geoedge-init/{name}" in script


# ---------------------------------------------------------------------------- DNS


def test_each_latency_record_has_its_region_and_a_health_check_of_its_own_nlb() -> None:
    template = load(LATENCY_DNS)
    [group] = resources(LATENCY_DNS, "AWS::Route53::RecordSetGroup").values()
    checks = resources(LATENCY_DNS, "AWS::Route53::HealthCheck")
    records = group["RecordSets"]
    assert len(records) == 3
    assert len({r["SetIdentifier"]["Fn::Sub"] for r in records}) == 3
    assert len({r["Region"]["Ref"] for r in records}) == 3
    assert {r["Name"]["Ref"] for r in records} == {"RecordName"}
    for record in records:
        alias = record["AliasTarget"]
        assert alias["EvaluateTargetHealth"] is True
        check = checks[record["HealthCheckId"]["Ref"]]["HealthCheckConfig"]
        assert check["FullyQualifiedDomainName"] == alias["DNSName"]
        assert (check["Type"], check["Port"]) == ("HTTPS", 443)
        region = record["Region"]["Ref"]
        assert alias["DNSName"] == {"Ref": f"{region}NlbDnsName"}
        assert alias["HostedZoneId"] == {"Ref": f"{region}NlbHostedZoneId"}
        assert check["ResourcePath"] == {"Ref": "HealthCheckPath"}
    assert template["Parameters"]["HealthCheckPath"]["Default"] == READINESS_PATH
    # The defaults are real AWS regions, one per continent of the example.
    defaults = [template["Parameters"][f"Region{n}"]["Default"] for n in (1, 2, 3)]
    assert defaults == ["ap-northeast-1", "us-east-1", "eu-west-1"]


# ------------------------------------------------------------------------- README


def deploy_commands() -> list[tuple[str, dict[str, str]]]:
    """(template, parameter overrides) of each ``aws cloudformation deploy`` in the README."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.DOTALL)
    found = []
    for block in blocks:
        for command in block.replace("\\\n", " ").splitlines():
            if "aws cloudformation deploy" not in command:
                continue
            [template] = re.findall(r"--template-file (\S+)", command)
            overrides = command.split("--parameter-overrides", 1)[1]
            pairs = dict(re.findall(r"(?:^|\s)([A-Z][A-Za-z0-9]*)=(\S+)", overrides))
            found.append((template, pairs))
    return found


def test_readme_walkthrough_deploys_both_templates_with_their_parameters() -> None:
    commands = deploy_commands()
    root = DEPLOY.parent
    assert {template for template, _ in commands} == {
        str(EDGE_REGION.relative_to(root)),
        str(LATENCY_DNS.relative_to(root)),
    }
    for template, given in commands:
        parameters = load(root / template)["Parameters"]
        assert set(given) <= set(parameters), set(given) - set(parameters)
        required = {name for name, p in parameters.items() if "Default" not in p}
        assert required <= set(given), f"{template}: missing {required - set(given)}"
    text = README.read_text()
    assert "--capabilities CAPABILITY_IAM" in text
    # The walk-through comes in order: wheel, certificates, stacks, DNS.
    steps = [
        "make dist",
        "geoedge pki peer --dir ca --role edge --id tokyo",
        "--template-file deploy/aws/edge-region.yaml",
        "--template-file deploy/aws/latency-dns.yaml",
    ]
    section = text[text.index("## 11. Deploy to three regions") :]
    positions = [section.index(step) for step in steps]
    assert positions == sorted(positions)
