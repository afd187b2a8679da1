"""``make reload-test``: ``systemctl reload`` under load, as issue 27 judges it.

The edge and the origin run from a fresh venv with a wheel of this checkout
installed (:mod:`loadtests.reload_stack`), two workers each, the edge started
the way ``geoedge-edge.service`` starts it (its listening socket and notify
socket held here, where systemd holds them). Throughout, a new TLS connection
starts every 20 ms (``GET /``, 3 s for each to complete) and 50 WebSockets
stay open: each one closed by the edge must be closed with 1001 or 1012,
then reconnect and echo; the others must still be open at the end.

Scenarios, one after the other, each counted on its own:

1. ``upgrade``: a second wheel with a bumped version is installed, then the
   unit's ``ExecReload=`` runs with the edge's pid; afterwards every worker's
   ``geoedge_build_info`` must show the new version, and the workers must be
   new processes.
2. ``bad_config``: an unknown key in the edge's config; the same command must
   exit non-zero naming the key and the file, and the workers stay the same.
3. ``origin``: the origin's ``ExecReload=`` with its pid: new origin workers,
   and the edges' streams move to them.
4. ``reload_x20``: 20 edge reloads in a row; after each one (once the old
   workers are gone) the supervisor's open descriptors and resident memory
   are sampled; no growth, and no process left behind at the end.

Failures: a connection refused, reset, cut or not answered within 3 s, a
status other than 200, a WebSocket closed otherwise. Writes
``loadtests/results/reload.json``; exit 0 when every check passed.
Timings depend on the machine's load: they are printed beside the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import ssl
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.edge_stack import children, open_fds, rss_kib
from loadtests.reload_stack import ReloadStack, Venv, build_wheels, exec_reload, worker_versions
from loadtests.restart import read_frame, read_response, ws_frame, ws_handshake

RESULTS = Path(__file__).resolve().parent / "results" / "reload.json"
CONNECT_EVERY_S = 0.020
CONNECTION_DEADLINE_S = 3.0
WEBSOCKETS = 50
DRAIN_TIMEOUT_S = 10.0
WS_WINDOW_S = 5.0
AFTER_S = 3.0
"""Load kept on after a reload returns (the old workers' WebSockets close by then)."""


@dataclass
class Tally:
    """What clients saw, per scenario (the one running when the attempt began)."""

    counts: dict[str, Counter[str]] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    #: When each failure happened, seconds since the scenario began.
    failed_at: dict[str, list[float]] = field(default_factory=dict)
    began: dict[str, float] = field(default_factory=dict)
    load: dict[str, str] = field(default_factory=dict)
    #: This client's own event-loop lag above LAG_NOTED_S: (seconds since the
    #: scenario began, lag). A client starved of CPU times out on its own.
    lags: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    phase: str = "warm-up"

    def enter(self, phase: str) -> None:
        """A scenario begins (the machine's load average is noted: figures
        taken while others work are noisy)."""
        self.phase = phase
        self.began[phase] = time.monotonic()
        self.load[phase] = Path("/proc/loadavg").read_text().strip()

    def count(self, phase: str, what: str) -> None:
        self.counts.setdefault(phase, Counter())[what] += 1

    def fail(self, phase: str, what: str, detail: object) -> None:
        self.count(phase, what)
        offset = time.monotonic() - self.began.get(phase, time.monotonic())
        self.failed_at.setdefault(phase, []).append(round(offset, 2))
        errors = self.errors.setdefault(phase, [])
        if len(errors) < 10:
            errors.append(f"{what}: {detail!r}")


OK_KINDS = {"ok", "ws_opened", "ws_reconnected", "ws_closed_1001", "ws_closed_1012"}


LAG_NOTED_S = 0.5


async def watch_lag(tally: Tally, stop: asyncio.Event) -> None:
    """How late this process's own timers fire (the machine is shared)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + 0.1
        await asyncio.sleep(0.1)
        lag = loop.time() - due
        if lag > LAG_NOTED_S:
            began = tally.began.get(tally.phase, time.monotonic())
            tally.lags.setdefault(tally.phase, []).append(
                (round(time.monotonic() - began, 2), round(lag, 2))
            )


async def one_connection(port: int, ctx: ssl.SSLContext, tally: Tally) -> None:
    phase = tally.phase
    started = time.monotonic()
    writer = None
    try:
        async with asyncio.timeout(CONNECTION_DEADLINE_S):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
            )
            writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            answer = await read_response(reader)
        if answer.startswith(b"HTTP/1.1 200"):
            tally.count(phase, "ok")
            tally.latencies.setdefault(phase, []).append(time.monotonic() - started)
        else:
            tally.fail(phase, "status", answer[:40].decode(errors="replace"))
    except TimeoutError:
        tally.fail(phase, "timed_out", f"not answered in {CONNECTION_DEADLINE_S:g} s")
    except ConnectionRefusedError as exc:
        tally.fail(phase, "refused", exc)
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError) as exc:
        tally.fail(phase, "failed", exc)
    finally:
        if writer is not None:
            writer.close()


async def opener(port: int, ctx: ssl.SSLContext, tally: Tally, stop: asyncio.Event) -> None:
    """A new connection every 20 ms, each on its own (open loop: a slow one
    does not delay the next)."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    next_at = loop.time()
    while not stop.is_set():
        task = loop.create_task(one_connection(port, ctx, tally))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        next_at += CONNECT_EVERY_S
        await asyncio.sleep(max(0.0, next_at - loop.time()))
    if tasks:
        await asyncio.wait(tasks, timeout=CONNECTION_DEADLINE_S + 1)


async def websocket(
    port: int, ctx: ssl.SSLContext, tally: Tally, stop: asyncio.Event, index: int
) -> str:
    """Open, echo; on the edge's Close answer it, reconnect, echo; until ``stop``.
    Returns how it ended: ``open`` or the failure."""
    connection = 0
    while True:
        connection += 1
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
            )
            writer.write(ws_handshake(f"/ws?i={index}.{connection}"))
            async with asyncio.timeout(CONNECTION_DEADLINE_S):
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 101"):
                    tally.fail(tally.phase, "ws_refused", head[:40])
                    return "refused"
                writer.write(ws_frame(0x1, b"ping"))
                if await read_frame(reader) != (0x1, b"ping"):
                    tally.fail(tally.phase, "ws_echo", "wrong echo")
                    return "echo"
            tally.count(tally.phase, "ws_opened" if connection == 1 else "ws_reconnected")
            closed = asyncio.create_task(_wait_close(reader))
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({closed, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not closed.done():
                closed.cancel()
                writer.write(ws_frame(0x8, (1000).to_bytes(2, "big")))
                writer.close()
                return "open"
            stopped.cancel()
            code = closed.result()
            phase = tally.phase
            if code in (1001, 1012):
                tally.count(phase, f"ws_closed_{code}")
            else:
                tally.fail(phase, "ws_closed_otherwise", code)
                return "closed"
            writer.write(ws_frame(0x8, code.to_bytes(2, "big")))
            writer.close()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError,
                OSError) as exc:  # fmt: skip
            tally.fail(tally.phase, "ws_broken", exc)
            return "broken"


async def _wait_close(reader: asyncio.StreamReader) -> int:
    opcode, payload = await read_frame(reader)
    while opcode != 0x8:
        opcode, payload = await read_frame(reader)
    return int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005


async def settle(pid: int, workers: int, timeout_s: float = 60.0) -> list[int]:
    """Until ``pid`` has exactly ``workers`` children (the old ones are gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = children(pid)
        if len(found) == workers or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)


def run_reload(stack: ReloadStack, role: str, config: Path, pid: int) -> tuple[int, str, float]:
    """The unit's ``ExecReload=`` from the venv: (exit status, output, seconds)."""
    started = time.monotonic()
    done = exec_reload(
        role, bin_dir=stack.venv.path / "bin", config=config, pid=pid,
        cwd=stack.venv.home, env=stack.venv.env,
    )  # fmt: skip
    return done.returncode, (done.stdout + done.stderr).strip(), time.monotonic() - started


async def reload_edge(stack: ReloadStack, scenario: str, tally: Tally) -> dict[str, Any]:
    before = children(stack.edge_pid)
    began = time.monotonic() - tally.began.get(tally.phase, time.monotonic())
    code, output, took = await asyncio.to_thread(
        run_reload, stack, "edge", stack.edge_config, stack.edge_pid
    )
    return {"scenario": scenario, "exit": code, "output": output, "seconds": round(took, 2),
            "began_at_s": round(began, 2), "workers_before": before}  # fmt: skip


async def upgrade(stack: ReloadStack, tally: Tally, new: tuple[str, Path]) -> dict[str, Any]:
    """A bumped version installed, then ExecReload=: every worker runs it."""
    new_version, new_wheel = new
    tally.enter("upgrade")
    await asyncio.to_thread(stack.venv.install, new_wheel)
    outcome = await reload_edge(stack, "upgrade", tally)
    await asyncio.sleep(WS_WINDOW_S + AFTER_S)
    after = await settle(stack.edge_pid, 2)
    versions = await asyncio.to_thread(worker_versions, stack.ports.edge_admin)
    installed = await asyncio.to_thread(stack.venv.version)  # not in the clients' loop
    return outcome | {
        "installed": installed,
        "workers_after": after,
        "build_info": versions,
        "ok": outcome["exit"] == 0
        and set(versions.values()) == {new_version}
        and sorted(versions) == sorted(after)
        and not set(after) & set(outcome["workers_before"]),
    }


async def bad_config(stack: ReloadStack, tally: Tally) -> dict[str, Any]:
    """An unknown key: refused with the key and the file, the workers stay."""
    tally.enter("bad_config")
    good = stack.edge_config.read_text()
    stack.edge_config.write_text(good.replace("[edge]\n", "[edge]\nworkerz = 3\n", 1))
    outcome = await reload_edge(stack, "bad_config", tally)
    stack.edge_config.write_text(good)
    await asyncio.sleep(AFTER_S)
    after = children(stack.edge_pid)
    return outcome | {
        "workers_after": after,
        "ok": outcome["exit"] != 0
        and "workerz" in outcome["output"]
        and str(stack.edge_config) in outcome["output"]
        and sorted(after) == sorted(outcome["workers_before"]),
    }


async def origin(stack: ReloadStack, tally: Tally) -> dict[str, Any]:
    """The origin's ExecReload=: new origin workers, the edges' streams move."""
    tally.enter("origin")
    origin_pid = stack.origin_pid
    before = children(origin_pid)
    code, output, took = await asyncio.to_thread(
        run_reload, stack, "origin", stack.origin_config, origin_pid
    )
    await asyncio.sleep(AFTER_S)
    after = await settle(origin_pid, 2)
    return {
        "exit": code, "output": output, "seconds": round(took, 2),
        "workers_before": before, "workers_after": after,
        "ok": code == 0 and not set(after) & set(before),
    }  # fmt: skip


async def reloads_in_a_row(stack: ReloadStack, tally: Tally, reloads: int) -> dict[str, Any]:
    """Reload after reload; the supervisor's descriptors and memory after each
    (once the old workers are gone)."""
    tally.enter("reload_x20")
    edge_pid = stack.edge_pid
    samples = []
    for n in range(reloads):
        outcome = await reload_edge(stack, f"reload {n + 1}", tally)
        workers = await settle(edge_pid, 2)
        samples.append({
            "n": n + 1, "exit": outcome["exit"], "seconds": outcome["seconds"],
            "fds": open_fds(edge_pid), "rss_kib": rss_kib(edge_pid), "workers": len(workers),
        })  # fmt: skip
    await asyncio.sleep(WS_WINDOW_S)
    fds = [s["fds"] for s in samples]
    rss = [s["rss_kib"] for s in samples]
    return {
        "samples": samples,
        "fds_first_last_max": [fds[0], fds[-1], max(fds)],
        "rss_kib_first_last_max": [rss[0], rss[-1], max(rss)],
        "ok": all(s["exit"] == 0 for s in samples)
        and max(fds) == fds[0]
        and rss[-1] <= rss[0] * 1.10,
    }


SCENARIOS = ("upgrade", "bad_config", "origin", "reload_x20")


async def scenarios(
    stack: ReloadStack, wheels: list[tuple[str, Path]], tally: Tally, args: argparse.Namespace
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    await asyncio.sleep(AFTER_S)
    if "upgrade" in args.only:
        results["upgrade"] = await upgrade(stack, tally, wheels[1])
    if "bad_config" in args.only:
        results["bad_config"] = await bad_config(stack, tally)
    if "origin" in args.only:
        results["origin"] = await origin(stack, tally)
    if "reload_x20" in args.only and args.reloads:
        results["reload_x20"] = await reloads_in_a_row(stack, tally, args.reloads)
    return results


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="geoedge-reload-") as tmp:
        workdir = Path(tmp)
        print("building two wheels ...", flush=True)
        wheels = await asyncio.to_thread(build_wheels, workdir)
        venv = await asyncio.to_thread(Venv, workdir / "venv")
        await asyncio.to_thread(venv.install, wheels[0][1])
        print(f"installed {venv.version()}; starting the stack ...", flush=True)
        stack = ReloadStack(workdir, venv, drain_timeout_s=DRAIN_TIMEOUT_S, ws_window_s=WS_WINDOW_S)
        try:
            await asyncio.to_thread(stack.start)
            ctx = ssl.create_default_context(cafile=str(stack.keys.ca))
            tally, stop = Tally(), asyncio.Event()
            port = stack.ports.edge
            load = asyncio.create_task(opener(port, ctx, tally, stop))
            lag = asyncio.create_task(watch_lag(tally, stop))
            sockets = [
                asyncio.create_task(websocket(port, ctx, tally, stop, i)) for i in range(WEBSOCKETS)
            ]
            try:
                outcomes = await scenarios(stack, wheels, tally, args)
            finally:
                stop.set()
                ends = await asyncio.wait_for(asyncio.gather(*sockets), 60)
                await asyncio.wait_for(load, 60)
                await lag
            edge_pid = stack.edge_pid
            left = children(edge_pid)
            lines = [line for _, lines in stack.notifications for line in lines]
            notify: dict[str, Any] = {
                "RELOADING=1": lines.count("RELOADING=1"),
                "READY=1": lines.count("READY=1"),
                "MAINPID": sorted({line for line in lines if line.startswith("MAINPID=")}),
                "edge_pid": edge_pid,
            }
        finally:
            stack.stop()
            if args.keep_logs is not None:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for log in workdir.glob("*.log"):
                    shutil.copy(log, args.keep_logs / log.name)
        leftovers = [pid for pid in left if Path(f"/proc/{pid}").exists()]
    report: dict[str, Any] = {"versions": [v for v, _ in wheels], "scenarios": {}}
    for phase, counts in tally.counts.items():
        latencies = sorted(tally.latencies.get(phase, []))
        failures = {k: v for k, v in counts.items() if k not in OK_KINDS}
        report["scenarios"].setdefault(phase, {}).update({
            "counts": dict(counts),
            "failures": failures,
            "errors": tally.errors.get(phase, []),
            "failed_at_s": tally.failed_at.get(phase, [])[:50],
            "loadavg_at_start": tally.load.get(phase),
            "client_loop_lags_s": tally.lags.get(phase, [])[:50],
            "connect_p50_s": round(statistics.median(latencies), 4) if latencies else None,
            "connect_max_s": round(latencies[-1], 3) if latencies else None,
        })  # fmt: skip
    for name, outcome in outcomes.items():
        report["scenarios"].setdefault(name, {})["outcome"] = outcome
    report["notify"] = notify
    report["websockets_at_end"] = dict(Counter(ends))
    report["workers_at_end"] = len(left)
    report["processes_left_after_stop"] = leftovers
    report["ok"] = (
        all(not s.get("failures") for s in report["scenarios"].values())
        and all(o["ok"] for o in outcomes.values())
        and set(ends) == {"open"}
        and not leftovers
        and notify["MAINPID"] == [f"MAINPID={notify['edge_pid']}"]
        and notify["RELOADING=1"] == notify["READY=1"] - 1  # the start's, then one per reload
    )
    return report


def summary(report: dict[str, Any]) -> list[str]:
    lines = [f"versions: {' -> '.join(report['versions'])}"]
    for name, data in report["scenarios"].items():
        counts = data.get("counts", {})
        outcome = data.get("outcome", {})
        lines.append(
            f"{name:11} new connections ok {counts.get('ok', 0):5}, failed "
            f"{sum(data.get('failures', {}).values()):3}, p50 {data.get('connect_p50_s')} s, "
            f"max {data.get('connect_max_s')} s; WebSockets closed 1001/1012 "
            f"{counts.get('ws_closed_1001', 0)}/{counts.get('ws_closed_1012', 0)}, "
            f"reconnected {counts.get('ws_reconnected', 0)}"
            + (
                f"; reload exit {outcome.get('exit')} in {outcome.get('seconds')} s"
                if "exit" in outcome
                else ""
            )
            + (f"; check {'ok' if outcome.get('ok') else 'FAILED'}" if outcome else "")
        )
    x20 = report["scenarios"].get("reload_x20", {}).get("outcome")
    if x20:
        lines.append(
            f"20 reloads: supervisor fds first/last/max {x20['fds_first_last_max']}, "
            f"RSS KiB first/last/max {x20['rss_kib_first_last_max']}"
        )
    notify = report["notify"]
    lines.append(
        f"sd_notify: RELOADING=1 x{notify['RELOADING=1']}, READY=1 x{notify['READY=1']}, "
        f"{', '.join(notify['MAINPID'])} (the edge's pid: {notify['edge_pid']})"
    )
    lines.append(
        f"WebSockets at the end: {report['websockets_at_end']}; processes left after the "
        f"stop: {report['processes_left_after_stop'] or 'none'}"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.reload", description=__doc__)
    parser.add_argument("--reloads", type=int, default=20, help="reloads in a row (scenario 4)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        default=list(SCENARIOS),
        help=f"scenarios to run, comma-separated (default: {','.join(SCENARIOS)})",
    )
    parser.add_argument("--keep-logs", type=Path, help="copy the daemons' logs to this directory")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(report, indent=1) + "\n")
    for line in summary(report):
        print(line)
    print("PASS" if report["ok"] else "FAIL", f"(results: {args.results})")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
