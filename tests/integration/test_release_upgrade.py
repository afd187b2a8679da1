"""Pinned, versioned, reversible installs (issue 28), with real wheels and daemons.

Two builds of geoedge (the checkout as it is, and the same with another
version) are installed the one way hosts install them: ``geoedge.release``
run from the wheel itself, dependencies from the lock file the wheel carries
(``--require-hashes``), each release in its own directory, ``current`` a link.
Then an origin, an edge and a Node.js backend run from ``current`` while a
client keeps opening new HTTPS connections through the edge; the releases are
switched (upgrade, then rollback) and the daemons restarted one at a time as
``systemctl restart`` does with the socket units (the listening sockets are
held here, as systemd holds them, and passed as descriptor 3). Every request
must succeed, and each daemon must report the version it was switched to.

The restart stands in for ``systemctl reload`` (issue 27, upgrade in place)
until that lands; the sequence of link switch then daemon is the same.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import PkiFiles, scaled
from tests.edge_env import (
    ROOT,
    Processes,
    node_available,
    wait_port,
    write_edge_config,
    write_origin_config,
)
from tests.tunnel_env import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed"),
    pytest.mark.timeout(scaled(900)),
]

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
NEXT_VERSION = VERSION + ".post1"
#: What a copy of the checkout leaves out (built or installed, not source).
SKIP = {".git", ".venv", "node_modules", ".tools", "dist", "build", "__pycache__"}


def clean_env() -> dict[str, str]:
    """The environment of a host: nothing of the checkout or its venv."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PROMETHEUS_MULTIPROC_DIR"}
    return {key: value for key, value in os.environ.items() if key not in drop}


def build_wheel(version: str, work: Path) -> Path:
    """A wheel of the checkout's files (tracked and new) with ``version``."""
    source = work / f"src-{version}"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        if SKIP & set(Path(name).parts) or not (ROOT / name).is_file():
            continue
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    pyproject = source / "pyproject.toml"
    text = pyproject.read_text()
    assert f'version = "{VERSION}"' in text
    pyproject.write_text(text.replace(f'version = "{VERSION}"', f'version = "{version}"', 1))
    out = work / f"dist-{version}"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [wheel] = out.glob("geoedge-*.whl")
    return wheel


def release(work: Path, *args: str, wheel: Path | None = None) -> str:
    """``python3 -m geoedge.release --root ROOT ARGS``; run from ``wheel`` (the
    bootstrap: nothing installed yet) or from the current release."""
    env = clean_env()
    if wheel is not None:
        argv = [sys.executable, "-m", "geoedge.release"]
        env["PYTHONPATH"] = str(wheel)
    else:
        argv = [str(work / "bin" / "geoedge"), "release"]
    done = subprocess.run(
        [*argv, "--root", str(work / "opt"), *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(600),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@dataclass
class Installed:
    work: Path
    first: str
    second: str

    @property
    def opt(self) -> Path:
        return self.work / "opt"

    def current(self) -> str:
        return Path(os.readlink(self.opt / "current")).name


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("release")
    first_wheel = build_wheel(VERSION, work)
    second_wheel = build_wheel(NEXT_VERSION, work)
    out = release(
        work,
        "install",
        str(first_wheel),
        "--activate",
        "--bin-dir",
        str(work / "bin"),
        wheel=first_wheel,
    )
    first = next(line.split()[1] for line in out.splitlines() if line.startswith("installed "))
    # The next release is installed by the running one's own command.
    out = release(work, "install", str(second_wheel))
    second = next(line.split()[1] for line in out.splitlines() if line.startswith("installed "))
    return Installed(work, first, second)


def test_each_release_is_its_own_venv_with_the_locked_versions(installed: Installed) -> None:
    opt = installed.opt
    assert installed.first.startswith(VERSION + "-")
    assert installed.second.startswith(NEXT_VERSION + "-")
    assert installed.current() == installed.first  # installing does not activate
    lock = (ROOT / "deploy" / "requirements.lock").read_text()
    pinned = {
        line.split("==")[0].lower(): line.split("==")[1].split()[0]
        for line in lock.splitlines()
        if "==" in line and "sys_platform == 'win32'" not in line
    }
    for name in (installed.first, installed.second):
        venv = opt / "releases" / name
        manifest = json.loads((venv / "release.json").read_text())
        assert name.startswith(manifest["version"] + "-" + manifest["wheel_sha256"][:12])
        frozen = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        versions = {
            line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
            for line in frozen.splitlines()
            if "==" in line
        }
        for package, version in pinned.items():
            if package == "typing-extensions" and sys.version_info >= (3, 13):
                continue
            assert versions.get(package) == version, (name, package)
        assert (venv / "requirements.lock").read_text() == lock
    listing = release(installed.work, "list")
    assert f"{installed.first}" in listing and "current" in listing
    version = subprocess.run(
        [str(installed.work / "bin" / "geoedge"), "--version"],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=True,
    ).stdout
    assert version.strip() == f"geoedge {VERSION}"


# --------------------------------------------------------------- serving throughout


def listening_socket(port: int) -> socket.socket:
    """What systemd's socket unit holds across restarts."""
    sock = socket.create_server(("127.0.0.1", port), backlog=4096)
    sock.set_inheritable(True)
    return sock


@dataclass
class Daemon:
    """One daemon run from ``bin/`` (the links through ``current``) with its
    listening socket passed as systemd passes it."""

    work: Path
    command: str
    config: Path
    sock: socket.socket
    fd_name: str
    admin_port: int
    procs: Processes
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        fd = self.sock.fileno()
        self.starts += 1
        log = (self.work / f"{self.command}-{self.starts}.log").open("wb")
        wrapper = (
            f"export LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES={self.fd_name}; "
            f'exec "$@" 3<&{fd} {fd}<&-'
        )
        command = [str(self.work / "bin" / self.command), "--config", str(self.config)]
        self.proc = self.procs.start(
            ["bash", "-c", wrapper, "_", *command],
            pass_fds=(fd,),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.work,
            env=clean_env(),
        )
        log.close()

    def stop(self) -> None:
        """``systemctl stop``: SIGTERM, the drain, the exit."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(scaled(60)) == 0

    def restart(self) -> None:
        self.stop()
        self.start()

    def status(self) -> dict[str, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=scaled(5))
        try:
            conn.request("GET", "/status.json")
            page = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        return {label: value["text"] for label, value in page["facts"]}

    def wait_version(self, version: str) -> None:
        deadline = time.monotonic() + scaled(60)
        while True:
            try:
                if self.status().get("version") == version:
                    return
            except (OSError, http.client.HTTPException, ValueError):
                pass
            assert self.proc is not None and self.proc.poll() is None, self.command
            assert time.monotonic() < deadline, f"{self.command} never reported {version}"
            time.sleep(0.2)


@dataclass
class Client:
    """New HTTPS connections through the edge, one request each, until stopped
    (bounded: at most ``limit`` requests)."""

    port: int
    ca: Path
    limit: int = 20_000
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        context = ssl.create_default_context(cafile=str(self.ca))
        for _ in range(self.limit):
            if self.stop.is_set():
                return
            conn = http.client.HTTPSConnection(
                "127.0.0.1", self.port, context=context, timeout=scaled(60)
            )
            try:
                conn.request("GET", "/ip", headers={"Host": "localhost"})
                response = conn.getresponse()
                body = response.read()
                if response.status == 200 and b"remote_address" in body:
                    self.ok += 1
                else:
                    self.failures.append(f"{response.status} {body[:100]!r}")
            except (OSError, http.client.HTTPException) as exc:
                self.failures.append(repr(exc))
            finally:
                conn.close()
            time.sleep(0.02)

    def served_more_than(self, count: int) -> None:
        deadline = time.monotonic() + scaled(30)
        while self.ok <= count:
            assert time.monotonic() < deadline, self.failures[-5:]
            time.sleep(0.05)


def test_upgrade_and_rollback_switch_the_link_and_serve_throughout(
    installed: Installed, test_pki: PkiFiles, tmp_path: Path
) -> None:
    procs = Processes()
    node_port, tunnel_port, https_port = free_port(), free_port(), free_port()
    origin_admin, edge_admin = free_port(), free_port()
    tunnel_sock, https_sock = listening_socket(tunnel_port), listening_socket(https_port)
    origin_config = write_origin_config(
        tmp_path / "origin.toml",
        test_pki,
        port=tunnel_port,
        backends=[node_port],
        admin_port=origin_admin,
    )
    edge_config = write_edge_config(
        tmp_path / "edge.toml",
        test_pki,
        https_port=https_port,
        admin_port=edge_admin,
        origins=[("origin-a", tunnel_port)],
        # Requests arriving while the origin restarts wait for its tunnel.
        extra="\n[http]\ntunnel_wait_s = 30.0\n",
    )
    origin = Daemon(
        installed.work, "geoedge-origin", origin_config, tunnel_sock, "tunnel", origin_admin, procs
    )
    edge = Daemon(
        installed.work, "geoedge-edge", edge_config, https_sock, "edge", edge_admin, procs
    )
    client = Client(https_port, test_pki.ca)
    thread = threading.Thread(target=client.run, daemon=True)
    try:
        procs.node(node_port)
        origin.start()
        edge.start()
        origin.wait_version(VERSION)
        edge.wait_version(VERSION)
        wait_port(https_port)
        thread.start()
        client.served_more_than(20)

        # Upgrade: the link first, then the daemons, origins before edges.
        out = release(installed.work, "activate", installed.second)
        assert f"current: {installed.second}" in out
        assert installed.current() == installed.second
        for daemon in (origin, edge):
            before = client.ok
            daemon.restart()
            daemon.wait_version(NEXT_VERSION)
            client.served_more_than(before + 20)

        # Rollback: current and previous swap; the daemons follow.
        out = release(installed.work, "rollback")
        assert f"current: {installed.first}" in out
        assert installed.current() == installed.first
        assert Path(os.readlink(installed.opt / "previous")).name == installed.second
        for daemon in (origin, edge):
            before = client.ok
            daemon.restart()
            daemon.wait_version(VERSION)
            client.served_more_than(before + 20)
    finally:
        client.stop.set()
        if thread.is_alive():
            thread.join(scaled(90))
        procs.stop_all()
        tunnel_sock.close()
        https_sock.close()
    assert client.failures == [], client.failures[:10]
    assert client.ok > 100
