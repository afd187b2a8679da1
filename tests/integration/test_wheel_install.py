"""geoedge as a user installs it: the wheel, in a fresh virtual environment, run
from a directory outside the repository (so nothing of the checkout is
importable), with ``--version``, ``geoedge init``, the daemons' ``--check`` and
``geoedge demo``.

The wheel is built once per session without build isolation (hatchling is in
the test extra, so this needs no index); installing it fetches its
dependencies through pip's cache (PyPI the first time). The demo installs the
sample app's ``ws`` with ``npm ci`` into a cache directory of its own, as it
would on a user's machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.edge_env import ROOT
from tests.tunnel_env import free_port

pytestmark = pytest.mark.slow

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
#: What the wheel must carry under geoedge/deploy/ (relative to deploy/).
SHIPPED = [
    "README.md",
    "config/edge.example.toml",
    "config/origin.example.toml",
    "systemd/geoedge-edge.service",
    "systemd/geoedge-origin.service",
    "systemd/geoedge-node@.service",
    "sysctl/99-geoedge.conf",
    "cloud-init/edge.yaml",
    "cloud-init/origin.yaml",
    "aws/edge-region.yaml",
    "aws/latency-dns.yaml",
    "dns/route53-latency-records.json",
    "dns/route53-healthchecks.json",
    "node-app/server.js",
    "node-app/proxy.js",
    "node-app/package.json",
    "node-app/package-lock.json",
    "loadtests/locustfile.py",
]


class Installed:
    """A fresh venv with the wheel installed, and a working directory outside the repo."""

    def __init__(self, wheel: Path, venv: Path, home: Path) -> None:
        self.wheel = wheel
        self.venv = venv
        self.home = home
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
        }
        self.env |= {"XDG_CACHE_HOME": str(home / "cache"), "HOME": str(home)}

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, name: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.bin(name), *args],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    assert not base.is_relative_to(ROOT)
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(base / "dist"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    [wheel] = (base / "dist").glob("geoedge-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "-q", str(wheel)],
        cwd=base,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    home = base / "home"
    home.mkdir()
    yield Installed(wheel, venv, home)


def test_wheel_carries_the_deployment_files_and_no_node_modules(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    packaged = "geoedge/deploy/"
    for name in SHIPPED:
        assert packaged + name in names, name
    assert not [n for n in names if "node_modules" in n or "__pycache__" in n]
    assert not [n for n in names if n.startswith(("tests/", "loadtests/", "deploy/"))]
    # The shipped copies are the repository's files.
    with zipfile.ZipFile(installed.wheel) as wheel:
        for name in SHIPPED:
            source = ROOT / ("loadtests" if name.startswith("loadtests/") else "deploy")
            relative = name.removeprefix("loadtests/") if name.startswith("loadtests/") else name
            assert wheel.read(packaged + name) == (source / relative).read_bytes(), name


def test_wheel_installs_exactly_four_top_level_packages(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"geoedge", "edge", "origin", "tunnel"}


def test_installed_package_is_the_wheel_not_the_checkout(installed: Installed) -> None:
    probe = installed.run(
        "python", "-c", "import geoedge, tunnel, edge, origin; print(tunnel.__file__)"
    )
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(installed.venv)


@pytest.mark.parametrize("command", ["geoedge", "geoedge-edge", "geoedge-origin"])
def test_every_command_reports_the_version(installed: Installed, command: str) -> None:
    result = installed.run(command, "--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"{command} {VERSION}")


def test_init_edge_config_checks_with_certificates_from_geoedge_pki(installed: Installed) -> None:
    home = installed.home
    etc = home / "etc-geoedge"
    out = home / "init-edge"
    ca = str(home / "ca")
    steps = [
        ["geoedge", "init", "edge", "--out", str(out), "--id", "tokyo-1", "--etc", str(etc)],
        ["geoedge", "pki", "init", "--dir", ca],
        ["geoedge", "pki", "peer", "--dir", ca, "--role", "edge", "--id", "tokyo-1",
         "--out-dir", str(etc / "pki")],
        ["geoedge", "pki", "server", "--dir", ca, "--name", "app.example.com",
         "--out", "app-ecdsa", "--out-dir", str(etc / "tls")],
    ]  # fmt: skip
    for command, *args in steps:
        result = installed.run(command, *args)
        assert result.returncode == 0, f"{command} {args}: {result.stderr}"
    shutil.copy(home / "ca" / "ca.pem", etc / "pki" / "ca.pem")
    assert sorted(p.name for p in out.iterdir()) == [
        "99-geoedge.conf",
        "cloud-init.yaml",
        "edge.toml",
        "geoedge-edge.service",
        "geoedge-edge.socket",
    ]
    check = installed.run("geoedge-edge", "--config", str(out / "edge.toml"), "--check")
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith(f"{out / 'edge.toml'}: ok"), check.stdout
    # Without the server certificate the check names the file that is missing.
    (etc / "tls" / "app-ecdsa-key.pem").unlink()
    check = installed.run("geoedge-edge", "--config", str(out / "edge.toml"), "--check")
    assert check.returncode == 2 and "app-ecdsa-key.pem" in check.stderr
    assert "Traceback" not in check.stderr

    origin_out = home / "init-origin"
    result = installed.run("geoedge", "init", "origin", "--out", str(origin_out))
    assert result.returncode == 0, result.stderr
    check = installed.run("geoedge-origin", "--config", str(origin_out / "origin.toml"), "--check")
    # The config loads; its tunnel certificates are not issued on this host yet.
    assert check.returncode == 2, check.stderr
    assert "[tunnel_listener] cert" in check.stderr and "origin.pem" in check.stderr
    assert "Traceback" not in check.stderr


def _read_line(stream, deadline: float) -> str:  # type: ignore[no-untyped-def]
    """One line from a pipe, or "" at the deadline (the demo may print nothing)."""
    line = b""
    fd = stream.fileno()
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return ""
        chunk = os.read(fd, 1)
        if not chunk:
            break
        line += chunk
    return line.decode()


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def test_demo_runs_from_the_wheel_and_stops_cleanly(installed: Installed) -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("the demo needs node and npm (make node installs them)")
    port = free_port()
    demo = subprocess.Popen(
        [installed.bin("geoedge"), "demo", "--port", str(port)],
        cwd=installed.home,
        env=installed.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    children: set[int] = set()
    try:
        line = _read_line(demo.stdout, time.monotonic() + 180)
        assert line.startswith("geoedge demo ready: "), (line, demo.poll())
        url, ca = (part.split("=", 1)[1] for part in line.split()[3:5])
        assert url == f"https://127.0.0.1:{port}"
        children = _descendants(demo.pid)
        assert len(children) >= 6, children  # 4 Node backends, an origin, an edge
        # The app came from the wheel, its modules from npm into the cache.
        cached = list((installed.home / "cache" / "geoedge").glob("node-app-*/node_modules/ws"))
        assert cached, "ws was not installed into the cache"
        context = ssl.create_default_context(cafile=ca)
        with urllib.request.urlopen(f"{url}/ip", context=context, timeout=10) as response:
            assert json.loads(response.read())["x_forwarded_for"] == "127.0.0.1"
    finally:
        demo.send_signal(signal.SIGTERM)
        try:
            demo.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    deadline = time.monotonic() + 10
    alive = children
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if Path(f"/proc/{pid}").exists()}
        time.sleep(0.1)
    assert not alive, f"processes left behind: {alive}"
    assert demo.returncode == 0, demo.stderr.read().decode()[-2000:]  # type: ignore[union-attr]


#: Runs inside the namespace with the installed venv's python: wait for the
#: edge's /healthz, then one request through edge, tunnel, origin and Node.
CHAIN_PROBE = """
import json, ssl, sys, time, urllib.request
admin, url, ca = sys.argv[1:4]
deadline = time.monotonic() + float(sys.argv[4])
while True:
    try:
        with urllib.request.urlopen(admin, timeout=1) as r:
            if r.status == 200:
                break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("no tunnel up")
        time.sleep(0.2)
context = ssl.create_default_context(cafile=ca)
with urllib.request.urlopen(url, context=context, timeout=10) as r:
    print(json.dumps(json.loads(r.read())))
"""


def _exec_start(unit: Path, venv: Path, instance: str = "") -> list[str]:
    """A generated unit's command line, its /usr/local/bin commands from the venv."""
    [line] = [x for x in unit.read_text().splitlines() if x.startswith("ExecStart=")]
    command = line.removeprefix("ExecStart=").replace("%i", instance)
    return command.replace("/usr/local/bin/", f"{venv}/bin/").split()


def test_generated_host_files_run_edge_origin_and_node(installed: Installed) -> None:
    """``geoedge init`` for an origin, its Node.js backends and an edge, the
    certificates from ``geoedge pki``, every process started with its generated
    unit's ExecStart: in a network namespace of its own, since the configs bind
    ports 80, 443, 7443 and 3001-3004 on every address."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and ip (a network namespace for ports 80 and 443)")
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("needs node and npm (make node installs them)")
    home = installed.home / "chain"
    etc, ca = home / "etc", str(home / "ca")
    steps = [
        ["geoedge", "init", "origin", "--out", str(home / "origin"), "--etc", str(etc)],
        ["geoedge", "init", "edge", "--out", str(home / "edge"), "--etc", str(etc),
         "--origin", "localhost:7443", "--name", "localhost"],
        ["geoedge", "init", "node", "--out", str(home / "node")],
        ["geoedge", "pki", "init", "--dir", ca],
        ["geoedge", "pki", "peer", "--dir", ca, "--role", "origin", "--id", "origin-1",
         "--dns", "localhost", "--out", "origin", "--out-dir", str(etc / "pki")],
        ["geoedge", "pki", "peer", "--dir", ca, "--role", "edge", "--id", "edge-1",
         "--out-dir", str(etc / "pki")],
        ["geoedge", "pki", "server", "--dir", ca, "--name", "localhost", "--name", "127.0.0.1",
         "--out", "app-ecdsa", "--out-dir", str(etc / "tls")],
    ]  # fmt: skip
    for command, *args in steps:
        result = installed.run(command, *args)
        assert result.returncode == 0, f"{command} {args}: {result.stderr}"
    shutil.copy(home / "ca" / "ca.pem", etc / "pki" / "ca.pem")
    # The one host path not under --etc: the access log (systemd's LogsDirectory).
    edge_toml = home / "edge" / "edge.toml"
    edge_toml.write_text(
        edge_toml.read_text().replace("/var/log/geoedge/access.log", str(home / "access.log"))
    )
    app = home / "node" / "node-app"
    npm = subprocess.run(
        ["npm", "ci", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=app, capture_output=True, text=True, timeout=300, env=installed.env,
    )  # fmt: skip
    assert npm.returncode == 0, npm.stderr

    ns = f"gewheel{os.getpid() % 100000}"
    procs: list[subprocess.Popen[bytes]] = []
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, timeout=30)

        def start(name: str, argv: list[str], cwd: Path) -> None:
            with open(home / f"{name}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        ["ip", "netns", "exec", ns, *argv],
                        cwd=cwd,
                        env=installed.env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

        node_unit = home / "node" / "geoedge-node@.service"
        origin = tomllib.loads((home / "origin" / "origin.toml").read_text())
        ports = [b["address"].rsplit(":", 1)[1] for p in origin["pools"] for b in p["backends"]]
        assert ports == ["3001", "3002", "3003", "3004"]
        for port in ports:
            start(f"node-{port}", _exec_start(node_unit, installed.venv, port), app)
        for role in ("origin", "edge"):
            # Installed as init says (under --etc), started as the unit says.
            shutil.copy(home / role / f"{role}.toml", etc / f"{role}.toml")
            argv = _exec_start(home / role / f"geoedge-{role}.service", installed.venv)
            assert argv == [installed.bin(f"geoedge-{role}"), "--config", f"{etc}/{role}.toml"]
            start(role, argv, installed.home)
        (home / "probe.py").write_text(CHAIN_PROBE)
        probe = subprocess.run(
            ["ip", "netns", "exec", ns, installed.bin("python"), str(home / "probe.py"),
             "http://127.0.0.1:7444/readyz", "https://127.0.0.1/ip", str(etc / "pki" / "ca.pem"),
             "60"],
            capture_output=True, text=True, timeout=120, env=installed.env,
        )  # fmt: skip
        logs = {p.name: p.read_text(errors="replace")[-1500:] for p in home.glob("*.log")}
        assert probe.returncode == 0, (probe.stderr, logs)
        answer = json.loads(probe.stdout)
        assert answer["x_forwarded_for"] == "127.0.0.1"
        assert str(answer["backend"]) in ports
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        left = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in left.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", ns], timeout=30)
    # Every daemon stopped on SIGTERM, as systemd stops it: status 0.
    assert [proc.returncode for proc in procs] == [0] * len(procs), logs
