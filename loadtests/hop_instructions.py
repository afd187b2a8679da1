"""``make bench-hop-instructions``: machine instructions per request at each of
geoedge's two hops, live: keep-alive, each request on a new connection with a
full TLS handshake, or HTTP/2 (``--workload``).

``make bench-edge`` gives each hop's CPU time per request from ``/proc``; on a
shared machine that figure moves 1.5-3x with the neighbours' load, more than
most changes move it. This runs the same chain (Node.js, the origin, the edge,
one worker each, real TLS and a real tunnel) with the edge and the origin under
valgrind's callgrind, counting off, and counts the instructions each worker
executes while one client sends keep-alive ``GET``s through TLS: after a
warm-up, a signal has each worker zero its counts and start counting, another
has it write them out (:mod:`loadtests.callgrind_shim`), around a short and a
long run; the difference divided by the difference is the count per request,
fixed costs cancelled out. ``--keep DIR`` keeps the long run's dumps for
``callgrind_annotate --inclusive=yes`` (Cython-compiled functions show by
name; interpreted ones only as the interpreter's own functions).

Instructions are not time (a cache miss costs hundreds of them), but a change
that removes instructions from the path removes time, and the count does not
move with the load of a shared machine: the figure to compare code with.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from geoedge import devstack
from loadtests import callgrind_shim, edge_stack
from loadtests.edge_clients import KeepAliveConnection
from tunnel.build_mode import build_mode

RESULTS = Path(__file__).resolve().parent / "results" / "hop_instructions.json"
VALGRIND = [
    "valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=no",
    "--dump-instr=no", "--collect-systime=no",
]  # fmt: skip


def _dump(workdir: Path, name: str, pid: int, timeout_s: float = 60.0) -> Path:
    """Have worker ``pid`` write its counts (:mod:`loadtests.callgrind_shim`) and
    wait for the file: the signal is handled when its event loop next wakes."""
    pattern = f"callgrind.{name}.{pid}.*"
    before = set(workdir.glob(pattern))
    os.kill(pid, callgrind_shim.DUMP_SIGNAL)
    deadline = time.monotonic() + timeout_s
    while not (new := set(workdir.glob(pattern)) - before):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} (pid {pid}) wrote no dump in {timeout_s:.0f} s")
        time.sleep(0.2)
    time.sleep(0.5)  # let valgrind finish writing it
    return new.pop()


def _total(dump: Path) -> int:
    """The ``summary:``/``totals:`` line of one callgrind dump."""
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"{dump}: no totals line")


class Hops:
    """Node natively; the origin and the edge under callgrind (one worker each)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = edge_stack.Ports()
        self.keys = edge_stack.make_pki(workdir / "pki")
        self.processes = devstack.ProcessGroup()
        self.workers: dict[str, int] = {}

    def start(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        root = edge_stack.ROOT
        env = {**os.environ, "PYTHONPATH": str(root)}
        node = self.processes.spawn(
            "node", ["node", str(edge_stack.NODE_APP), str(self.ports.node)],
            log=self.workdir / "node.log", cwd=root,
        )  # fmt: skip
        devstack.wait_port(self.ports.node, deadline, node, self.workdir / "node.log")
        (self.workdir / "origin.toml").write_text(edge_stack.origin_toml(self.keys, self.ports))
        (self.workdir / "edge.toml").write_text(edge_stack.edge_toml(self.keys, self.ports))
        for name in ("origin", "edge"):
            out = self.workdir / f"callgrind.{name}.%p"
            argv = [
                *VALGRIND, f"--callgrind-out-file={out}", sys.executable,
                "-m", "loadtests.callgrind_shim", name,
                "--config", str(self.workdir / f"{name}.toml"), "--log-level", "warning",
            ]  # fmt: skip
            self.processes.spawn(name, argv, log=self.workdir / f"{name}.log", cwd=root, env=env)
        devstack.wait_healthy(
            self.ports.edge_admin, deadline, "the edge (tunnel up)", self.workdir / "edge.log"
        )
        for name in ("origin", "edge"):
            while not (found := edge_stack.children(self.processes.procs[name].pid)):
                if time.monotonic() > deadline:
                    raise devstack.StackError(f"{name}: no worker")
                time.sleep(0.2)
            self.workers[name] = found[0]

    def stop(self) -> None:
        self.processes.stop(30.0)
        edge_stack.kill_orphaned_workers(list(self.workers.values()))


@dataclass(frozen=True, slots=True)
class Measured:
    instructions_per_request: int
    dump: Path  # the long run's callgrind dump


#: The workloads, by name: what ``--workload`` takes and the results file keys.
WORKLOADS = {
    "keepalive": "keep-alive request",
    "new_connections": "request on a new connection",
    "h2": "HTTP/2 request (10 streams in flight)",
}


class Client:
    """``GET /`` through the edge: on one keep-alive connection
    (``keepalive``); each on a connection of its own, a full TLS handshake,
    never resumed (``new_connections``); or over HTTP/2 with ``h2load``, one
    connection per run and 10 streams in flight (``h2``: the run's handshake
    is the same in the short and the long run, so it cancels out)."""

    def __init__(self, port: int, workload: str) -> None:
        self.port = port
        self.workload = workload
        self.connection: KeepAliveConnection | None = None

    def run(self, requests: int) -> None:
        if self.workload == "h2":
            argv = ["h2load", "-t1", "-c1", "-m10", f"-n{requests}",
                    f"https://127.0.0.1:{self.port}/"]  # fmt: skip
            out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
            if (
                f"{requests} succeeded" not in out.stdout
                or "Application protocol: h2" not in out.stdout
            ):
                raise RuntimeError(f"h2load: {out.stdout[-800:]}")
            return
        for _ in range(requests):
            if self.connection is None:
                self.connection = KeepAliveConnection(self.port, tls=True, timeout_s=60.0)
            self.connection.get()
            if self.workload == "new_connections":
                self.close()

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def measure(hops: Hops, short: int, long: int, workload: str) -> dict[str, Measured]:
    client = Client(hops.ports.edge, workload)
    try:
        client.run(200)  # warm-up: caches, the backend connection, the tunnel window
        dumps: dict[str, list[Path]] = {name: [] for name in hops.workers}
        for requests in (short, long):
            for pid in hops.workers.values():
                os.kill(pid, callgrind_shim.START_SIGNAL)
            time.sleep(1.0)  # handled at the next wake-up (a timer); a request may do it
            client.run(requests)
            time.sleep(0.5)  # the last connection's close reaches the edge
            for name, pid in hops.workers.items():
                dumps[name].append(_dump(hops.workdir, name, pid))
    finally:
        client.close()
    return {
        name: Measured(round((_total(long_dump) - _total(short_dump)) / (long - short)), long_dump)
        for name, (short_dump, long_dump) in dumps.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-hop-instructions", description=__doc__)
    parser.add_argument("--short", type=int, default=200)
    parser.add_argument("--long", type=int, default=1000)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="keepalive")
    parser.add_argument("--keep", type=Path, help="keep the dumps here")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("cc") is None:
        print("needs valgrind and a C compiler (apt-get install valgrind gcc)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="hop-instructions-"))
    hops = Hops(workdir)
    try:
        hops.start()
        figures = measure(hops, args.short, args.long, args.workload)
    finally:
        hops.stop()
    what = WORKLOADS[args.workload]
    for name, measured in figures.items():
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(measured.dump, args.keep / f"callgrind.{name}")
        print(f"{name}: {measured.instructions_per_request:,} instructions per {what}")
    shutil.rmtree(workdir, ignore_errors=True)
    # One entry per workload: a run of the other keeps the figures it has.
    results = json.loads(args.output.read_text()) if args.output.exists() else {}
    results[args.workload] = {
        "workload": f"{what}: GET / through TLS, {args.long} - {args.short} requests",
        "build": build_mode(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        **{name: m.instructions_per_request for name, m in figures.items()},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
