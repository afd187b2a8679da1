"""The WAN emulator end to end: real namespaces, the real NFQUEUE delay process, real TCP.

An echo server runs in ``origin`` and in ``edge``, a client in ``user``; the
client measures TCP connect time (one round trip: SYN, SYN-ACK) and small echo
round trips, which must match the configured delays plus the delay process's
overhead (~0.3 ms per pass). Skipped where the emulator cannot run (not root, no
netns/iptables/NFQUEUE, no netfilterqueue module).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loadtests.wan import netns
from loadtests.wan.emulator import WanEmulator, unsupported_reason

pytestmark = pytest.mark.timeout(90)

REPO_ROOT = Path(__file__).resolve().parents[2]
PORT = 7007

# TCP and UDP echo on PORT; prints "ready", then the congestion control of each
# accepted connection. Exits by itself after 60 s so nothing can outlive a test.
SERVER = textwrap.dedent(
    """
    import socket, sys, threading
    threading.Timer(60, lambda: __import__("os")._exit(0)).start()
    tcp = socket.create_server((sys.argv[1], int(sys.argv[2])))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((sys.argv[1], int(sys.argv[2])))
    def udp_echo():
        while True:
            data, peer = udp.recvfrom(2048)
            udp.sendto(data, peer)
    def tcp_echo(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)
    threading.Thread(target=udp_echo, daemon=True).start()
    print("ready", flush=True)
    while True:
        conn, _ = tcp.accept()
        cc = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
        print(cc.rstrip(b"\\0").decode(), flush=True)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=tcp_echo, args=(conn,), daemon=True).start()
    """
)

# argv: host port connects echoes udp_count. Prints one JSON line of timings in ms.
CLIENT = textwrap.dedent(
    """
    import json, socket, sys, time
    host, port, connects, echoes, udp_count = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:])
    out = {"connect_ms": [], "echo_ms": []}
    for _ in range(connects):
        t = time.perf_counter()
        s = socket.create_connection((host, port), timeout=5)
        out["connect_ms"].append((time.perf_counter() - t) * 1e3)
        cc = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
        out["congctl"] = cc.rstrip(b"\\0").decode()
        s.close()
    s = socket.create_connection((host, port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for i in range(echoes):
        t = time.perf_counter()
        s.sendall(b"ping %d" % i)
        s.recv(100)
        out["echo_ms"].append((time.perf_counter() - t) * 1e3)
    s.close()
    if udp_count:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for i in range(udp_count):
            u.sendto(b"u%d" % i, (host, port))
            time.sleep(0.001)
        u.settimeout(3.0)  # stragglers only delay the end: a busy host must not drop them
        got = set()
        try:
            while len(got) < udp_count:
                got.add(u.recv(100))
        except socket.timeout:
            pass
        out["udp_received"] = len(got)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def wan_supported() -> None:
    reason = unsupported_reason()
    if reason is not None:
        pytest.skip(f"WAN emulator unavailable: {reason}")


def start_server(wan: WanEmulator, host: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", SERVER, wan.address(host), str(PORT)]
    proc = wan.popen(host, argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10.0)
    assert ready and proc.stdout.readline().strip() == "ready", f"echo server in {host} failed"
    return proc


def measure(
    wan: WanEmulator, host: str, connects: int = 3, echoes: int = 5, udp: int = 0
) -> dict[str, list[float] | str | int]:
    argv = [sys.executable, "-c", CLIENT, wan.address(host), str(PORT)]
    argv += [str(connects), str(echoes), str(udp)]
    done = subprocess.run(
        wan.exec_argv("user", argv), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def gone(pid: int | str | None) -> bool:
    """True once ``pid`` has exited (a zombie waiting for init to reap it counts as gone)."""
    return pid is not None and not netns._running(int(pid))


def test_defaults_give_the_configured_round_trips_and_teardown_is_complete(
    wan_supported: None,
) -> None:
    with WanEmulator() as wan:
        tag, delay_pid = wan.tag, wan.delay_pid
        assert wan.floor_ms("user", "origin") == 265.0
        assert wan.floor_ms("user", "edge") == 10.0
        servers = [start_server(wan, "origin"), start_server(wan, "edge")]

        far, near = measure(wan, "origin"), measure(wan, "edge")
        print(f"user-origin {far}\nuser-edge {near}\nstats {wan.statistics()['late_mean_us']} us")
        # The emulator's accuracy is the point, so these are bounds; each is
        # taken on the fastest of several round trips, because load on the host
        # only ever adds delay: a systematic error still shows, a busy moment not.
        assert 255 <= min(far["connect_ms"]) <= 300, far
        assert 255 <= min(far["echo_ms"]) <= 300, far
        assert 9 <= min(near["connect_ms"]) <= 25, near
        assert 9 <= min(near["echo_ms"]) <= 25, near
        # The namespaces' default is the host's (BBR here); the routes pin cubic.
        assert far["congctl"] == near["congctl"] == "cubic"
        for server in servers:
            assert server.stdout is not None
            assert server.stdout.readline().strip() == "cubic"

        # Changing a pair at run time reaches the delay process.
        wan.set_pair("user", "edge", delay_ms=25)
        assert wan.floor_ms("user", "edge") == 50.0
        slower = measure(wan, "edge", connects=1, echoes=3)
        assert 48 <= min(slower["echo_ms"]) <= 70, slower

        # 25% loss each way: about 0.75**2 of UDP echoes come back.
        wan.set_pair("user", "edge", delay_ms=5, loss=0.25)
        lossy = measure(wan, "edge", connects=0, echoes=0, udp=200)
        assert 0.40 <= lossy["udp_received"] / 200 <= 0.72, lossy
        assert wan.statistics()["links"]["user>edge"]["dropped_loss"] > 0
        server_pids = [s.pid for s in servers]

    assert not [ns for ns in netns.namespaces() if ns.startswith(f"gewan-{tag}-")]
    assert not (netns.STATE_DIR / f"{tag}.json").exists()
    for pid in [delay_pid, *server_pids]:
        assert gone(pid), pid


OWNER = textwrap.dedent(
    """
    import sys, time
    from loadtests.wan.emulator import WanEmulator
    wan = WanEmulator().up()
    print(wan.tag, wan.delay_pid, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_nothing_outlives_a_killed_owner(wan_supported: None, sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert owner.stdout is not None
        ready, _, _ = select.select([owner.stdout], [], [], 15.0)
        assert ready, "owner did not bring the WAN up"
        tag, delay_pid = owner.stdout.readline().split()
        owner.send_signal(sig)
        owner.wait(timeout=10)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()

    deadline = time.monotonic() + 5.0  # the delay process dies with its owner
    while not gone(delay_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(delay_pid)
    if sig == signal.SIGKILL:  # no handler could run: the next start reaps the instance
        assert netns.read_state(tag) in (None, {}) or not netns.owner_alive(netns.read_state(tag))
        netns.reap_stale()  # (a concurrent emulator start may have reaped it already)
    assert not [ns for ns in netns.namespaces() if ns.startswith(f"gewan-{tag}-")]
    assert not (netns.STATE_DIR / f"{tag}.json").exists()
