"""``python -m loadtests.wan.emulator up|down|status``: the emulator for humans.

``up`` builds the WAN, prints where everything is and stays in the foreground
until Ctrl-C (or SIGTERM/SIGHUP), then tears it down. ``down`` removes every
``gewan-`` instance (or only ``--stale`` ones, whose owner is dead, or one
``--tag``), killing the processes inside by PID. ``status`` lists instances,
their owners, configured RTTs and the processes in each namespace.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from loadtests.wan import netns
from loadtests.wan.emulator import WanEmulator
from loadtests.wan.topology import HOSTS, ROUTER, WanConfigError, parse_assignment

__all__ = ["main"]


def _pairs(values: list[str] | None) -> dict[str, float]:
    return dict(parse_assignment(v) for v in values or [])


def _sysctls(values: list[str] | None) -> dict[str, dict[str, str]]:
    """``[HOST:]KEY=VALUE`` -> {host or "*": {key: value}}."""
    out: dict[str, dict[str, str]] = {}
    for text in values or []:
        where, colon, rest = text.partition(":")
        if not colon or "=" in where:
            where, rest = "*", text
        key, eq, value = rest.partition("=")
        if not eq:
            raise WanConfigError(text, "expected [HOST:]KEY=VALUE")
        out.setdefault(where, {})[key] = value
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtests.wan.emulator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build the WAN and stay in the foreground until Ctrl-C")
    pairs: dict[str, Any] = {"action": "append"}
    up.add_argument(
        "--delay", metavar="PAIR=MS", help="one-way delay: user-edge=5, user>edge=5", **pairs
    )
    up.add_argument("--loss", metavar="PAIR=P", help="loss probability: edge-origin=0.01", **pairs)
    up.add_argument("--bandwidth", metavar="PAIR=MBIT", help="rate limit in Mbit/s", **pairs)
    up.add_argument("--congctl", default="cubic", help="TCP congestion control on every route")
    up.add_argument("--sysctl", metavar="[HOST:]KEY=VALUE", help="namespace sysctl", **pairs)
    up.add_argument("--tag", help="namespaces are gewan-TAG-HOST (default: PID-based)")
    up.add_argument("--stats-every", type=float, default=0.0, metavar="S", help="print counters")
    down = sub.add_parser("down", help="remove emulator instances and their processes")
    down.add_argument("--tag", action="append", help="only this instance (repeatable)")
    down.add_argument("--stale", action="store_true", help="only instances whose owner is dead")
    sub.add_parser("status", help="list instances, RTTs and processes")
    return parser


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _up(args: argparse.Namespace) -> int:
    wan = WanEmulator(
        delays_ms=_pairs(args.delay), loss=_pairs(args.loss),
        bandwidth_mbit=_pairs(args.bandwidth), congctl=args.congctl,
        sysctls=_sysctls(args.sysctl), tag=args.tag,
    )  # fmt: skip
    # A shell starts background jobs with SIGINT ignored; Ctrl-C/kill -INT must still work.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    with wan:
        print(f"WAN up: instance {wan.tag}, delay PID {wan.delay_pid}, congctl {wan.congctl}")
        for host in HOSTS:
            print(f"  {host:<7} {wan.address(host):<12} ip netns exec {wan.namespace(host)} ...")
        print(f"  {ROUTER:<7} {'':<12} ip netns exec {wan.namespace(ROUTER)} ...")
        print("configured RTT (ms):      " + "".join(f"{h:>9}" for h in HOSTS))
        for a in HOSTS:
            print(f"  {a:<24}" + "".join(f"{wan.floor_ms(a, b):>9.1f}" for b in HOSTS))
        print("Ctrl-C to tear down.", flush=True)
        try:
            while True:
                time.sleep(args.stats_every or 3600.0)
                if args.stats_every:
                    _print_stats(wan)
        except KeyboardInterrupt:
            pass
        finally:
            print("\ntearing down", flush=True)
    return 0


def _print_stats(wan: WanEmulator) -> None:
    stats = wan.statistics()
    print(
        f"held {stats['held']} released {stats['released']} late mean {stats['late_mean_us']} us"
        f" max {stats['late_max_us']} us"
    )
    for name, link in stats["links"].items():
        if link["packets"] or link["dropped_loss"] or link["dropped_queue"]:
            print(
                f"  {name:<14} pkts {link['packets']:>8} drop loss {link['dropped_loss']:>5}"
                f" queue {link['dropped_queue']:>5} max in flight {link['max_in_flight']}"
            )
    sys.stdout.flush()


def _down(args: argparse.Namespace) -> int:
    found = netns.instances()
    tags = args.tag or sorted(found)
    status, removed = 0, 0
    for tag in tags:
        if args.stale and netns.owner_alive(netns.read_state(tag)):
            continue
        problems = netns.destroy_instance(netns.check_tag(tag))
        print(f"removed {tag}" + (f": {problems}" if problems else ""))
        status |= bool(problems)
        removed += 1
    if not removed:
        print("nothing to remove")
    return status


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:100]


def _status() -> int:
    found = netns.instances()
    if not found:
        print("no WAN emulator instance")
    for tag, names in sorted(found.items()):
        state = netns.read_state(tag) or {}
        alive = "alive" if netns.owner_alive(state) else "DEAD (stale: run down --stale)"
        print(f"instance {tag}: owner PID {state.get('owner_pid')} {alive}")
        for pair, rtt in sorted((state.get("rtt_ms") or {}).items()):
            print(f"  rtt {pair:<14} {rtt:8.2f} ms")
        for ns in sorted(names):
            print(f"  {ns}")
            for pid in netns.namespace_pids(ns):
                print(f"    {pid:>7} {_cmdline(pid)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            return _up(args)
        if args.command == "down":
            return _down(args)
        return _status()
    except (WanConfigError, ValueError) as exc:
        parser.error(str(exc))
    except netns.WanSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return 1
