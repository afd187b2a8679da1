"""What a supervisor hands to itself across execve (geoedge.reexec): the record
and its trip through the environment, and a real exec of a real process that
keeps exactly the descriptors the record names."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from geoedge.listening import HELD_ENV, check_bindable, held_address
from geoedge.preflight import PreflightError
from geoedge.reexec import ENV, Inheritance, InheritedSocket, own_command, take_inheritance
from geoedge.reload_check import check_command
from geoedge.workers import AdoptedWorker
from origin.config import load_origin_config
from origin.state import ControlState
from tests.conftest import scaled
from tests.unit.test_origin_config import MINIMAL

ROOT = Path(__file__).resolve().parents[2]


def test_the_record_survives_its_trip_through_the_environment() -> None:
    record = Inheritance(
        pid=os.getpid(),
        sockets=(InheritedSocket(5, "systemd", "https"), InheritedSocket(9, "admin", "[admin]")),
        workers=(AdoptedWorker(123, 0, 11, 12, False), AdoptedWorker(124, 1, 13, -1, True, 99.5)),
        replies=(14,),
        metrics_dir="/tmp/m",
        requested_at=12.25,
        state={"drained": [["web", "10.0.0.1:3000"]]},
    )
    env = {ENV: record.encode()}
    assert take_inheritance(env) == record
    assert ENV not in env  # taken once: nothing forked later sees it
    assert record.fds() == [5, 9, 14, 11, 12, 13]
    assert [s.name for s in record.of_role("admin")] == ["[admin]"]


def test_a_record_meant_for_another_process_is_dropped() -> None:
    env = {ENV: Inheritance(pid=os.getpid() + 1).encode()}
    assert take_inheritance(env) is None
    assert ENV not in env
    assert take_inheritance({}) is None


def test_an_exec_keeps_the_named_descriptors_and_closes_the_rest(tmp_path: Path) -> None:
    """A process opens a listening socket and a socket it does not name, then
    re-executes itself with reexec(): the new image finds the named one, still
    listening (a client connected before the exec is accepted after it), and
    not the other."""
    script = tmp_path / "image.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, socket, sys
            sys.path.insert(0, {str(ROOT)!r})
            from geoedge.reexec import Inheritance, InheritedSocket, reexec, take_inheritance
            inherited = take_inheritance()
            if inherited is None:
                listener = socket.create_server(("127.0.0.1", 0))
                stray = socket.socket()
                print(json.dumps({{"port": listener.getsockname()[1],
                                  "stray": os.fstat(stray.fileno()).st_ino,
                                  "pid": os.getpid()}}), flush=True)
                sys.stdin.readline()  # the test connects a client now
                kept = InheritedSocket(listener.fileno(), "bound", "x")
                reexec(Inheritance(os.getpid(), (kept,)))
            (kept,) = inherited.sockets
            listener = kept.take()
            listener.setblocking(True)
            client, _ = listener.accept()
            client.sendall(b"after the exec")
            inodes = []
            for name in os.listdir("/proc/self/fd"):
                try:
                    inodes.append(os.fstat(int(name)).st_ino)
                except OSError:  # listdir's own
                    pass
            print(json.dumps({{"pid": os.getpid(), "inodes": inodes,
                              "kept": os.fstat(kept.fd).st_ino}}), flush=True)
            """
        )
    )
    process = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        first = json.loads(process.stdout.readline())
        client = socket.create_connection(("127.0.0.1", first["port"]), timeout=scaled(10))
        process.stdin.write("go\n")
        process.stdin.flush()
        second = json.loads(process.stdout.readline())
        assert client.recv(100) == b"after the exec"
        client.close()
    finally:
        process.kill()
        process.wait()
    assert second["pid"] == first["pid"]  # in place: the same process
    assert second["kept"] in second["inodes"]
    assert first["stray"] not in second["inodes"]  # not named: closed at the exec


# The loader's minimal config, with a health check and a second backend.
TWO_CHECKED = (
    MINIMAL
    + """
[pools.health]
path = "/health"
fall = 3
[[pools.backends]]
address = "127.0.0.1:3002"
"""
)


def test_drains_and_down_backends_are_carried_across_a_reload(tmp_path: Path) -> None:
    path = tmp_path / "origin.toml"
    path.write_text(TWO_CHECKED)
    config = load_origin_config(path)
    before = ControlState(config, now=0.0)
    before.set_drained("web", "127.0.0.1:3001", True)
    for _ in range(3):
        before.observe_health("web", "127.0.0.1:3002", False, now=1.0)
    assert before.usable_backends() == 0
    carried = json.loads(json.dumps(before.carried()))  # as the environment carries it

    after = ControlState(config, now=5.0)
    assert after.usable_backends() == 2  # a fresh one trusts every backend ...
    after.restore(carried)
    assert after.usable_backends() == 0  # ... the reloaded one knows better
    (snapshot,) = after.snapshots()
    specs = {b.address: b for b in snapshot.backends}
    assert specs["127.0.0.1:3001"].drained and specs["127.0.0.1:3001"].healthy
    assert not specs["127.0.0.1:3002"].healthy and not specs["127.0.0.1:3002"].drained
    # A recovered backend comes back through its checks, as before the reload.
    rise = config.pools[0].health.rise  # type: ignore[union-attr]
    for _ in range(rise):
        assert not after.healthy("web", "127.0.0.1:3002")
        after.observe_health("web", "127.0.0.1:3002", True, now=6.0)
    assert after.healthy("web", "127.0.0.1:3002")
    after.restore({"drained": "not a list", "down": [["web"], [1, 2]]})  # ignored, not fatal


def test_a_reload_check_binds_only_what_the_daemon_does_not_hold() -> None:
    """The new config's addresses are tried before the exec: the ones the
    running supervisor holds are skipped, one taken by someone else fails,
    naming its setting; a plain --check (no HELD_ENV) binds nothing."""
    held = socket.create_server(("127.0.0.1", 0))
    taken = socket.create_server(("127.0.0.1", 0))
    free = socket.create_server(("127.0.0.1", 0))
    free_address = f"127.0.0.1:{free.getsockname()[1]}"
    free.close()
    held_address_text = held_address(held)
    taken_address = f"127.0.0.1:{taken.getsockname()[1]}"
    wanted = [
        ("[[listeners]] address", held_address_text),
        ("[admin] address", free_address),
        ("[redirect] address", taken_address),
    ]
    try:
        check_bindable(wanted, env={})  # not a reload: nothing tried
        with pytest.raises(PreflightError) as caught:
            check_bindable(wanted, env={HELD_ENV: held_address_text})
        assert caught.value.problems == [
            f"[redirect] address {taken_address}: Address already in use"
        ]
        check_bindable(wanted[:2], env={HELD_ENV: held_address_text})
    finally:
        held.close()
        taken.close()


def test_a_supervisor_started_as_a_script_runs_the_script_again(tmp_path: Path) -> None:
    """``/usr/local/bin/geoedge-edge`` resolves through a release link: the
    re-exec must run the script (its #! line read again, the release now
    current), not this process's interpreter with the script as argument."""
    script = tmp_path / "geoedge-edge"
    script.write_text("#!/opt/geoedge/releases/next/venv/bin/python\n")
    script.chmod(0o755)
    started = ["/opt/geoedge/releases/old/venv/bin/python", str(script), "--config", "e.toml"]
    assert own_command(started) == [str(script), "--config", "e.toml"]
    module = ["python3", "-m", "edge", "--config", "e.toml"]
    assert own_command(module) == [sys.executable, "-m", "edge", "--config", "e.toml"]
    not_a_script = tmp_path / "data"
    not_a_script.write_text("x")
    assert own_command(["py", str(not_a_script)]) == [sys.executable, str(not_a_script)]
    assert check_command(started) == [str(script), "--config", "e.toml", "--check"]
