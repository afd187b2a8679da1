"""The WAN emulator: four "hosts" in network namespaces joined by a delaying router.

::

    user 198.18.1.2 ──┐                     ┌── 198.18.3.2 origin
                      ├── router (NFQUEUE) ─┤
    edge 198.18.2.2 ──┘   delay per pair    └── 198.18.4.2 app

Use it as a context manager from a scenario runner::

    with WanEmulator(delays_ms={"user-edge": 5}, congctl="cubic") as wan:
        server = wan.popen("origin", [python, "server.py", wan.address("origin")])
        subprocess.run(wan.exec_argv("user", ["curl", f"http://{wan.address('origin')}/"]))
        wan.set_pair("edge", "origin", loss=0.01)   # 1% loss on the long link, both ways
        wan.floor_ms("user", "origin")              # 265.0: the configured RTT
        wan.statistics()                            # per-link counters, release lateness

``set_pair`` reaches the running delay process over its stdin/stdout pipe (JSON
lines, one reply each; see :mod:`loadtests.wan.delay`) and returns once the
new parameters apply to the next packet.

or by hand: ``python -m loadtests.wan.emulator up|down|status`` (``up`` stays in
the foreground until Ctrl-C, then tears everything down).

Why user space: this kernel has no netem, so the router hands every forwarded
packet to :mod:`loadtests.wan.delay` through NFQUEUE and that process releases
it after its pair's delay. That costs 0.07-0.2 ms per pass (measured RTTs sit
0.15-0.4 ms above :meth:`WanEmulator.floor_ms`; DESIGN.md quotes ~0.3 ms per
pass for a simpler ``call_later`` version). See :mod:`loadtests.wan.delay` for
the mechanism and its limits, :mod:`loadtests.wan.netns` for naming, routes
(``congctl`` on every route, since the host's default is BBR) and cleanup.

Teardown runs on ``__exit__`` (so also on Ctrl-C), at interpreter exit (atexit),
on SIGTERM when the emulator was started in the main thread, and otherwise at the
next start (stale instances whose owner is dead are reaped). The delay process
exits when its parent dies (stdin EOF, ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any

from loadtests.wan import netns
from loadtests.wan.delay import DelayProcess, delay_config
from loadtests.wan.shaper import DEFAULT_QUEUE_MS
from loadtests.wan.topology import (
    ADDRESSES,
    HOSTS,
    KEEP,
    ROUTER,
    DirectedPair,
    Keep,
    LinkParams,
    PairValues,
    WanConfigError,
    build_links,
    parse_pair,
    rtt_ms,
    update_link,
)

__all__ = ["WanEmulator", "unsupported_reason"]

_instance_numbers = itertools.count()
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1
IPTABLES_CANDIDATES = ("iptables", "iptables-legacy")


def _die_with_parent() -> None:  # runs in the forked child before exec
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def available_congctls() -> list[str]:
    path = "/proc/sys/net/ipv4/tcp_available_congestion_control"
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


class WanEmulator:
    """Builds the emulated WAN on ``up()``/``__enter__`` and removes all of it on ``down()``.

    ``delays_ms``, ``loss`` and ``bandwidth_mbit`` map pairs (``"user-edge"`` both
    ways, ``"user>edge"`` one way) to one-way delay, loss probability and Mbit/s;
    unset pairs keep the defaults in :data:`loadtests.wan.topology.DEFAULT_DELAYS_MS`.
    ``sysctls`` maps a host, ``"router"`` or ``"*"`` to sysctl values for those
    namespaces (e.g. ``{"*": {"net.ipv4.tcp_slow_start_after_idle": "0"}}``),
    applied after the defaults in :data:`loadtests.wan.netns.HOST_SYSCTLS`.

    The rest rarely needs changing: ``congctl`` is pinned on every route;
    ``tag`` names the namespaces ``gewan-<tag>-<host>`` (default: PID-based,
    unique per instance); ``iptables`` is tried as given, else ``iptables``
    then ``iptables-legacy``; ``queue_num``/``queue_maxlen`` are the NFQUEUE
    number and how many packets the kernel may hold for us; ``queue_ms`` is a
    rate-limited link's buffer in transmission time; ``python`` runs the delay
    process (it needs ``netfilterqueue``); ``rt_priority`` is its SCHED_FIFO
    priority (0: normal scheduling); ``handle_sigterm`` turns SIGTERM into
    SystemExit so teardown runs (main thread only, if nobody else handles it).
    """

    def __init__(
        self,
        delays_ms: PairValues = None,
        loss: PairValues = None,
        bandwidth_mbit: PairValues = None,
        *,
        congctl: str = "cubic",
        sysctls: Mapping[str, Mapping[str, str]] | None = None,
        tag: str | None = None,
        iptables: str | None = None,
        queue_num: int = 0,
        queue_maxlen: int = 65536,
        queue_ms: float = DEFAULT_QUEUE_MS,
        python: str = sys.executable,
        handle_sigterm: bool = True,
        rt_priority: int = 10,
    ) -> None:
        self.links: dict[DirectedPair, LinkParams] = build_links(delays_ms, loss, bandwidth_mbit)
        known = available_congctls()
        if known and congctl not in known:
            raise WanConfigError("congctl", f"{congctl!r} is not available; have {known}")
        self.congctl = congctl
        self.sysctls = {k: dict(v) for k, v in (sysctls or {}).items()}
        for key in self.sysctls:
            if key not in (*HOSTS, ROUTER, "*"):
                raise WanConfigError(f"sysctls[{key!r}]", "expected a host, 'router' or '*'")
        self.tag = netns.check_tag(tag or f"{os.getpid()}n{next(_instance_numbers)}")
        self.iptables = iptables
        self.queue_num, self.queue_maxlen, self.queue_ms = queue_num, queue_maxlen, queue_ms
        self.python = python
        self.handle_sigterm = handle_sigterm
        self.rt_priority = rt_priority
        self._delay: DelayProcess | None = None
        self._procs: list[subprocess.Popen[Any]] = []
        self._old_sigterm: Any = None
        self._state: str = "new"  # new -> up -> down
        self._owner_pid = os.getpid()

    # ------------------------------------------------------------------ addressing

    def address(self, host: str) -> str:
        """The host's IPv4 address on the emulated WAN."""
        self._check_host(host)
        return ADDRESSES[host]

    def namespace(self, host: str) -> str:
        """The network namespace name of ``host`` (or ``"router"``)."""
        if host != ROUTER:
            self._check_host(host)
        return netns.ns_name(self.tag, host)

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed so that it runs inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def popen(
        self, host: str, argv: Sequence[str], *, die_with_parent: bool | None = None, **kw: Any
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` in ``host``'s namespace; it is stopped (by PID) on ``down()``.

        ``die_with_parent`` (default: when called from the main thread) makes the
        kernel kill it if this process dies; it is tied to the calling *thread*,
        hence off by default elsewhere.
        """
        if self._state != "up":
            raise RuntimeError("WanEmulator.popen() before up()")
        if die_with_parent is None:
            die_with_parent = threading.current_thread() is threading.main_thread()
        if die_with_parent and "preexec_fn" not in kw:
            kw["preexec_fn"] = _die_with_parent
        proc = subprocess.Popen(self.exec_argv(host, argv), **kw)
        self._procs.append(proc)
        return proc

    def _check_host(self, host: str) -> None:
        if host not in HOSTS:
            raise WanConfigError(host, f"unknown host; hosts are {', '.join(HOSTS)}")

    # ----------------------------------------------------------------------- links

    def link(self, a: str, b: str) -> LinkParams:
        """The parameters of the direction a -> b."""
        self._check_host(a)
        self._check_host(b)
        return self.links[(a, b)]

    def floor_ms(self, a: str, b: str) -> float:
        """The configured round-trip time between two hosts (delays only, no overhead)."""
        return rtt_ms(self.links, a, b)

    def set_pair(
        self,
        a: str,
        b: str,
        *,
        delay_ms: float | Keep = KEEP,
        loss: float | Keep = KEEP,
        bandwidth_mbit: float | Keep | None = KEEP,
        both_ways: bool = True,
    ) -> None:
        """Change a pair while running; packets already held keep their release time."""
        pairs, _ = parse_pair(f"{a}-{b}" if both_ways else f"{a}>{b}")
        updated = {
            pair: update_link(
                self.links[pair], delay_ms=delay_ms, loss=loss, bandwidth_mbit=bandwidth_mbit
            )
            for pair in pairs
        }
        for (src, dst), params in updated.items():
            if self._delay is not None:
                pair = f"{src}>{dst}"
                self._delay.request({"op": "set", "pair": pair, "params": params.to_json()})
            self.links[(src, dst)] = params

    def set_every_delay(self, delay_ms: float) -> None:
        """Every pair's delay, both ways (``0``: what a measurement costs in
        computing alone, ``make cold-burst`` and ``make zero-delay``)."""
        for a, b in sorted({tuple(sorted(pair)) for pair in self.links}):
            self.set_pair(a, b, delay_ms=delay_ms)

    def statistics(self) -> dict[str, Any]:
        """Counters from the delay process: per link, held packets, release lateness."""
        if self._delay is None:
            raise RuntimeError("WanEmulator.statistics() while not up")
        reply = self._delay.request({"op": "stats"})
        reply.pop("ok", None)
        return reply

    @property
    def delay_pid(self) -> int | None:
        return None if self._delay is None else self._delay.pid

    # ------------------------------------------------------------------- lifecycle

    def __enter__(self) -> WanEmulator:
        return self.up()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()

    def up(self) -> WanEmulator:
        """Build everything; on any failure, remove what was built and re-raise."""
        if self._state != "new":
            raise RuntimeError(f"WanEmulator.up() when {self._state}")
        self._owner_pid = os.getpid()
        if os.geteuid() != 0:
            raise netns.WanSetupError("the WAN emulator needs root (network namespaces)")
        netns.reap_stale()
        self._state = "up"
        atexit.register(self.down)
        self._install_sigterm()
        try:
            netns.write_state(self.tag, self._state_record())
            netns.build_topology(self.tag, congctl=self.congctl, sysctls=self.sysctls)
            self._check_routes()
            self._start_delay_process()
            netns.write_state(self.tag, self._state_record())
        except BaseException:
            with contextlib.suppress(Exception):  # the original error is the one to report
                self.down()
            raise
        return self

    def _state_record(self) -> dict[str, Any]:
        return {
            "owner_pid": os.getpid(),
            "owner_start_ticks": netns.process_start_ticks(os.getpid()),
            "delay_pid": self.delay_pid,
            "congctl": self.congctl,
            "rtt_ms": {f"{a}-{b}": self.floor_ms(a, b) for a, b in self.links if a < b},
            "created": time.time(),
        }

    def _check_routes(self) -> None:
        for host in (*HOSTS, ROUTER):
            missing = netns.routes_without_congctl(self.namespace(host), self.congctl)
            if missing:
                raise netns.WanSetupError(f"routes without congctl in {host}: {missing}")

    def _start_delay_process(self) -> None:
        interfaces = {host: netns.router_ifname(host) for host in HOSTS}
        config = delay_config(
            interfaces, self.links, queue_num=self.queue_num,
            queue_maxlen=self.queue_maxlen, queue_ms=self.queue_ms,
        )  # fmt: skip
        pdeathsig = threading.current_thread() is threading.main_thread()
        self._delay = DelayProcess.start(
            self.exec_argv(ROUTER, []),
            config,
            python=self.python,
            pdeathsig=pdeathsig,
            rt_priority=self.rt_priority,
        )
        candidates = [self.iptables] if self.iptables else list(IPTABLES_CANDIDATES)
        errors = []
        for iptables in candidates:
            try:
                netns.add_nfqueue_rule(self.tag, iptables, self.queue_num)
            except netns.WanSetupError as exc:
                errors.append(str(exc))
                continue
            self.iptables = iptables
            return
        raise netns.WanSetupError("cannot add the NFQUEUE rule: " + "; ".join(errors))

    def down(self) -> None:
        """Stop tracked processes and the delay process, delete the namespaces. Idempotent."""
        if self._state != "up" or os.getpid() != self._owner_pid:
            return  # not up, or a forked child exiting: the WAN is its parent's
        self._state = "down"
        atexit.unregister(self.down)
        try:
            for proc in self._procs:
                if proc.poll() is None:
                    proc.terminate()
            deadline = time.monotonic() + 2.0
            for proc in self._procs:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=2.0)
            if self._delay is not None:
                self._delay.stop()
        finally:
            problems = netns.destroy_instance(self.tag)
            self._restore_sigterm()
        if problems:
            raise netns.WanSetupError("teardown left: " + "; ".join(problems))

    def _install_sigterm(self) -> None:
        if not self.handle_sigterm or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # someone else handles it; they will unwind through __exit__

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)

        self._old_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    def _restore_sigterm(self) -> None:
        if self._old_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None


def unsupported_reason(python: str = sys.executable) -> str | None:
    """Why the emulator cannot run here (None if it can): root, tools, module, NFQUEUE."""
    if os.geteuid() != 0:
        return "the WAN emulator needs root"
    for tool in ("ip", "sysctl"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install iproute2 procps)"
    iptables = [t for t in IPTABLES_CANDIDATES if shutil.which(t)]
    if not iptables:
        return "iptables not found (apt-get install iptables)"
    if python == sys.executable and importlib.util.find_spec("netfilterqueue") is None:
        return "netfilterqueue not installed (apt libnetfilter-queue-dev; pip netfilterqueue)"
    probe = "import netfilterqueue as q; n = q.NetfilterQueue(); n.bind(0, print); n.unbind()"
    tag = netns.check_tag(f"probe{os.getpid()}")
    ns = netns.ns_name(tag, ROUTER)
    me = os.getpid()
    netns.write_state(tag, {"owner_pid": me, "owner_start_ticks": netns.process_start_ticks(me)})
    try:
        netns.run(["ip", "netns", "add", ns])
        done = subprocess.run(
            ["ip", "netns", "exec", ns, python, "-c", probe],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if done.returncode != 0:
            return f"netfilterqueue cannot bind a queue: {done.stderr.strip()[-300:]}"
        for tool in iptables:
            rule = [tool, "-w", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", "0"]
            added = subprocess.run(["ip", "netns", "exec", ns, *rule], capture_output=True)
            if added.returncode == 0:
                return None
        return f"the NFQUEUE iptables target does not work ({', '.join(iptables)})"
    except (netns.WanSetupError, OSError, subprocess.TimeoutExpired) as exc:
        return f"network namespaces unavailable: {exc}"
    finally:
        netns.destroy_instance(tag)


if __name__ == "__main__":
    from loadtests.wan.cli import main

    sys.exit(main())
