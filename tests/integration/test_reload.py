"""``systemctl reload`` of the real daemons (geoedge.reload), by its unit's own
``ExecReload=`` line with ``$MAINPID``, and by SIGHUP.

PID 1 on this machine is not systemd, so systemd itself does not run the
units here: the tests run the command line of the shipped unit's
``ExecReload=`` (its binary and config retargeted to the checkout) and listen
on a notify socket of their own (``NOTIFY_SOCKET``), as systemd's would, for
``RELOADING=1``, ``READY=1`` and ``MAINPID=``. Everything is counted: clients
that failed, workers replaced, descriptors held; no timing is asserted.
``make reload-test`` runs the same under heavier load, with a second build of
the package installed in a venv."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtests.reload_stack import exec_reload as run_exec_reload
from loadtests.reload_stack import worker_versions
from tests.conftest import PkiFiles, scaled
from tests.edge_env import ROOT, Stack, edge_stack, node_available
from tests.integration.test_edge_lose_nothing import ws_frame
from tests.integration.test_edge_websocket_drain import open_websocket
from tests.integration.test_systemd import NotifySocket

pytestmark = pytest.mark.skipif(not node_available(), reason="run `make node` first")


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def exec_reload(role: str, config: Path, pid: int) -> subprocess.CompletedProcess[str]:
    """The unit's ``ExecReload=`` as systemd runs it, ``$MAINPID`` = ``pid``, its
    command from this interpreter's venv, the checkout's code."""
    return run_exec_reload(
        role, bin_dir=Path(sys.executable).parent, config=config, pid=pid, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout_s=scaled(150),
    )  # fmt: skip


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        path = Path(f"/proc/{pid}/task/{task}/children")
        if path.exists():
            found |= {int(p) for p in path.read_text().split()}
    return found


def wait_for(condition: object, what: str | Callable[[], str], timeout: float = 60) -> None:
    """Until ``condition()``; ``what`` says what did not happen (called then,
    when it is a function: what was seen last)."""
    deadline = time.monotonic() + scaled(timeout)
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what if isinstance(what, str) else what()
        time.sleep(0.1)


def fetch(port: int, method: str, path: str) -> tuple[int, bytes]:
    """One request to an admin listener (a connection of its own: a reload
    closes the old supervisor's keep-alive connections)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def admin(port: int, method: str, path: str) -> dict[str, Any]:
    status, body = fetch(port, method, path)
    assert status == 200, (status, body)
    answer: dict[str, Any] = json.loads(body)
    return answer


class Clients:
    """Requests one after the other, a connection each, from ``threads``
    threads until :meth:`stop` (or ``limit`` in all): how many succeeded and
    what every other one got. :meth:`_request` makes one: None when it
    succeeded, else what went wrong."""

    def __init__(self, threads: int, limit: int) -> None:
        self.ok = 0
        self.failures: list[str] = []
        self._limit = limit
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for thread in self._threads:
            thread.start()

    def _request(self) -> str | None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set() and self.ok + len(self.failures) < self._limit:
            try:
                failure = self._request()
            except (OSError, http.client.HTTPException) as exc:
                failure = repr(exc)
            with self._lock:
                if failure is None:
                    self.ok += 1
                else:
                    self.failures.append(failure)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(scaled(60))


class Load(Clients):
    """New TLS connections (``GET /``, ``Connection: close``) from two threads."""

    def __init__(self, stack: Stack, limit: int = 20_000) -> None:
        self.port = stack.https_port
        self.context = ssl.create_default_context(cafile=str(stack.pki.ca))
        super().__init__(threads=2, limit=limit)

    def _request(self) -> str | None:
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=scaled(30)) as raw,
            self.context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
        status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/1.1 ") else answer
        return None if status == b"200" else repr(answer[:60])


class AdminLoad(Clients):
    """``GET /metrics`` on an admin listener from three threads. A reload must
    not cut one in progress (the supervisor that answers re-executes)."""

    def __init__(self, port: int, limit: int = 5_000) -> None:
        self.port = port
        super().__init__(threads=3, limit=limit)

    def _request(self) -> str | None:
        status, body = fetch(self.port, "GET", "/metrics")
        if status == 200 and b"geoedge_build_info" in body:
            return None
        return f"{status} {body[:60]!r}"


class Sockets:
    """WebSockets held open; each one the edge closes is answered, reconnected
    and echoed once more."""

    def __init__(self, stack: Stack, count: int) -> None:
        self.stack = stack
        self.codes: list[int] = []
        self.reconnected = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)
        ]
        self._opened = threading.Semaphore(0)
        for thread in self._threads:
            thread.start()
        for _ in range(count):
            assert self._opened.acquire(timeout=scaled(30)), "a WebSocket did not open"

    def _run(self, index: int) -> None:
        try:
            tls, reader = open_websocket(self.stack, index)
            self._opened.release()
            opcode, payload = reader.read_frame()
            while opcode != 0x8:
                opcode, payload = reader.read_frame()
            code = int.from_bytes(payload[:2], "big")
            tls.sendall(ws_frame(0x8, payload[:2]))  # type: ignore[attr-defined]
            tls.close()  # type: ignore[attr-defined]
            again, _ = open_websocket(self.stack, 1000 + index)
            again.close()  # type: ignore[attr-defined]
            with self._lock:
                self.codes.append(code)
                self.reconnected += 1
        except (OSError, AssertionError) as exc:
            with self._lock:
                self.failures.append(repr(exc))

    def join(self) -> None:
        for thread in self._threads:
            thread.join(scaled(90))


def ready_count(notify: NotifySocket) -> int:
    return sum("READY=1" in lines for _, lines in list(notify.messages))


def test_a_reload_under_load_replaces_every_worker_and_fails_no_client(
    test_pki: PkiFiles, tmp_path: Path, notify: NotifySocket
) -> None:
    keys = "drain_websocket_window_s = 2.0\n"
    env = {"NOTIFY_SOCKET": str(notify.path)}
    with edge_stack(test_pki, tmp_path, workers=2, edge_keys=keys, edge_env=env) as stack:
        notify.wait_for("READY=1")
        pid = stack.edge.pid
        old = children(pid)
        sockets = Sockets(stack, 6)
        load = Load(stack)
        scrapes = AdminLoad(stack.admin_port)
        wait_for(lambda: load.ok >= 20, "no load got through before the reload")
        before_reload, scraped_before = load.ok, scrapes.ok
        done = exec_reload("edge", tmp_path / "edge.toml", pid)
        after_reload = load.ok
        sockets.join()
        wait_for(lambda: len(children(pid)) == 2, "the old workers never left")
        wait_for(lambda: scrapes.ok > scraped_before + 5, "the admin listener never answered")
        load.stop()
        scrapes.stop()
        new = children(pid)
        versions = worker_versions(stack.admin_port)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1].startswith("geoedge-edge: ok version "), done.stderr
    assert after_reload > before_reload  # clients were served during the reload ...
    assert load.failures == []  # ... and none failed, before, during or after
    assert scrapes.failures == []  # nor a scrape of /metrics the exec was serving
    assert not new & old and len(new) == 2  # fresh workers only
    assert set(versions) == new  # each one's build_info, and no old one's left
    assert sockets.failures == [] and sockets.codes == [1001] * 6 and sockets.reconnected == 6
    # sd_notify: RELOADING=1 (with the monotonic time), then READY=1 naming the
    # main process, which is the same one (the supervisor re-executed in place).
    (reloading,) = [lines for _, lines in notify.messages if "RELOADING=1" in lines]
    assert any(line.startswith("MONOTONIC_USEC=") for line in reloading)
    readies = [lines for _, lines in notify.messages if "READY=1" in lines]
    assert len(readies) == 2 and f"MAINPID={pid}" in readies[1]
    assert any(line.startswith("STATUS=reload ok") for line in readies[1])


def test_a_broken_config_is_refused_naming_key_and_file_and_the_workers_serve_on(
    test_pki: PkiFiles, tmp_path: Path, notify: NotifySocket
) -> None:
    env = {"NOTIFY_SOCKET": str(notify.path)}
    with edge_stack(test_pki, tmp_path, workers=2, edge_env=env) as stack:
        notify.wait_for("READY=1")
        pid, config = stack.edge.pid, tmp_path / "edge.toml"
        workers = children(pid)
        good = config.read_text()
        config.write_text(good.replace("[edge]\n", "[edge]\ndrain_timeout = 5\n", 1))
        load = Load(stack)
        wait_for(lambda: load.ok >= 5, "no load got through before the reload")
        done = exec_reload("edge", config, pid)
        # SIGHUP (kill -HUP) takes the same path: refused, once more.
        os.kill(pid, signal.SIGHUP)
        wait_for(lambda: ready_count(notify) == 3, "the SIGHUP reload did not end")
        served_after = load.ok
        wait_for(lambda: load.ok > served_after, "the old workers stopped serving")
        load.stop()
        assert children(pid) == workers  # nothing replaced
        log = stack.log.read_text()
    assert done.returncode == 2, done.stdout + done.stderr
    reason = done.stderr.splitlines()[-1]
    assert reason.startswith("geoedge-edge: refused "), done.stderr
    assert str(config) in reason and "drain_timeout" in reason
    assert load.failures == []
    refused = [line for line in log.splitlines() if "reload refused" in line]
    assert len(refused) == 2 and all("drain_timeout" in line for line in refused)
    ready = [lines for _, lines in notify.messages if "READY=1" in lines][1]
    assert any(line.startswith("STATUS=reload refused") for line in ready)


def write_distribution(site: Path, version: str) -> None:
    """What ``pip install`` leaves for geoedge's metadata: a dist-info directory
    (the code itself stays the checkout's)."""
    for old in site.glob("geoedge-*.dist-info"):
        for path in old.iterdir():
            path.unlink()
        old.rmdir()
    info = site / f"geoedge-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: geoedge\nVersion: {version}\n")


def test_each_worker_reports_the_version_it_runs_and_reloads_leave_nothing_behind(
    test_pki: PkiFiles, tmp_path: Path, notify: NotifySocket
) -> None:
    """The version comes from the package metadata the supervisor read when it
    started: a reload (a fresh interpreter) reports what is installed then; a
    worker restarted before the reload runs, and reports, the code of before.
    Reload after reload, the supervisor holds as many descriptors as before
    and no process is left over."""
    site = tmp_path / "site"
    write_distribution(site, "7.0.0")
    env = {"NOTIFY_SOCKET": str(notify.path), "PYTHONPATH": f"{site}:{ROOT}"}
    with edge_stack(test_pki, tmp_path, workers=2, edge_env=env) as stack:
        notify.wait_for("READY=1")
        pid = stack.edge.pid
        wait_for(lambda: len(worker_versions(stack.admin_port)) == 2, "no build_info")
        assert set(worker_versions(stack.admin_port).values()) == {"7.0.0"}
        write_distribution(site, "7.1.0")  # installed, not yet reloaded
        crashed = min(children(pid))
        os.kill(crashed, signal.SIGKILL)
        wait_for(lambda: len(children(pid) - {crashed}) == 2, "the worker was not restarted")
        wait_for(lambda: len(worker_versions(stack.admin_port)) == 2, "no restarted series")
        assert set(worker_versions(stack.admin_port).values()) == {"7.0.0"}

        fds: list[int] = []
        for n in range(4):
            done = exec_reload("edge", tmp_path / "edge.toml", pid)
            assert done.returncode == 0, done.stdout + done.stderr
            wait_for(lambda: len(children(pid)) == 2, "the old workers never left")
            fds.append(len(os.listdir(f"/proc/{pid}/fd")))
            versions = worker_versions(stack.admin_port)
            assert set(versions) == children(pid) and set(versions.values()) == {"7.1.0"}, n
        assert stack.get("/")[0] == 200
        workers = children(pid)
        stack.edge.send_signal(signal.SIGTERM)
        assert stack.edge.wait(scaled(60)) == 0
    assert fds == [fds[0]] * 4, fds  # no descriptor piles up over reloads
    assert not [p for p in workers if Path(f"/proc/{p}").exists()]  # nobody left over


def test_an_origin_reload_moves_websockets_with_1012_and_keeps_drains(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    """The origin's ExecReload=: new origin workers; the edge closes each
    WebSocket on a tunnel connection told to go away with 1012 (its client
    reconnects), requests go on, and a backend drained by the admin stays
    drained in the new workers."""
    keys = "drain_websocket_window_s = 2.0\n"
    with edge_stack(test_pki, tmp_path, workers=1, nodes=2, edge_keys=keys) as stack:
        assert stack.origin is not None
        origin_pid = stack.origin.pid
        old = children(origin_pid)
        pools = admin(stack.origin_admin_port, "GET", "/backends")
        ((pool, backends),) = pools.items()
        drained = sorted(backends)[0]
        assert admin(stack.origin_admin_port, "POST", f"/backends/{pool}/{drained}/drain")
        sockets = Sockets(stack, 4)
        load = Load(stack)
        scrapes = AdminLoad(stack.origin_admin_port)
        wait_for(lambda: load.ok >= 10, "no load got through before the reload")
        done = exec_reload("origin", tmp_path / "origin.toml", origin_pid)
        scraped = scrapes.ok
        sockets.join()
        wait_for(lambda: not children(origin_pid) & old, "the old origin workers never left")
        wait_for(lambda: scrapes.ok > scraped + 5, "the origin's admin never answered")
        load.stop()
        scrapes.stop()
        after = admin(stack.origin_admin_port, "GET", "/backends")[pool]
    assert done.returncode == 0, done.stdout + done.stderr
    assert load.failures == [] and load.ok > 10
    assert scrapes.failures == []  # the exec cut no scrape of the origin's /metrics
    assert sockets.failures == [] and sockets.codes == [1012] * 4 and sockets.reconnected == 4
    assert after[drained]["drained"] is True
