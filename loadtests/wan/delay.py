"""The delay process: holds each forwarded packet in the router for its pair's delay.

How it works
------------
The kernel here has no netem qdisc, so delay is added in user space. The router
namespace has one iptables rule, ``-A FORWARD -j NFQUEUE --queue-num N``: every
packet the router forwards is parked in the kernel and its metadata (plus the
first 20 bytes, the IPv4 header) is sent to this process over netlink. We look
up the packet's directed link by (input interface, output interface) -- each
host has its own veth into the router, so the pair of interfaces *is* the pair
of hosts, whatever addresses a caller adds -- and ask
:class:`loadtests.wan.shaper.DirectedLink` when it may leave. The packet stays
in the kernel meanwhile; only its id is kept here, and ``accept()`` later sends
the verdict that lets the kernel forward it. The payload is never copied, so
``Packet.retain()`` is not needed (it copies the payload into Python; only a
verdict is sent at release).

Why a select loop and not asyncio: asyncio's and uvloop's timers have 1 ms
resolution (uvloop rounds ``call_later`` to whole milliseconds, asyncio hands
``epoll`` a millisecond timeout), which would turn the 0.25 ms origin-app delay
into 0 or 1 ms. ``select.select`` takes microseconds, and with the timer slack
lowered to 10 us the loop wakes within tens of microseconds of a deadline. Each
directed link is a FIFO (see :mod:`loadtests.wan.shaper`), so finding the next
deadline is a scan of twelve queue heads rather than a timer object per packet.

Measured on the shared 2-core development VM (ping, defaults, SCHED_FIFO):
user-edge 10.15 ms for a 10 ms floor, user-origin 265.35 ms for 265, origin-app
0.65 ms for 0.5: 0.07-0.2 ms added per pass through the router, mostly the
wake-up after ``select`` (release lateness: mean ~45 us, max ~0.2-1 ms). A
zero-delay pair is accepted inside the callback and costs ~20 us per round
trip. Without SCHED_FIFO, with other work on the machine, the same path cost
~1 ms per round trip with 10 ms outliers; hence ``rt_priority``. TCP bulk
through an unlimited link ran at ~1 Gbit/s (~110k packets/s released).

Limits
------
* One Python thread handles every packet, ~100k packets/s at most. A sender
  faster than that (a bulk TCP flow on an unlimited link) saturates the loop:
  packets wait unread in the netlink socket (``netlink_rcvbuf_bytes``, 8 MiB,
  i.e. up to ~100 ms) before they are even timed, and latency measured
  alongside such a flow is meaningless. Set ``bandwidth_mbit`` on bulk tests:
  at 50 Mbit/s the loop is ~5% busy and releases stay within tens of us.
* The kernel queue holds every delayed packet until its verdict
  (``queue_maxlen``, 65536 by default: ~1 Gbit/s for 265 ms); beyond that the
  kernel drops, as a full router would. No ``--queue-bypass``: if the delay
  process is gone, nothing is forwarded undelayed.
* IPv4 only (iptables, not ip6tables); the router does not forward IPv6.
* Loss is independent per packet (no Gilbert-Elliott bursts), no jitter.
* GSO packets are segmented by the kernel before queueing (the netfilterqueue
  package does not expose ``NFQA_CFG_F_GSO``), so sizes are real wire sizes.

Control channel
---------------
The parent talks to this process over its stdin/stdout pipes, one JSON object
per line, one reply line per request: ``{"op": "set", "pair": "user>edge",
"params": {...}}``, ``{"op": "stats"}``, ``{"op": "stop"}``. The same stdin
pipe is the parent-death watchdog: EOF means the parent is gone, and the
process exits (``PR_SET_PDEATHSIG`` covers the case where it is stuck). A pipe
needs no path to clean up and cannot be reached by anyone but the owner.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loadtests.wan.shaper import DEFAULT_QUEUE_MS, DelayScheduler, DirectedLink
from loadtests.wan.topology import DirectedPair, LinkParams, WanConfigError, pair_name, parse_pair

__all__ = ["DelayProcess", "DelayProcessError", "main"]

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Bytes of each packet copied to us: the IPv4 header, for the total length.
HEADER_BYTES = 20
#: Packets read from netlink before due packets are released again, so a flood
#: cannot starve releases.
READ_BATCH = 64
#: Release packets this early rather than sleep again for a few microseconds.
EARLY_S = 20e-6
PR_SET_PDEATHSIG = 1
PR_SET_TIMERSLACK = 29
TIMER_SLACK_NS = 10_000


class DelayProcessError(RuntimeError):
    """The delay process failed to start, answer or stop."""


# --------------------------------------------------------------------------- child


class _BudgetedReader:
    """A ``recv`` for ``NetfilterQueue.run_socket`` that reports EAGAIN after a budget.

    ``run_socket`` loops until EAGAIN; the budget returns control to our loop.
    """

    __slots__ = ("_sock", "enobufs", "left")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.left = 0
        self.enobufs = 0

    def recv(self, size: int) -> bytes:
        if self.left <= 0:
            raise BlockingIOError(errno.EAGAIN, "read budget spent")
        self.left -= 1
        try:
            return self._sock.recv(size, socket.MSG_DONTWAIT)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # the kernel dropped packets it could not send us
                self.enobufs += 1
            raise


class DelayLoop:
    """The child's state: links by interface pair, held packets, counters."""

    def __init__(
        self,
        interfaces: dict[str, str],
        links: dict[DirectedPair, LinkParams],
        queue_ms: float,
        if_index: Callable[[str], int] = socket.if_nametoindex,
    ) -> None:
        index = {host: if_index(name) for host, name in interfaces.items()}
        self.by_pair: dict[DirectedPair, DirectedLink[Any]] = {}
        self.by_devices: dict[tuple[int, int], DirectedLink[Any]] = {}
        for (a, b), params in links.items():
            link: DirectedLink[Any] = DirectedLink(params, queue_ms)
            self.by_pair[(a, b)] = link
            self.by_devices[(index[a], index[b])] = link
        self.scheduler: DelayScheduler[tuple[int, int], Any] = DelayScheduler(self.by_devices)
        self.unmatched = 0
        self.late_sum_s = 0.0
        self.late_max_s = 0.0
        self.released = 0
        self.stopping = False
        self.reader: _BudgetedReader | None = None

    def on_packet(self, pkt: Any) -> None:
        """netfilterqueue callback: decide now, hold or drop (hot path: keep it short)."""
        link = self.by_devices.get((pkt.indev, pkt.outdev))
        if link is None:
            self.unmatched += 1
            pkt.accept()
            return
        now = time.monotonic()
        size = int.from_bytes(pkt.get_payload()[2:4], "big")
        release = link.admit(now, size, random.random())
        if release is None:
            pkt.drop()
        elif release <= now and not link.queue:
            pkt.accept()
        else:
            self.scheduler.push(link, release, pkt)

    def release_due(self) -> None:
        now = time.monotonic()
        late_max = self.late_max_s
        count = 0
        late_sum = 0.0
        for release, pkt in self.scheduler.pop_due(now + EARLY_S):
            pkt.accept()
            late = now - release
            late_sum += late
            count += 1
            if late > late_max:
                late_max = late
        self.released += count
        self.late_sum_s += late_sum
        self.late_max_s = late_max

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one control request."""
        op = request.get("op")
        if op == "set":
            pairs, directed = parse_pair(str(request.get("pair", "")))
            if not directed:
                raise WanConfigError(str(request.get("pair")), "the delay process takes 'a>b'")
            self.by_pair[pairs[0]].set_params(LinkParams.from_json(request["params"]))
            return {"ok": True}
        if op == "stats":
            return {"ok": True, **self.statistics()}
        if op == "stop":
            self.stopping = True
            return {"ok": True}
        raise WanConfigError("op", f"unknown control request {op!r}")

    def statistics(self) -> dict[str, Any]:
        links = {
            pair_name(pair): {
                **link.counters.to_json(),
                "held": len(link.queue),
                **link.params.to_json(),
            }
            for pair, link in self.by_pair.items()
        }
        mean = self.late_sum_s / self.released if self.released else 0.0
        return {
            "links": links,
            "held": self.scheduler.held(),
            "unmatched": self.unmatched,
            # Each ENOBUFS means the kernel dropped packets it could not hand us in time.
            "netlink_overruns": 0 if self.reader is None else self.reader.enobufs,
            "released": self.released,
            "late_mean_us": round(mean * 1e6, 1),
            "late_max_us": round(self.late_max_s * 1e6, 1),
        }


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _go_realtime(priority: int) -> None:
    """Run under SCHED_FIFO so that a busy machine does not delay releases.

    On the shared 2-core VM, with other work running, a normal-priority loop
    released packets 0.35 ms late on average and up to 10 ms late; SCHED_FIFO
    wakes it ahead of every normal task. The loop sleeps in ``select`` whenever
    it has nothing due, and the kernel's RT throttling (95% of each second by
    default) bounds the damage of a bug.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as exc:
        print(f"delay process: SCHED_FIFO unavailable ({exc}); running unprioritised",
              file=sys.stderr)  # fmt: skip


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _serve_control(loop: DelayLoop, pending: bytearray) -> bool:
    """Read control lines from stdin; False when the parent has gone (EOF)."""
    chunk = os.read(0, 65536)
    if not chunk:
        return False
    pending += chunk
    while b"\n" in pending:
        line, _, rest = bytes(pending).partition(b"\n")
        pending[:] = rest
        try:
            _reply(loop.handle(json.loads(line)))
        except (ValueError, KeyError, TypeError) as exc:
            _reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return True


def _run(loop: DelayLoop, config: dict[str, Any]) -> None:
    from netfilterqueue import COPY_PACKET, NetfilterQueue

    nfq = NetfilterQueue()
    nfq.bind(
        int(config["queue_num"]),
        loop.on_packet,
        max_len=int(config["queue_maxlen"]),
        mode=COPY_PACKET,
        range=HEADER_BYTES,
        sock_len=int(config["netlink_rcvbuf_bytes"]),
    )
    nfq_fd = nfq.get_fd()
    sock = socket.fromfd(nfq_fd, socket.AF_NETLINK, socket.SOCK_RAW)  # a dup: same socket
    reader = loop.reader = _BudgetedReader(sock)
    pending = bytearray()
    _reply({"ok": True, "ready": True, "pid": os.getpid()})
    try:
        while not loop.stopping:
            deadline = loop.scheduler.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([nfq_fd, 0], [], [], timeout)
            if nfq_fd in readable:
                reader.left = READ_BATCH
                nfq.run_socket(reader)  # type: ignore[arg-type]  # it only calls recv()
            if 0 in readable and not _serve_control(loop, pending):
                break
            loop.release_due()
    finally:
        nfq.unbind()
        sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="JSON: interfaces, links, queue sizes")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--pdeathsig", action="store_true", help="die with the parent thread")
    parser.add_argument("--rt-priority", type=int, default=0, help="SCHED_FIFO priority, 0: off")
    args = parser.parse_args(argv)
    if args.pdeathsig:  # stdin EOF is the watchdog in every case; this one also fires if
        # the parent is stopped in a way that leaves the pipe open (a forked copy of it).
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != args.parent_pid:
        print("delay process: parent already gone", file=sys.stderr)
        return 1
    with contextlib.suppress(OSError):
        _prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS)
    if args.rt_priority > 0:
        _go_realtime(args.rt_priority)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    config = json.loads(args.config)
    links = {}
    for name, params in config["links"].items():
        pairs, _ = parse_pair(name)
        links[pairs[0]] = LinkParams.from_json(params)
    loop = DelayLoop(config["interfaces"], links, float(config["queue_ms"]))
    _run(loop, config)
    return 0


# -------------------------------------------------------------------------- parent


def delay_config(
    interfaces: dict[str, str],
    links: dict[DirectedPair, LinkParams],
    *,
    queue_num: int = 0,
    queue_maxlen: int = 65536,
    queue_ms: float = DEFAULT_QUEUE_MS,
    netlink_rcvbuf_bytes: int = 8 << 20,
) -> dict[str, Any]:
    """The JSON configuration the child takes on its command line."""
    return {
        "interfaces": interfaces,
        "links": {pair_name(p): params.to_json() for p, params in links.items()},
        "queue_num": queue_num,
        "queue_maxlen": queue_maxlen,
        "queue_ms": queue_ms,
        "netlink_rcvbuf_bytes": netlink_rcvbuf_bytes,
    }


class DelayProcess:
    """The parent's handle on a running delay process (start, request, stop by PID)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._buffer = bytearray()
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(
        cls,
        exec_prefix: Sequence[str],
        config: dict[str, Any],
        python: str = sys.executable,
        pdeathsig: bool = True,
        rt_priority: int = 0,
        ready_timeout_s: float = 10.0,
    ) -> DelayProcess:
        """Start the child under ``exec_prefix`` (``ip netns exec <router>``), wait until bound.

        ``pdeathsig`` asks the kernel to kill the child when the *calling thread*
        exits, so pass it only from a thread that lives as long as the emulator.
        """
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        argv = [*exec_prefix, python, "-m", "loadtests.wan.delay"]
        argv += ["--parent-pid", str(os.getpid()), "--config", json.dumps(config)]
        argv += ["--pdeathsig"] if pdeathsig else []
        argv += ["--rt-priority", str(rt_priority)]
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO_ROOT, env=env,
            start_new_session=True,
        )  # fmt: skip
        handle = cls(proc)
        try:
            handle._read_reply(time.monotonic() + ready_timeout_s)
        except BaseException:
            handle.stop()
            raise
        return handle

    def request(self, message: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
        """Send one control request and return its reply; raise on an error reply."""
        with self._lock:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps(message).encode() + b"\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                raise DelayProcessError(f"delay process {self.pid} has exited") from None
            reply = self._read_reply(time.monotonic() + timeout_s)
        if not reply.get("ok"):
            raise DelayProcessError(f"delay process refused {message!r}: {reply.get('error')}")
        return reply

    def _read_reply(self, deadline: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DelayProcessError(f"delay process {self.pid} did not answer in time")
            readable, _, _ = select.select([fd], [], [], left)
            if readable:
                chunk = os.read(fd, 65536)
                if not chunk:
                    code = self.proc.wait(timeout=2.0)
                    raise DelayProcessError(f"delay process {self.pid} exited with status {code}")
                self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer[:] = rest
        message: dict[str, Any] = json.loads(line)
        return message

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the child: close its stdin (it exits on EOF), then SIGTERM/SIGKILL its PID."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout_s)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


if __name__ == "__main__":
    sys.exit(main())
