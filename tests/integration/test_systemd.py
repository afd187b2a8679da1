"""The daemons under systemd's two protocols, the way systemd runs them: a
notify socket the test owns (READY, STATUS, WATCHDOG, RELOADING, STOPPING and
when they came), and listening sockets passed by ``systemd-socket-activate``
(LISTEN_FDS), which keep connections queued while no process accepts."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PkiFiles, scaled
from tests.edge_env import ROOT, edge_stack, node_available, write_edge_config
from tests.polling import wait_until
from tests.tunnel_env import free_port

pytestmark = pytest.mark.skipif(not node_available(), reason="run `make node` first")


class NotifySocket:
    """A datagram socket standing where systemd's would: records each message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode().split("\n")))

    def lines(self) -> list[str]:
        return [line for _, lines in list(self.messages) for line in lines]

    def wait_for(self, line: str, timeout: float = 20) -> float:
        """When ``line`` first came (waits for it)."""
        deadline = time.monotonic() + scaled(timeout)
        while True:
            for at, lines in list(self.messages):
                if line in lines:
                    return at
            assert time.monotonic() < deadline, f"no {line!r} in {self.lines()}"
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def test_the_edge_is_ready_once_a_tunnel_is_up_pets_the_watchdog_and_says_what_it_does(
    test_pki: PkiFiles, tmp_path: Path, notify: NotifySocket
) -> None:
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000"}
    with edge_stack(test_pki, tmp_path, edge_env=env) as stack:
        ready_at = notify.wait_for("READY=1")
        (ready,) = [lines for at, lines in notify.messages if "READY=1" in lines]
        status = next(line for line in ready if line.startswith("STATUS="))
        assert "tunnels up: origin-a" in status, ready  # READY came with a tunnel up
        # Before it, the edge said what it was waiting for (the origin starts after it).
        before = [line for at, lines in notify.messages if at < ready_at for line in lines]
        assert any("waiting for origin-a" in line for line in before), notify.lines()

        # WatchdogSec=2: pets while the workers live (every second: half of
        # WATCHDOG_USEC, tests/unit/test_systemd_notifier.py).
        wait_until(lambda: notify.lines().count("WATCHDOG=1") >= 2, notify.lines)

        # A reload is bracketed by RELOADING=1 (with the monotonic time) and READY=1.
        count = len(notify.messages)
        os.kill(stack.edge.pid, signal.SIGHUP)
        notify.wait_for("RELOADING=1")
        wait_until(
            lambda: any("READY=1" in lines for _, lines in notify.messages[count:]), notify.lines
        )
        reloading = next(lines for _, lines in notify.messages[count:] if "RELOADING=1" in lines)
        assert any(line.startswith("MONOTONIC_USEC=") for line in reloading)

        stack.edge.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1")
        assert stack.edge.wait(scaled(30)) == 0
    # The workers never spoke for the service: one sender, the supervisor.
    assert notify.lines().count("READY=1") == 2


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None, reason="systemd: make test installs it"
)
def test_a_socket_passed_by_systemd_is_served_and_queues_clients_until_the_edge_runs(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    https_port = free_port()
    (tmp_path / "first").mkdir()
    with edge_stack(test_pki, tmp_path / "first") as stack:
        # A second edge on its own port, started as systemd would on the first
        # connection: systemd-socket-activate listens, then execs the edge with
        # the socket as descriptor 3.
        config = write_edge_config(
            tmp_path / "activated.toml",
            test_pki,
            https_port=https_port,
            admin_port=free_port(),
            origins=[("origin-a", stack.origin_port)],
        )
        log = tmp_path / "activated.log"
        with log.open("wb") as out:
            activator = subprocess.Popen(
                [
                    "systemd-socket-activate",
                    f"--listen=127.0.0.1:{https_port}",
                    "--fdname=https",
                    sys.executable, "-m", "edge", "--config", str(config), "--log-format", "plain",
                ],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
        try:
            deadline = time.monotonic() + scaled(30)
            while True:  # the activator's socket is listening before any edge runs
                try:
                    raw = socket.create_connection(("127.0.0.1", https_port), timeout=scaled(20))
                    break
                except ConnectionRefusedError:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.05)
            context = ssl.create_default_context(cafile=str(test_pki.ca))
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"GET /ip HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                answer = b""
                while chunk := tls.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
            text = log.read_text()
            assert f"listening on 127.0.0.1:{https_port}: socket 'https' from systemd" in text
        finally:
            activator.send_signal(signal.SIGTERM)
            activator.wait(scaled(30))


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None, reason="systemd: make test installs it"
)
def test_a_passed_socket_no_listener_wants_is_a_clear_error(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    stray, https_port = free_port(), free_port()
    config = write_edge_config(
        tmp_path / "edge.toml",
        test_pki,
        https_port=https_port,
        admin_port=free_port(),
        origins=[("origin-a", free_port())],
    )
    activator = subprocess.Popen(
        [
            "systemd-socket-activate", f"--listen=127.0.0.1:{stray}", "--fdname=stray",
            sys.executable, "-m", "edge", "--config", str(config), "--log-format", "plain",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + scaled(30)
        while True:
            try:
                socket.create_connection(("127.0.0.1", stray), timeout=scaled(10)).close()
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        output, _ = activator.communicate(timeout=scaled(30))
    finally:
        if activator.poll() is None:
            activator.kill()
    assert activator.returncode == 1
    assert f"socket activation stray (127.0.0.1:{stray}): no listener in the config" in (
        output.decode()
    )


def test_the_origin_takes_its_tunnel_listener_from_systemd_and_notifies(
    test_pki: PkiFiles, tmp_path: Path, notify: NotifySocket
) -> None:
    (tmp_path / "stack").mkdir()
    with edge_stack(test_pki, tmp_path / "stack", backend_port=free_port()) as stack:
        stack.stop_origin()
        # The same origin config, started by systemd-socket-activate on the edge's
        # first tunnel dial: the edge's tunnel comes up through the passed socket.
        config = next(tmp_path.glob("stack/origin.toml"))
        log = tmp_path / "origin-activated.log"
        with log.open("wb") as out:
            activator = subprocess.Popen(
                [
                    "systemd-socket-activate", f"--listen=127.0.0.1:{stack.origin_port}",
                    "--fdname=tunnel", f"--setenv=NOTIFY_SOCKET={notify.path}",
                    sys.executable, "-m", "origin", "--config", str(config),
                ],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
        try:
            ready = notify.wait_for("READY=1", timeout=30)
            assert ready
            assert any("workers;" in line for line in notify.lines()), notify.lines()
            text = log.read_text()
            assert f"listening on 127.0.0.1:{stack.origin_port}: socket 'tunnel'" in text
            os.kill(activator.pid, signal.SIGHUP)
            notify.wait_for("RELOADING=1")
            activator.send_signal(signal.SIGTERM)
            notify.wait_for("STOPPING=1")
            assert activator.wait(scaled(30)) == 0
        finally:
            if activator.poll() is None:
                activator.kill()
