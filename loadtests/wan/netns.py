"""Creating, finding and removing the emulator's network namespaces (iproute2, iptables).

Everything the emulator creates lives in network namespaces named
``gewan-<tag>-<host>``: the veth pairs are created directly inside them (never
in the host's namespace), the routes, sysctls and the iptables rule are
per-namespace, and the only processes in them are ones we started. So removing
an instance is: kill the PIDs ``ip netns pids`` lists in its namespaces, then
``ip netns del`` each one; the kernel destroys the veths with the last
namespace that holds them.

Crash safety: before creating any namespace, an instance writes
``/run/gewan/<tag>.json`` with its owner's PID and that process's start time
(so a recycled PID is not mistaken for the owner). :func:`reap_stale` removes
instances whose owner is gone; every new emulator calls it, and
``python -m loadtests.wan.emulator down`` removes all instances.

TCP congestion control: the host defaults to BBR and a namespace cannot choose
its own default, but a route can (``congctl``), and a route's choice beats the
default. Every IPv4 route in every namespace gets one, and IPv6 is switched off
in the namespaces so no route is left without it (dual-stack ``::`` listeners
still accept IPv4). :func:`routes_without_congctl` checks that.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtests.wan.topology import ADDRESSES, HOSTS, LINK_NUMBERS, ROUTER, ROUTER_ADDRESSES

__all__ = [
    "HOST_IFNAME",
    "PREFIX",
    "STATE_DIR",
    "WanSetupError",
    "build_topology",
    "destroy_instance",
    "instances",
    "namespace_pids",
    "ns_name",
    "reap_stale",
    "router_ifname",
    "routes_without_congctl",
]

PREFIX = "gewan"
STATE_DIR = Path("/run/gewan")
#: Each host's side of its veth pair (names only need to be unique per namespace).
HOST_IFNAME = "wan0"
_NS_RE = re.compile(rf"^{PREFIX}-([a-z0-9]+)-({'|'.join((*HOSTS, ROUTER))})$")
_TAG_RE = re.compile(r"^[a-z0-9]{1,20}$")

#: Set in every host namespace before callers' sysctls. Generous buffers so a
#: 265 ms path is not window-limited below ~1 Gbit/s; no cached per-destination
#: metrics (ssthresh, RTT) so one measurement does not warm up the next.
HOST_SYSCTLS: dict[str, str] = {
    "net.ipv4.tcp_rmem": "4096 131072 33554432",
    "net.ipv4.tcp_wmem": "4096 16384 33554432",
    "net.ipv4.tcp_no_metrics_save": "1",
}
ROUTER_SYSCTLS: dict[str, str] = {"net.ipv4.ip_forward": "1"}
NO_IPV6: dict[str, str] = {
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
}


class WanSetupError(RuntimeError):
    """A command that builds or removes the emulated WAN failed."""


def run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    """Run one command, return its stdout; raise WanSetupError naming it and its stderr."""
    try:
        done = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WanSetupError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()
        raise WanSetupError(f"{' '.join(argv)} exited {done.returncode}: {detail}")
    return done.stdout


def ns_name(tag: str, host: str) -> str:
    return f"{PREFIX}-{tag}-{host}"


def router_ifname(host: str) -> str:
    """The router's side of ``host``'s veth pair."""
    return f"r-{host}"


def check_tag(tag: str) -> str:
    if not _TAG_RE.match(tag):
        raise ValueError(f"instance tag must match {_TAG_RE.pattern}, got {tag!r}")
    return tag


# ------------------------------------------------------------------------ building


def _sysctl(ns: str, values: Mapping[str, str]) -> None:
    if values:
        settings = [f"{key}={value}" for key, value in values.items()]
        run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", *settings])


def _host_batch(tag: str, host: str, congctl: str) -> str:
    n = LINK_NUMBERS[host]
    addr, gw, dev = ADDRESSES[host], ROUTER_ADDRESSES[host], HOST_IFNAME
    cc = f"congctl {congctl}"
    return "\n".join([
        "link set lo up",
        f"link add {dev} type veth peer name {router_ifname(host)} netns {ns_name(tag, ROUTER)}",
        f"addr add {addr}/24 dev {dev} noprefixroute",
        f"link set {dev} up",
        f"route add 198.18.{n}.0/24 dev {dev} scope link src {addr} {cc}",
        f"route add 198.18.0.0/15 via {gw} dev {dev} src {addr} {cc}",
        *_local_routes(addr, dev, cc),
    ])  # fmt: skip


def _router_batch(congctl: str) -> str:
    cc = f"congctl {congctl}"
    lines = ["link set lo up"]
    for host in HOSTS:
        n, addr, dev = LINK_NUMBERS[host], ROUTER_ADDRESSES[host], router_ifname(host)
        lines += [
            f"addr add {addr}/24 dev {dev} noprefixroute",
            f"link set {dev} up",
            f"route add 198.18.{n}.0/24 dev {dev} scope link src {addr} {cc}",
        ]
        lines += _local_routes(addr, dev, cc)[2:]
    lines += _local_routes(None, None, cc)
    return "\n".join(lines)


def _local_routes(addr: str | None, dev: str | None, cc: str) -> list[str]:
    """The kernel's own local routes again, with a congestion control (TCP to self)."""
    lo = "dev lo table local proto kernel scope host src 127.0.0.1"
    lines = [
        f"route replace local 127.0.0.0/8 {lo} {cc}",
        f"route replace local 127.0.0.1 {lo} {cc}",
    ]
    if addr is not None:
        lines.append(
            f"route replace local {addr} dev {dev} table local proto kernel scope host "
            f"src {addr} {cc}"
        )
    return lines


def build_topology(
    tag: str,
    *,
    congctl: str,
    sysctls: Mapping[str, Mapping[str, str]],
) -> None:
    """Create the five namespaces, the four veth pairs, addresses, routes and sysctls.

    ``sysctls`` maps a host name, ``"router"`` or ``"*"`` (every namespace) to
    sysctl values applied after the defaults.
    """
    everyone = dict(sysctls.get("*", {}))
    for host in (ROUTER, *HOSTS):
        run(["ip", "netns", "add", ns_name(tag, host)])
    for host in (ROUTER, *HOSTS):
        base = ROUTER_SYSCTLS if host == ROUTER else HOST_SYSCTLS
        _sysctl(ns_name(tag, host), {**NO_IPV6, **base, **everyone, **sysctls.get(host, {})})
    for host in HOSTS:
        run(["ip", "-n", ns_name(tag, host), "-batch", "-"], stdin=_host_batch(tag, host, congctl))
    run(["ip", "-n", ns_name(tag, ROUTER), "-batch", "-"], stdin=_router_batch(congctl))


def routes_without_congctl(ns: str, congctl: str) -> list[str]:
    """Unicast and local routes in ``ns`` that do not pin ``congctl`` (should be none)."""
    missing = []
    for family in ("-4", "-6"):
        listed = run(["ip", "-n", ns, "-j", family, "route", "show", "table", "all"])
        routes = json.loads(listed or "[]")
        for route in routes:
            if route.get("type", "unicast") not in ("unicast", "local"):
                continue
            metrics = route.get("metrics", [])
            if not any(m.get("congestion") == congctl for m in metrics if isinstance(m, dict)):
                missing.append(f"{family} {route.get('type', 'unicast')} {route.get('dst')}")
    return missing


def add_nfqueue_rule(tag: str, iptables: str, queue_num: int) -> None:
    """Send every packet the router forwards to queue ``queue_num`` (no bypass: no listener
    means no forwarding, never an undelayed packet)."""
    argv = [iptables, "-w", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", str(queue_num)]
    run(["ip", "netns", "exec", ns_name(tag, ROUTER), *argv])


# ------------------------------------------------------------------------- finding


def namespaces() -> list[str]:
    """All network namespaces that carry our prefix."""
    listed = json.loads(run(["ip", "-j", "netns", "list"]) or "[]")
    return [ns["name"] for ns in listed if _NS_RE.match(ns.get("name", ""))]


def instances() -> dict[str, list[str]]:
    """Our namespaces grouped by instance tag (also tags that only have a state file)."""
    found: dict[str, list[str]] = {}
    for ns in namespaces():
        match = _NS_RE.match(ns)
        assert match is not None
        found.setdefault(match.group(1), []).append(ns)
    if STATE_DIR.is_dir():
        for path in STATE_DIR.glob("*.json"):
            if _TAG_RE.match(path.stem):
                found.setdefault(path.stem, [])
    return found


def namespace_pids(ns: str) -> list[int]:
    """PIDs of the processes whose network namespace is ``ns``."""
    out = run(["ip", "netns", "pids", ns], check=False)
    return [int(word) for word in out.split() if word.isdigit()]


def process_start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None if it is not running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def write_state(tag: str, data: Mapping[str, Any]) -> None:
    STATE_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = STATE_DIR / f"{tag}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


def read_state(tag: str) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((STATE_DIR / f"{tag}.json").read_text())
        return state
    except (OSError, ValueError):
        return None


def owner_alive(state: Mapping[str, Any] | None) -> bool:
    if not state:
        return False
    pid, ticks = state.get("owner_pid"), state.get("owner_start_ticks")
    return isinstance(pid, int) and process_start_ticks(pid) == ticks


# ------------------------------------------------------------------------ removing


def kill_pids(pids: Iterable[int], grace_s: float = 2.0) -> None:
    """SIGTERM each PID, wait up to ``grace_s`` for them to go, then SIGKILL the rest."""
    alive = set(pids)
    for pid in list(alive):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            alive.discard(pid)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = {pid for pid in alive if _running(pid)}
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (reaping it is its parent's job)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def destroy_instance(tag: str, grace_s: float = 2.0) -> list[str]:
    """Kill every process in the instance's namespaces, delete them and its state file.

    Returns what could not be removed (empty on success); never raises for a
    namespace that is already gone, so it is safe to call twice.
    """
    problems = []
    names = [ns_name(tag, host) for host in (*HOSTS, ROUTER)]
    existing = set(namespaces())
    pids = [pid for ns in names if ns in existing for pid in namespace_pids(ns)]
    kill_pids(pids, grace_s)
    for ns in names:
        if ns in existing:
            try:
                run(["ip", "netns", "del", ns])
            except WanSetupError as exc:
                problems.append(str(exc))
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / f"{tag}.json").unlink()
    return problems


def reap_stale() -> list[str]:
    """Remove instances whose owner process is gone; return their tags."""
    reaped = []
    for tag in instances():
        if not owner_alive(read_state(tag)):
            destroy_instance(tag)
            reaped.append(tag)
    return reaped
