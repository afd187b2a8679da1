"""Pinned, versioned, reversible installs (issue 28), upgraded and rolled back
by ``systemctl reload`` (issue 27), with real wheels and daemons.

Two builds of geoedge (the checkout as it is, and the same with another
version) are installed the one way hosts install them: ``geoedge.release``
run from the wheel itself, dependencies from the lock file the wheel carries
(``--require-hashes``), each release in its own directory, ``current`` a link,
the commands linked through it into a ``bin`` directory as into
``/usr/local/bin``.

Then a Node.js backend, an origin and an edge (two workers each) run as their
units run them: the unit's ``ExecStart=`` (the console script through the
link), the listening socket passed as descriptor 3 as the socket unit passes
it, and a notify socket of the test's own where systemd's would be. While new
HTTPS connections keep arriving and a keep-alive client keeps sending on its
connection, the release is switched and each daemon (origin first, then edge)
is reloaded with its unit's ``ExecReload=`` line and its pid as ``$MAINPID``:
upgrade (``geoedge release activate`` the second build), then rollback
(``geoedge release rollback``). No request may fail; after each reload the
supervisor is the same process (``MAINPID=`` unchanged), it runs the
interpreter of the release the link points at, and every worker is new and
reports that release's version in ``geoedge_build_info`` on ``/metrics`` and
on the status page.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadtests.reload_stack import exec_reload, unit_command, worker_versions
from tests.conftest import PkiFiles, scaled
from tests.edge_env import (
    ROOT,
    Processes,
    node_available,
    write_edge_config,
    write_origin_config,
)
from tests.integration.test_reload import children, wait_for
from tests.integration.test_status_page import fact, status, table
from tests.integration.test_systemd import NotifySocket
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
        # The release mechanics, not the compilation (test_wheel_install has the
        # compiled wheel): a pure wheel, without compiling everything twice.
        env=os.environ | {"GEOEDGE_NO_EXTENSIONS": "1"},
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [wheel] = out.glob("geoedge-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name  # GEOEDGE_NO_EXTENSIONS=1
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
    assert version.strip() == f"geoedge {VERSION} (pure Python)"  # the wheels build_wheel makes


# --------------------------------------------------------------- serving throughout

#: Workers per daemon: "every worker" must mean more than one.
WORKERS = 2


def listening_socket(port: int) -> socket.socket:
    """What systemd's socket unit holds and passes to the daemon."""
    sock = socket.create_server(("127.0.0.1", port), backlog=4096)
    sock.set_inheritable(True)
    return sock


@dataclass
class Daemon:
    """One daemon as its unit runs it: ``ExecStart=`` with ``bin/`` (the links
    through ``current``) for ``/usr/local/bin``, its listening socket passed as
    systemd passes it, ``NOTIFY_SOCKET`` the test's; ``ExecReload=`` with its pid."""

    role: str
    installed: Installed
    config: Path
    sock: socket.socket
    fd_name: str
    admin_port: int
    notify: NotifySocket
    procs: Processes
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bin_dir(self) -> Path:
        return self.installed.work / "bin"

    @property
    def pid(self) -> int:
        assert self.proc is not None and self.proc.poll() is None, f"the {self.role} exited"
        return self.proc.pid

    def start(self) -> None:
        fd = self.sock.fileno()
        wrapper = (
            f"export LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES={self.fd_name}; "
            f'exec "$@" 3<&{fd} {fd}<&-'
        )
        command = unit_command(self.role, "ExecStart", bin_dir=self.bin_dir, config=self.config)
        assert command[0] == str(self.bin_dir / f"geoedge-{self.role}")
        with (self.installed.work / f"{self.role}.log").open("ab") as log:
            self.proc = self.procs.start(
                ["bash", "-c", wrapper, "_", *command],
                pass_fds=(fd,),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.installed.work,
                env={**clean_env(), "NOTIFY_SOCKET": str(self.notify.path)},
            )

    def wait_ready(self) -> None:
        """Until ``READY=1`` came (the edge: its tunnels up and warm)."""
        log = self.installed.work / f"{self.role}.log"
        wait_for(
            lambda: self.readies() or self.proc is None or self.proc.poll() is not None,
            f"the {self.role} never said READY=1",
        )
        assert self.proc is not None and self.proc.poll() is None, log.read_text()[-3000:]

    def readies(self) -> list[list[str]]:
        return [lines for _, lines in list(self.notify.messages) if "READY=1" in lines]

    def reload(self, version: str) -> None:
        """``systemctl reload``: the unit's ``ExecReload=`` with ``$MAINPID``; it
        must end ``ok`` with ``version``, and systemd must hear ``READY=1`` from
        the same main pid."""
        pid, readies = self.pid, len(self.readies())
        done = exec_reload(
            self.role, bin_dir=self.bin_dir, config=self.config, pid=pid,
            cwd=self.installed.work, env=clean_env(), timeout_s=scaled(150),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        last = done.stderr.splitlines()[-1]
        assert last.startswith(f"geoedge-{self.role}: ok version {version},"), done.stderr
        wait_for(lambda: len(self.readies()) > readies, f"no READY=1 after the {self.role} reload")
        ready = self.readies()[-1]
        assert f"MAINPID={pid}" in ready and any(x.startswith("STATUS=reload ok") for x in ready)
        assert self.pid == pid  # the same process: re-executed in place

    def runs(self, release: str) -> None:
        """The supervisor runs the interpreter of ``release`` (the ``#!`` line
        of the script the link led to when it last executed)."""
        argv = Path(f"/proc/{self.pid}/cmdline").read_text().split("\0")
        assert argv[0] == str(self.installed.opt / "releases" / release / "bin" / "python"), argv

    def wait_workers(self, version: str, old: set[int]) -> set[int]:
        """Until the supervisor has ``WORKERS`` workers, none of ``old``, each
        of them (and no other) reporting ``version`` on /metrics and on the
        status page; returns them."""
        seen: dict[str, object] = {}

        def settled() -> bool:
            workers = children(self.pid)
            seen["workers"] = workers
            if len(workers) != WORKERS or workers & old:
                return False
            try:
                seen["metrics"] = worker_versions(self.admin_port)
                page = status(self.admin_port)
            except (OSError, ValueError):
                return False
            # A row's version cell: "<version> (<build mode>)".
            rows = {int(row[0]): row[1].rsplit(" (", 1)[0] for row in table(page, "Workers")}
            seen["status page"] = rows
            seen["supervisor"] = supervisor = fact(page, "version")
            expected = dict.fromkeys(workers, version)
            return seen["metrics"] == expected and rows == expected and supervisor == version

        wait_for(settled, lambda: f"the {self.role}'s workers never all reported {version}: {seen}")
        workers = seen["workers"]
        assert isinstance(workers, set)
        return workers


class LoadClient:
    """Requests through the edge, ``GET /ip`` one after the other, 20 ms apart,
    in a thread of its own until :attr:`stop` (bounded: at most ``limit``)."""

    def __init__(self, port: int, ca: Path, limit: int = 20_000) -> None:
        self.port, self.limit = port, limit
        self.context = ssl.create_default_context(cafile=str(ca))
        self.ok = 0
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def connection(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self.context, timeout=scaled(60)
        )

    def _run(self) -> None:
        for _ in range(self.limit):
            if self.stop.is_set():
                break
            self.request()
            time.sleep(0.02)
        self.done()

    def request(self) -> None:
        raise NotImplementedError

    def done(self) -> None:
        """The load stopped."""

    def count(self, response: http.client.HTTPResponse, body: bytes) -> None:
        if response.status == 200 and b"remote_address" in body:
            self.ok += 1
        else:
            self.failures.append(f"{response.status} {body[:100]!r}")


class NewConnections(LoadClient):
    """A new HTTPS connection for each request."""

    def request(self) -> None:
        conn = self.connection()
        try:
            conn.request("GET", "/ip", headers={"Host": "localhost"})
            response = conn.getresponse()
            self.count(response, response.read())
        except (OSError, http.client.HTTPException) as exc:
            self.failures.append(repr(exc))
        finally:
            conn.close()


class KeepAlive(LoadClient):
    """Every request on one kept-alive connection, as a browser does: a new
    connection only when the edge closed the last one (``Connection: close``,
    or closed while idle). A request on a reused connection that the server
    closed before answering it is sent again on a new one, as RFC 9112 §9.3.1
    lets a client do for an idempotent request (a draining worker closes its
    idle keep-alive connections, docs/upgrades.md): such retries are counted;
    anything else is a failure."""

    def __init__(self, port: int, ca: Path) -> None:
        super().__init__(port, ca)
        self.conn = self.connection()
        self.connections = 0
        self.retried: list[str] = []

    def request(self) -> None:
        conn = self.conn
        reused = conn.sock is not None
        if not reused:
            self.connections += 1
        try:
            conn.request("GET", "/ip", headers={"Host": "localhost"})
            response = conn.getresponse()
            body = response.read()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                ssl.SSLEOFError) as exc:  # fmt: skip
            conn.close()
            if reused:
                self.retried.append(repr(exc))
                self.request()
            else:
                self.failures.append(repr(exc))
            return
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            self.failures.append(repr(exc))
            return
        self.count(response, body)

    def done(self) -> None:
        self.conn.close()


def served(clients: Sequence[LoadClient]) -> list[int]:
    return [client.ok for client in clients]


def wait_served_beyond(clients: Sequence[LoadClient], counts: Sequence[int]) -> None:
    """Until each client got 20 more answers than ``counts``."""
    wait_for(
        lambda: all(c.ok > n + 20 for c, n in zip(clients, counts, strict=True)),
        lambda: f"the clients stopped being served: {[c.failures[-5:] for c in clients]}",
    )


def reload_each(
    daemons: Sequence[Daemon],
    release_name: str,
    version: str,
    workers: dict[str, set[int]],
    clients: Sequence[LoadClient],
) -> None:
    """``systemctl reload`` of each daemon in turn, ``release_name`` (of
    ``version``) now current: every client is served during each reload and
    after it, and the daemon's new workers (``workers[role]`` before, updated)
    run that release."""
    for daemon in daemons:
        before = served(clients)
        daemon.reload(version)
        during = served(clients)
        assert all(n > b for n, b in zip(during, before, strict=True)), (before, during)
        workers[daemon.role] = daemon.wait_workers(version, workers[daemon.role])
        daemon.runs(release_name)
        wait_served_beyond(clients, during)


def test_upgrade_and_rollback_switch_the_link_and_reload_serving_throughout(
    installed: Installed, test_pki: PkiFiles, tmp_path: Path
) -> None:
    procs = Processes()
    node_port, tunnel_port, https_port = free_port(), free_port(), free_port()
    origin_admin, edge_admin = free_port(), free_port()
    tunnel_sock, https_sock = listening_socket(tunnel_port), listening_socket(https_port)
    origin_notify = NotifySocket(tmp_path / "origin-notify.sock")
    edge_notify = NotifySocket(tmp_path / "edge-notify.sock")
    origin_config = write_origin_config(
        tmp_path / "origin.toml",
        test_pki,
        port=tunnel_port,
        backends=[node_port],
        admin_port=origin_admin,
        workers=WORKERS,
    )
    edge_config = write_edge_config(
        tmp_path / "edge.toml",
        test_pki,
        https_port=https_port,
        admin_port=edge_admin,
        origins=[("origin-a", tunnel_port)],
        workers=WORKERS,
    )
    origin = Daemon(
        "origin", installed, origin_config, tunnel_sock, "tunnel", origin_admin,
        origin_notify, procs,
    )  # fmt: skip
    edge = Daemon(
        "edge", installed, edge_config, https_sock, "edge", edge_admin, edge_notify, procs
    )
    fresh, kept = NewConnections(https_port, test_pki.ca), KeepAlive(https_port, test_pki.ca)
    clients = (fresh, kept)
    try:
        procs.node(node_port)
        origin.start()
        origin.wait_ready()
        edge.start()
        edge.wait_ready()
        pids = {origin.pid, edge.pid}
        workers = {d.role: d.wait_workers(VERSION, set()) for d in (origin, edge)}
        for daemon in (origin, edge):
            daemon.runs(installed.first)
        for client in clients:
            client.thread.start()
        wait_served_beyond(clients, [0, 0])

        # Upgrade: the link first, then each daemon's reload, origins before edges.
        out = release(installed.work, "activate", installed.second)
        assert f"current: {installed.second}" in out
        assert installed.current() == installed.second
        reload_each((origin, edge), installed.second, NEXT_VERSION, workers, clients)

        # Rollback: current and previous swap; each daemon is reloaded again.
        out = release(installed.work, "rollback")
        assert f"current: {installed.first}" in out
        assert installed.current() == installed.first
        assert Path(os.readlink(installed.opt / "previous")).name == installed.second
        reload_each((origin, edge), installed.first, VERSION, workers, clients)
        assert {origin.pid, edge.pid} == pids  # MAINPID never changed
    finally:
        for client in clients:
            client.stop.set()
        for client in clients:
            if client.thread.is_alive():
                client.thread.join(scaled(90))
        procs.stop_all()
        tunnel_sock.close()
        https_sock.close()
        origin_notify.close()
        edge_notify.close()
    assert fresh.failures == [], fresh.failures[:10]
    assert kept.failures == [], kept.failures[:10]
    # The keep-alive client kept its connection between reloads (far more
    # requests than connections), and each edge reload (two) moved it to a new
    # worker: the old one closed it, idle (a retry) or after an answer.
    assert kept.connections >= 3 and kept.ok > 5 * kept.connections, (kept.ok, kept.connections)
    assert len(kept.retried) <= 2, kept.retried
