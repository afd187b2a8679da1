"""The servers of ``make reload-test``, installed as a user installs them.

- :func:`build_wheels`: two builds of this checkout's package, the second with
  a bumped version (PEP 440 local labels ``+reload.1`` and ``+reload.2``).
- :class:`Venv`: a fresh virtual environment with the first wheel installed
  (``pip install --no-deps``: the dependencies come from this interpreter's
  site-packages through a ``.pth`` line, so nothing is downloaded), run from
  a directory outside the checkout; :meth:`Venv.install` puts another wheel
  in place, as an upgrade does.
- :class:`ReloadStack`: Node.js backends, the origin and the edge from that
  venv. The edge's listening socket and notify socket are held here, where
  systemd holds them (``LISTEN_FDS``, ``NOTIFY_SOCKET``): the edge is started
  as ``geoedge-edge.service`` would start it.
- :func:`unit_command`: a shipped unit's ``ExecStart=`` or ``ExecReload=``
  command line, its commands and config moved to where a test installed them;
  :func:`exec_reload` runs the ``ExecReload=`` one with ``$MAINPID``, as
  systemd runs it (its output and exit status). The integration tests run
  their reloads through these too (``tests/integration/test_reload.py``,
  ``test_release_upgrade.py``).
- :func:`worker_versions`: each worker's ``geoedge_build_info`` version, read
  from a daemon's ``/metrics``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from geoedge import devstack
from geoedge.devstack import DevPki, StackError, free_port, tail, wait_port
from loadtests import edge_stack

ROOT = edge_stack.ROOT
NODE_APP = edge_stack.NODE_APP
UNITS = ROOT / "deploy" / "systemd"


def base_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def _tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [name for name in listed.decode().split("\0") if name]


def build_wheels(workdir: Path) -> list[tuple[str, Path]]:
    """Two wheels of the working tree's tracked files: (version, wheel) each."""
    files = _tracked_files()
    built = []
    for n in (1, 2):
        version = f"{base_version()}+reload.{n}"
        source = workdir / f"src-{n}"
        for name in files:
            target = source / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / name).is_file():
                shutil.copy2(ROOT / name, target)
        pyproject = source / "pyproject.toml"
        text = pyproject.read_text()
        pyproject.write_text(
            text.replace(f'version = "{base_version()}"', f'version = "{version}"', 1)
        )
        out = workdir / f"wheel-{n}"
        subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
            cwd=source,
            check=True,
            capture_output=True,
        )
        (wheel,) = out.glob("*.whl")
        built.append((version, wheel))
    return built


class Venv:
    """A virtual environment with geoedge installed from a wheel (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True)
        purelib = Path(
            subprocess.run(
                [
                    str(self.python),
                    "-c",
                    "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        # This interpreter's packages after the venv's own: the dependencies.
        (purelib / "zz_geoedge_dependencies.pth").write_text(
            sysconfig.get_paths()["purelib"] + "\n"
        )
        self.home = path.parent / "home"
        self.home.mkdir(exist_ok=True)
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
        }

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    def install(self, wheel: Path) -> None:
        subprocess.run(
            [str(self.python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
             "--force-reinstall", str(wheel)],
            check=True, capture_output=True, cwd=self.home, env=self.env,
        )  # fmt: skip

    def version(self) -> str:
        return subprocess.run(
            [self.bin("geoedge-edge"), "--version"],
            check=True, capture_output=True, text=True, cwd=self.home, env=self.env,
        ).stdout.split()[-1]  # fmt: skip


def unit_command(
    role: str, directive: str, *, bin_dir: Path, config: Path, pid: int | None = None
) -> list[str]:
    """The command line of ``directive`` (``ExecStart`` or ``ExecReload``) in the
    shipped ``geoedge-<role>.service``, with ``/usr/local/bin`` moved to
    ``bin_dir``, ``/etc/geoedge/<role>.toml`` to ``config`` and ``$MAINPID``
    replaced by ``pid``."""
    prefix = f"{directive}="
    line = next(
        line
        for line in (UNITS / f"geoedge-{role}.service").read_text().splitlines()
        if line.startswith(prefix)
    )
    replaced = {
        f"/usr/local/bin/geoedge-{role}": str(bin_dir / f"geoedge-{role}"),
        f"/etc/geoedge/{role}.toml": str(config),
        "$MAINPID": str(pid),
    }
    return [replaced.get(arg, arg) for arg in shlex.split(line.removeprefix(prefix))]


def exec_reload(
    role: str,
    *,
    bin_dir: Path,
    config: Path,
    pid: int,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run the unit's ``ExecReload=`` (:func:`unit_command`) with ``$MAINPID`` =
    ``pid``, as systemd runs it; the reload client prints what the supervisor
    says on stderr, the last line ``<prog>: ok version ...``, ``refused ...``
    or ``failed ...``."""
    argv = unit_command(role, "ExecReload", bin_dir=bin_dir, config=config, pid=pid)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=cwd, env=env)


def build_info(text: str) -> dict[int, str]:
    """pid -> version of each ``geoedge_build_info`` series in a /metrics text
    (one per live worker)."""
    return {
        int(sample.labels["pid"]): sample.labels["version"]
        for family in text_string_to_metric_families(text)
        if family.name == "geoedge_build_info"
        for sample in family.samples
    }


def worker_versions(admin_port: int, timeout_s: float = 10.0) -> dict[int, str]:
    """pid -> version each worker runs, from the admin listener's /metrics (a
    connection of its own: a reload closes the old supervisor's keep-alive ones)."""
    url = f"http://127.0.0.1:{admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return build_info(response.read().decode())


@dataclass(frozen=True, slots=True)
class Ports:
    nodes: tuple[int, int]
    edge: int
    edge_admin: int
    tunnel: int
    origin_admin: int

    @classmethod
    def allocate(cls) -> Ports:
        return cls((free_port(), free_port()), free_port(), free_port(), free_port(), free_port())


class ReloadStack:
    """Node backends, the origin and the edge (both from ``venv``, two workers each)."""

    def __init__(
        self, workdir: Path, venv: Venv, *, drain_timeout_s: float, ws_window_s: float
    ) -> None:
        self.workdir = workdir
        self.venv = venv
        self.ports = ports = Ports.allocate()
        self.keys: DevPki = devstack.make_dev_pki(
            workdir / "pki", edge_id="reload-edge", origin_id="reload-origin"
        )
        self.edge_config = workdir / "edge.toml"
        self.origin_config = workdir / "origin.toml"
        self.edge_config.write_text(
            devstack.edge_toml(
                self.keys,
                edge_id=self.keys.edge_id,
                https_port=ports.edge,
                admin_port=ports.edge_admin,
                origins=[(self.keys.origin_id, ports.tunnel)],
                workers=2,
                drain_timeout_s=drain_timeout_s,
                access_log="",
                admission={"max_connections": 20000, "max_connections_per_client_ip": 20000},
                edge_keys=f"drain_websocket_window_s = {ws_window_s}\n",
            )
        )
        self.origin_config.write_text(
            devstack.origin_toml(
                self.keys,
                origin_id=self.keys.origin_id,
                tunnel_port=ports.tunnel,
                admin_port=ports.origin_admin,
                allowed_identities=[self.keys.edge_id],
                backends=list(ports.nodes),
                pool="node",
                health=devstack.HealthCheck("/health", interval_s=1.0),
                workers=2,
                drain_timeout_s=drain_timeout_s,
                log_level="info",
                access_log="",
            )
        )
        self.processes = devstack.ProcessGroup()
        # systemd's part for the edge: the listening socket and the notify socket.
        self.listener = socket.create_server(("127.0.0.1", ports.edge), backlog=4096)
        self.notify_path = workdir / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.settimeout(0.2)
        self.notifications: list[tuple[float, list[str]]] = []
        # Read as systemd does, all the time: a full queue would drop messages.
        self._reading = threading.Thread(target=self._read_notifications, daemon=True)
        self._stopping = threading.Event()
        self._reading.start()

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def start(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        for index, port in enumerate(self.ports.nodes):
            node = self.processes.spawn(
                f"node{index}",
                ["node", str(NODE_APP), str(port)],
                log=self.log(f"node{index}"),
                cwd=ROOT,
            )
            wait_port(port, deadline, node, self.log(f"node{index}"))
        venv = self.venv
        origin = self.processes.spawn(
            "origin",
            [venv.bin("geoedge-origin"), "--config", str(self.origin_config)],
            log=self.log("origin"), cwd=venv.home, env=venv.env,
        )  # fmt: skip
        wait_port(self.ports.tunnel, deadline, origin, self.log("origin"))
        fd = self.listener.fileno()
        script = (
            f"exec 3<&{fd} {fd}<&-; LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=https "
            'exec "$0" --config "$1"'
        )
        env = {**venv.env, "NOTIFY_SOCKET": str(self.notify_path), "WATCHDOG_USEC": "30000000"}
        out = open(self.log("edge"), "wb")  # noqa: SIM115 - the child holds it
        try:
            self.processes.procs["edge"] = subprocess.Popen(
                ["sh", "-c", script, venv.bin("geoedge-edge"), str(self.edge_config)],
                pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=venv.home, env=env, start_new_session=True,
            )  # fmt: skip
        finally:
            out.close()
        self.wait_notified("READY=1", deadline)

    @property
    def edge_pid(self) -> int:
        return self.processes.procs["edge"].pid

    @property
    def origin_pid(self) -> int:
        return self.processes.procs["origin"].pid

    def _read_notifications(self) -> None:
        while not self._stopping.is_set():
            try:
                message = self.notify.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.notifications.append((time.monotonic(), message.decode().split("\n")))

    def wait_notified(self, line: str, deadline: float, since: int = 0) -> None:
        while time.monotonic() < deadline:
            if any(line in lines for _, lines in list(self.notifications)[since:]):
                return
            self.check_alive()
            time.sleep(0.05)
        raise StackError(f"the edge never said {line}:\n{tail(self.log('edge'))}")

    def check_alive(self) -> None:
        for name in self.processes.exited():
            code = self.processes.procs[name].returncode
            raise StackError(f"{name} exited with {code}:\n{tail(self.log(name))}")

    def stop(self, grace_s: float = 20.0) -> None:
        self.processes.stop(grace_s)
        self.listener.close()
        self._stopping.set()
        self._reading.join(2)
        self.notify.close()
