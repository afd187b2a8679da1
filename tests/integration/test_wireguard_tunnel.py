"""The WireGuard transport for real: ``geoedge wireguard mesh`` output brought up
with wireguard-go in network namespaces, an origin and an edge over it.

Three namespaces on one machine, joined by veth pairs (the "underlay", what
would be the Internet between regions)::

    edge ns  172.31.250.2 ── 172.31.250.1  origin ns  172.31.250.5 ── 172.31.250.6  outsider ns
    wg 10.99.0.11  ═══ WireGuard (UDP 51820) ═══  wg 10.99.0.1
    edge daemon, client                           origin daemon (tunnel on 10.99.0.1), Node

The configs are the mesh's: its wg-quick files (through ``wg-quick strip`` and
``wg setconf``) and its TOML snippets, pasted into the origin's and the edge's
configs as they are. Checked: a request and a 768 KB body each way through
edge, tunnel inside WireGuard, origin and Node; and that the origin refuses
tunnel connections from outside the WireGuard network, whether they aim at its
underlay address (nothing listens there) or route to its WireGuard address
around WireGuard (admitted by address only from the edges' WireGuard
addresses).

Needs root, ``ip``, wireguard-go (userspace WireGuard: this kernel has no
module) and wireguard-tools, all installed by ``make test``; skips with the
reason where they are missing or wireguard-go cannot run. Interface names
carry this process's id: wireguard-go's control sockets share
/var/run/wireguard across namespaces. Every process and namespace is removed
by PID and name in the fixture's teardown, whatever the outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from geoedge import pki
from tests.edge_env import ROOT, node_available

pytestmark = pytest.mark.slow

TAG = f"{os.getpid() % 100000}"
NS = {role: f"gewg{TAG}-{role}" for role in ("origin", "edge", "outside")}
WG_IF = {"origin": f"gwo{TAG}", "edge": f"gwe{TAG}"}
UNDERLAY = {
    "origin-edge": "172.31.250.1",
    "edge": "172.31.250.2",
    "origin-outside": "172.31.250.5",
    "outside": "172.31.250.6",
}
WG_PORT = 51820
ORIGIN_WG, EDGE_WG = "10.99.0.1", "10.99.0.11"
TUNNEL_PORT = 7443
NODE_PORT = 3001
EDGE_PORT, EDGE_ADMIN, ORIGIN_ADMIN = 8443, 9100, 9901
LARGE_BYTES = 768 * 1024
TIMEOUT_SCALE = float(os.environ.get("GEOEDGE_TEST_TIMEOUT_SCALE", "1"))

#: Runs inside a namespace (``ip netns exec NS python probe.py ...``): the test
#: process itself stays in the host's namespace.
PROBE = textwrap.dedent(
    """
    import hashlib, json, os, socket, ssl, sys, time, urllib.request

    def get(url, context=None, data=None, timeout=10):
        request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
        with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
            return response.status, response.read()

    command = sys.argv[1]
    if command == "wait":
        url, deadline = sys.argv[2], time.monotonic() + float(sys.argv[3])
        while time.monotonic() < deadline:
            try:
                if get(url, timeout=1)[0] == 200:
                    sys.exit(0)
            except OSError:
                pass
            time.sleep(0.1)
        sys.exit(1)
    elif command == "get":
        sys.stdout.write(get(sys.argv[2])[1].decode())
    elif command == "sha256":
        status, body = get(sys.argv[2])
        print(json.dumps({"status": status, "bytes": len(body),
                          "sha256": hashlib.sha256(body).hexdigest()}))
    elif command == "through-edge":
        base, ca = sys.argv[2], sys.argv[3]
        context = ssl.create_default_context(cafile=ca)
        out = {}
        status, body = get(base + "/ip", context)
        out["ip"] = {"status": status, **json.loads(body)}
        status, body = get(base + "/large", context)
        out["large"] = {"status": status, "bytes": len(body),
                        "sha256": hashlib.sha256(body).hexdigest()}
        upload = os.urandom(int(sys.argv[4]))
        status, body = get(base + "/echo", context, data=upload, timeout=30)
        out["echo"] = {"status": status, "bytes": len(body), "same": body == upload}
        print(json.dumps(out))
    elif command == "connect":
        host, port = sys.argv[2], int(sys.argv[3])
        result = {"connected": False, "received": 0, "error": None}
        try:
            with socket.create_connection((host, port), timeout=5) as s:
                result["connected"] = True
                s.settimeout(5)
                while chunk := s.recv(65536):
                    result["received"] += len(chunk)
        except OSError as exc:
            result["error"] = type(exc).__name__
        print(json.dumps(result))
    """
)


def _run(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def _why_not() -> str | None:
    """Why this machine cannot run the test, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "wireguard-go", "wg", "wg-quick"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make test installs wireguard-go and wireguard-tools)"
    if not Path("/dev/net/tun").exists():
        return "no /dev/net/tun: wireguard-go needs a TUN device"
    if not node_available():
        return "deploy/node-app is not installed (make node)"
    return None


@dataclass
class WireguardNet:
    dir: Path
    ca: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)

    def start(self, name: str, ns: str, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kw,  # type: ignore[arg-type]
        )
        log.close()
        self.procs.append(proc)
        return proc

    def probe(self, ns: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return _run(
            "ip", "netns", "exec", ns, sys.executable, str(self.dir / "probe.py"), *args,
            check=False, timeout=timeout * TIMEOUT_SCALE,
        )  # fmt: skip

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Anything else still in our namespaces (a daemon's worker) goes by PID too.
        for ns in self.namespaces:
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "netns", "del", ns, check=False)


def _build_network(net: WireguardNet) -> None:
    for ns in NS.values():
        _run("ip", "netns", "add", ns)
        net.namespaces.append(ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
    links = [
        ("origin", "origin-edge", "edge", "edge", "oe", "eo"),
        ("origin", "origin-outside", "outside", "outside", "ox", "xo"),
    ]
    for left, left_addr, right, right_addr, left_if, right_if in links:
        a, b = f"gw{TAG}{left_if}", f"gw{TAG}{right_if}"
        _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        _run("ip", "link", "set", a, "netns", NS[left])
        _run("ip", "link", "set", b, "netns", NS[right])
        _run("ip", "-n", NS[left], "addr", "add", f"{UNDERLAY[left_addr]}/30", "dev", a)
        _run("ip", "-n", NS[right], "addr", "add", f"{UNDERLAY[right_addr]}/30", "dev", b)
        _run("ip", "-n", NS[left], "link", "set", a, "up")
        _run("ip", "-n", NS[right], "link", "set", b, "up")
    # The outsider can route to the WireGuard network through the origin's
    # underlay address: what an attacker on the origin's network can do.
    ns = NS["outside"]
    _run("ip", "-n", ns, "route", "add", "10.99.0.0/24", "via", UNDERLAY["origin-outside"])


def _mesh(net: WireguardNet) -> tuple[str, str]:
    """``geoedge wireguard mesh``: wg-quick files and the two TOML snippets."""
    result = _run(
        sys.executable, "-m", "geoedge.cli", "wireguard", "mesh",
        "--origin-endpoint", f"{UNDERLAY['origin-edge']}:{WG_PORT}",
        "--origin-ip", ORIGIN_WG, "--edge", f"e1={EDGE_WG}",
        "--tunnel-port", str(TUNNEL_PORT), "--out", str(net.dir / "wg"),
    )  # fmt: skip
    snippets = result.stdout.split("\n\n")
    [origin] = [s for s in snippets if "[tunnel_listener]" in s]
    [edge] = [s for s in snippets if "[[origins]]" in s]
    return origin, edge


def _bring_up_wireguard(net: WireguardNet) -> None:
    files = {"origin": "origin-wg0.conf", "edge": "edge-e1-wg0.conf"}
    addresses = {"origin": ORIGIN_WG, "edge": EDGE_WG}
    for role, conf in files.items():
        ns, ifname = NS[role], WG_IF[role]
        proc = net.start(f"wireguard-go-{role}", ns, ["wireguard-go", "-f", ifname])
        deadline = time.monotonic() + 10
        while not Path(f"/var/run/wireguard/{ifname}.sock").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"wireguard-go cannot run here: {net.log(f'wireguard-go-{role}')}")
            time.sleep(0.05)
        stripped = _run("wg-quick", "strip", str(net.dir / "wg" / conf)).stdout
        (net.dir / f"{role}.wg").write_text(stripped)
        os.chmod(net.dir / f"{role}.wg", 0o600)
        _run("ip", "netns", "exec", ns, "wg", "setconf", ifname, str(net.dir / f"{role}.wg"))
        _run("ip", "-n", ns, "addr", "add", f"{addresses[role]}/24", "dev", ifname)
        # The MTU the mesh writes into the wg-quick file (wg-quick would set it).
        mtu = next(
            line.split("=")[1].strip()
            for line in (net.dir / "wg" / conf).read_text().splitlines()
            if line.startswith("MTU")
        )
        _run("ip", "-n", ns, "link", "set", ifname, "mtu", mtu, "up")


def _write_configs(net: WireguardNet, origin_snippet: str, edge_snippet: str) -> None:
    d = net.dir
    (d / "origin.toml").write_text(
        f"""[origin]
id = "wg-origin"
workers = 1
drain_timeout_s = 2.0

{origin_snippet}

[admin]
address = "127.0.0.1:{ORIGIN_ADMIN}"

[[pools]]
name = "app"
default = true
[pools.health]
path = "/health"
interval_s = 0.5
timeout_s = 0.5
[[pools.backends]]
address = "127.0.0.1:{NODE_PORT}"
"""
    )
    (d / "edge.toml").write_text(
        f"""[edge]
id = "e1"
workers = 1
drain_timeout_s = 2.0
access_log = ""

[[listeners]]
address = "127.0.0.1:{EDGE_PORT}"

[tls]
[[tls.certificates]]
cert = "{d / "server.pem"}"
key = "{d / "server-key.pem"}"

[admin]
address = "127.0.0.1:{EDGE_ADMIN}"

{edge_snippet}
"""
    )


@pytest.fixture(scope="module")
def wg_net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WireguardNet]:
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("wireguard")
    pki.create_ca(directory / "ca")
    pki.issue_server_cert(directory / "ca", directory, "server", ["localhost", "127.0.0.1"])
    net = WireguardNet(directory, directory / "ca" / pki.CA_CERT_FILE)
    (directory / "probe.py").write_text(PROBE)
    try:
        try:
            _build_network(net)
        except RuntimeError as exc:
            pytest.skip(f"cannot build network namespaces here: {exc}")
        origin_snippet, edge_snippet = _mesh(net)
        _bring_up_wireguard(net)
        _write_configs(net, origin_snippet, edge_snippet)
        python = sys.executable
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        node_dir = ROOT / "deploy" / "node-app"
        net.start("node", NS["origin"], ["node", "server.js", str(NODE_PORT)], cwd=node_dir)
        for role in ("origin", "edge"):
            argv = [python, "-m", role, "--config", str(directory / f"{role}.toml")]
            net.start(role, NS[role], argv, cwd=ROOT, env=env)
        healthz = f"http://127.0.0.1:{EDGE_ADMIN}/healthz"
        wait = net.probe(NS["edge"], "wait", healthz, str(30 * TIMEOUT_SCALE))
        assert wait.returncode == 0, (
            f"the edge never had a tunnel up\nedge: {net.log('edge')}\norigin: {net.log('origin')}"
        )
        yield net
    finally:
        net.stop()


def test_mesh_configs_bring_up_a_wireguard_handshake(wg_net: WireguardNet) -> None:
    show = _run("ip", "netns", "exec", NS["edge"], "wg", "show", WG_IF["edge"], "latest-handshakes")
    [(_peer, stamp)] = [line.split() for line in show.stdout.splitlines()]
    assert int(stamp) > 0, "no WireGuard handshake with the origin"
    # The edge reaches the origin's tunnel port only through the WireGuard route.
    route = _run("ip", "-n", NS["edge"], "route", "get", ORIGIN_WG).stdout
    assert f"dev {WG_IF['edge']}" in route


def test_request_and_768_kb_each_way_through_the_wireguard_tunnel(wg_net: WireguardNet) -> None:
    result = wg_net.probe(
        NS["edge"], "through-edge", f"https://127.0.0.1:{EDGE_PORT}", str(wg_net.ca),
        str(LARGE_BYTES),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + wg_net.log("edge")
    out = json.loads(result.stdout)
    assert out["ip"]["status"] == 200
    assert out["ip"]["x_forwarded_for"] == "127.0.0.1"
    assert out["ip"]["backend"] == NODE_PORT
    # The origin's Node.js sees the origin (it forwards), the edge's stream came
    # in over WireGuard: the origin logs the peer by its WireGuard address.
    direct = wg_net.probe(NS["origin"], "sha256", f"http://127.0.0.1:{NODE_PORT}/large")
    expected = json.loads(direct.stdout)
    assert out["large"] == {"status": 200, "bytes": LARGE_BYTES, "sha256": expected["sha256"]}
    assert out["echo"] == {"status": 200, "bytes": LARGE_BYTES, "same": True}
    # The bytes really went through WireGuard: its counters carried them.
    transfer = _run("ip", "netns", "exec", NS["edge"], "wg", "show", WG_IF["edge"], "transfer")
    _, received, sent = transfer.stdout.split()
    assert int(received) > LARGE_BYTES and int(sent) > LARGE_BYTES


def _refusals(net: WireguardNet) -> float:
    metrics = net.probe(NS["origin"], "get", f"http://127.0.0.1:{ORIGIN_ADMIN}/metrics").stdout
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if "edges_refused_total{" in line and 'reason="peer_not_allowed"' in line
    ]
    return sum(values)


def test_origin_refuses_tunnels_from_outside_the_wireguard_network(wg_net: WireguardNet) -> None:
    before = _refusals(wg_net)
    # Aimed at the origin's underlay addresses: nothing listens there.
    for ns, address in [("outside", "origin-outside"), ("edge", "origin-edge")]:
        result = wg_net.probe(NS[ns], "connect", UNDERLAY[address], str(TUNNEL_PORT))
        assert json.loads(result.stdout)["error"] == "ConnectionRefusedError", result.stdout
    # Routed to the WireGuard address around WireGuard: the TCP connection
    # opens (the kernel accepts it on any interface), then the origin drops it
    # unanswered, since the source is not an edge's WireGuard address.
    result = wg_net.probe(NS["outside"], "connect", ORIGIN_WG, str(TUNNEL_PORT))
    attempt = json.loads(result.stdout)
    assert attempt["connected"] and attempt["received"] == 0, attempt
    deadline = time.monotonic() + 5
    while _refusals(wg_net) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _refusals(wg_net) == before + 1
    assert f"{UNDERLAY['outside']}" in wg_net.log("origin")
    # The edge's own tunnel is untouched.
    healthz = f"http://127.0.0.1:{EDGE_ADMIN}/healthz"
    assert wg_net.probe(NS["edge"], "wait", healthz, "5").returncode == 0
