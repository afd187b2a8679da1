"""``make wan`` / ``python -m loadtests.wan.run``: latency from a distant region, direct vs edge.

One command builds the emulated WAN (:mod:`loadtests.wan.emulator`: user 265 ms
RTT from the origin, 10 ms from the edge), starts the Node.js app, HAProxy
(direct), the origin balancer, the edge and the nginx edge, then takes every
measurement of :data:`loadtests.wan.scenarios.MEASUREMENTS` from the ``user``
namespace for every scenario (interleaved, so that slow drifts of the shared
machine hit all alike), runs locust against each, and writes ``wan.json``,
``wan.png`` and the locust CSVs to ``loadtests/results/`` (see
:mod:`loadtests.wan.report`).

Then the same stack runs the lossy phases: for each rate of ``--loss-rates``
(0.1% and 1% by default) random loss is set on the long links (user-origin
and edge-origin, both directions, in the delay router) and the measurements
of :data:`LOSSY_STEPS` are taken again for every scenario: small GETs, 768 KB
GETs, WebSocket opens and echoes, bursts, and cold bursts and cold 768 KB
GETs right after each terminator restarts. Each phase starts after a few
untimed requests at that rate, so that connections kept across phases (the
tunnel's, nginx's pool) have met the loss before they are timed.

``--quick`` takes a few samples of everything (about a minute; the
integration test runs it); the sample counts are options. Exit status: 0 when
every measurement has samples (failed ones are counted in
``wan.json``), 1 when one got none, 2 when the emulator cannot
run here (not root, no NFQUEUE, ...), with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests.wan import report
from loadtests.wan.scenarios import (
    MEASUREMENTS,
    SCENARIOS,
    floor_ms,
    path_rtts,
)
from loadtests.wan.stack import Stack

__all__ = ["QUICK", "Plan", "main"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "loadtests" / "results"
#: geoedge's recommended tuning (deploy/sysctl/99-geoedge.conf) where geoedge runs;
#: the user's namespace keeps the kernel default, as a user's machine does.
DAEMON_SYSCTLS = {"net.ipv4.tcp_slow_start_after_idle": "0"}

Series = dict[str, list[float]]
_STARTED = time.monotonic()


def say(message: str) -> None:
    """A progress line, stamped with the seconds since the run started."""
    print(f"[{time.monotonic() - _STARTED:6.1f} s] {message}", flush=True)


@dataclass(frozen=True, slots=True)
class Plan:
    """How many samples of each measurement, per scenario (about 10 minutes in all)."""

    new: int = 20
    """Sequential new-connection GETs of the small page, per TLS version."""
    large: int = 10
    """Sequential new-connection GETs of the 768 KB response."""
    close_large: int = 20
    """Sequential ``Connection: close`` GETs of the 768 KB response per TLS version,
    each checked whole (length, content, close_notify) and against the edge's
    access log."""
    keepalive: int = 20
    """Requests on one open connection."""
    ws: int = 20
    """WebSocket opens, each with its first echo."""
    bursts: int = 3
    """Bursts of ``burst_size`` new connections, right after other traffic."""
    burst_size: int = 20
    first_bursts: int = 3
    """Restarts of the TLS terminator, each followed by one burst; as many again,
    each followed by one 768 KB GET (``first_large_tls13``)."""
    pages: int = 10
    """Page loads (30 GETs at once) per protocol offered."""
    idle_rounds: int = 3
    """Large GETs after ``idle_s`` of silence (the scenarios take turns going first)."""
    idle_s: float = 30.0
    loss: int = 30
    """New-connection GETs with 1% loss on the long link."""
    warmup: int = 10
    """Untimed small and large GETs per scenario before measuring. Through the edge a
    tunnel connection's first large response pays TCP slow start on the long link
    (~1.9 s), its second one a round trip more; requests spread over the edge's
    workers at random, so ten leave every worker's tunnel warm."""
    locust_s: int = 60
    """Seconds of locust per scenario (0: skip locust)."""
    locust_users: int = 20
    pause_s: float = 0.1
    """Pause between sequential samples."""
    lossy_small: int = 10
    """Per lossy phase: new-connection GETs of the small page, and WebSocket opens."""
    lossy_large: int = 20
    """Per lossy phase: new-connection 768 KB GETs (the judged figure)."""
    lossy_bursts: int = 2
    """Per lossy phase: bursts of ``burst_size`` right after other traffic."""
    lossy_restarts: int = 2
    """Per lossy phase: terminator restarts, each followed by a cold burst, and as
    many again each followed by one 768 KB GET."""


QUICK = Plan(
    new=2, large=1, close_large=2, keepalive=3, ws=2, bursts=1, burst_size=10, first_bursts=1,
    idle_rounds=1, idle_s=2.0, loss=2, warmup=1, locust_s=3, locust_users=4, pages=2,
    lossy_small=1, lossy_large=1, lossy_bursts=1, lossy_restarts=0,
)  # fmt: skip

#: Loss probabilities of the lossy phases, each applied to every direction of
#: :data:`LONG_LINKS`.
LOSS_RATES = (0.001, 0.01)
LONG_LINKS = (("edge", "origin"), ("user", "origin"))
#: Untimed small and large GETs per scenario at the start of a lossy phase.
LOSSY_WARMUP = 3
#: What each lossy phase measures, after other traffic: (key, batch kind, Plan
#: field giving the count). Cold bursts and cold 768 KB GETs follow restarts.
LOSSY_STEPS = (
    ("new_small_tls13", "new", "lossy_small"),
    ("new_large_tls13", "new", "lossy_large"),
    ("burst20_small_tls13", "burst", "lossy_bursts"),
)


def loss_label(rate: float) -> str:
    """The key of a lossy phase in ``wan.json``: ``"loss_0.1%"``."""
    return f"loss_{rate * 100:g}%"


class Runner:
    """Takes the samples: one measuring agent in the user namespace, fed JSON batches."""

    def __init__(self, stack: Stack, plan: Plan) -> None:
        self.stack = stack
        self.plan = plan
        self.samples: dict[str, dict[str, list[float]]] = {s: {} for s in SCENARIOS}
        self.errors: dict[str, dict[str, list[str]]] = {s: {} for s in SCENARIOS}
        self.negotiated: dict[str, dict[str, Any]] = {s: {} for s in SCENARIOS}
        #: (path, octets received) of every ``close`` sample, per scenario
        self.received: dict[str, list[tuple[str, int]]] = {s: [] for s in SCENARIOS}

    def batch(self, scenario: str, kind: str, **fields: Any) -> tuple[Series, list[str]]:
        """One batch of samples from the agent: (series by name, errors)."""
        where = SCENARIOS[scenario]
        host = self.stack.wan.address(where.terminator)
        spec = {"host": host, "port": where.port, "ca": self.stack.files.ca, "kind": kind}
        reply = self.stack.agent_request({**spec, "pause_s": self.plan.pause_s, **fields})
        if "fatal" in reply:
            raise RuntimeError(f"measuring agent refused a batch: {reply['fatal']}")
        negotiated = reply["negotiated"]
        if negotiated:  # one example per TLS version: shows both scenarios agree
            self.negotiated[scenario].setdefault(negotiated["version"], negotiated)
        self.received[scenario].extend(tuple(r) for r in reply.get("received", ()))
        return reply["series"], reply["errors"]

    def record(self, scenario: str, key: str, values: list[float], errors: list[str]) -> None:
        self.samples[scenario].setdefault(key, []).extend(values)
        if errors:
            self.errors[scenario].setdefault(key, []).extend(errors)
            say(f"  {scenario} {key}: {len(errors)} failed, first: {errors[0]}")

    def measure(self, scenario: str, key: str, kind: str, series_name: str, **fields: Any) -> None:
        m = MEASUREMENTS[key]
        series, errors = self.batch(scenario, kind, tls=m.tls, path=m.path, alpn=m.alpn, **fields)
        self.record(scenario, key, series.get(series_name, []), errors)

    def warm_up(self, scenario: str, count: int | None = None) -> None:
        for path in ("/", "/large"):
            count = self.plan.warmup if count is None else count
            self.batch(scenario, "new", path=path, count=count, pause_s=0.0)

    def websocket(self, scenario: str, count: int | None = None) -> None:
        count = self.plan.ws if count is None else count
        series, errors = self.batch(scenario, "ws", path="/ws", count=count)
        self.record(scenario, "ws_open_tls13", series.get("ws_open_ms", []), errors)
        self.record(scenario, "ws_echo_tls13", series.get("ws_echo_ms", []), [])

    def steady(self) -> None:
        """Everything measured right after other traffic, one scenario after the other
        for each measurement, so that drifts of the shared machine hit both alike."""
        p = self.plan
        steps: list[tuple[str, str, dict[str, int]]] = [
            ("new_small_tls13", "new", {"count": p.new}),
            ("new_small_tls12", "new", {"count": p.new}),
            ("new_large_tls13", "new", {"count": p.large}),
            ("close_large_tls13", "close", {"count": p.close_large}),
            ("close_large_tls12", "close", {"count": p.close_large}),
            ("keepalive_small", "keepalive", {"count": p.keepalive}),
            ("burst20_small_tls13", "burst", {"count": p.bursts, "burst": p.burst_size}),
            ("page30_tls13", "page", {"count": p.pages}),
            ("page30_h1_tls13", "page", {"count": p.pages}),
        ]
        for key, kind, fields in steps:
            say(f"  {key}")
            for scenario in SCENARIOS:
                self.measure(scenario, key, kind, "total_ms", **fields)
        say("  ws_open_tls13, ws_echo_tls13")
        for scenario in SCENARIOS:
            self.websocket(scenario)

    def idle(self) -> None:
        """Large GETs after silence; the scenarios alternate going first."""
        order = list(SCENARIOS)
        for i in range(self.plan.idle_rounds):
            say(f"  idle round {i + 1}/{self.plan.idle_rounds}: {self.plan.idle_s:g} s silence")
            time.sleep(self.plan.idle_s)
            for scenario in order if i % 2 == 0 else order[::-1]:
                self.measure(scenario, "idle30_large_tls13", "new", "total_ms", count=1)

    def first_bursts(self, rounds: int | None = None) -> None:
        p = self.plan
        rounds = p.first_bursts if rounds is None else rounds
        for i in range(rounds):
            for scenario in SCENARIOS:
                self.stack.restart(scenario)
                say(f"  {scenario} restarted ({i + 1}/{rounds}), first burst")
                self.measure(
                    scenario, "first_burst20_small_tls13", "burst", "total_ms",
                    count=1, burst=p.burst_size,
                )  # fmt: skip
                self.stack.restart(scenario)
                say(f"  {scenario} restarted ({i + 1}/{rounds}), first 768 KB")
                self.measure(scenario, "first_large_tls13", "new", "total_ms", count=1)

    def lossy(self) -> None:
        wan = self.stack.wan
        set_loss(wan, 0.01)
        try:
            for scenario in SCENARIOS:
                self.measure(scenario, "loss1_small_tls13", "new", "total_ms", count=self.plan.loss)
        finally:
            set_loss(wan, 0.0)

    def lossy_phase(self, rate: float) -> None:
        """The measurements of :data:`LOSSY_STEPS`, WebSockets and cold starts with
        ``rate`` loss on the long links (this runner holds that phase's samples)."""
        p = self.plan
        set_loss(self.stack.wan, rate)
        try:
            for scenario in SCENARIOS:
                self.warm_up(scenario, min(p.warmup, LOSSY_WARMUP))
            for key, kind, count_field in LOSSY_STEPS:
                say(f"  {key}")
                count = getattr(p, count_field)
                extra = {"burst": p.burst_size} if kind == "burst" else {}
                for scenario in SCENARIOS:
                    self.measure(scenario, key, kind, "total_ms", count=count, **extra)
            say("  ws_open_tls13, ws_echo_tls13")
            for scenario in SCENARIOS:
                self.websocket(scenario, p.lossy_small)
            say("  cold starts: first_burst20_small_tls13, first_large_tls13")
            self.first_bursts(p.lossy_restarts)
        finally:
            set_loss(self.stack.wan, 0.0)

    def access_log_check(self, access_log: Path) -> dict[str, Any]:
        """The edge's access log against what each ``close`` client received:
        ``bytes_out`` must be exactly the octets the client got."""
        logged: dict[str, int] = {}
        if access_log.exists():
            for line in access_log.read_text(errors="replace").splitlines():
                if "wan_sample=" in line:
                    entry = json.loads(line)
                    logged[entry["path"]] = entry["bytes_out"]
        mismatches = [
            {"path": path, "received": received, "logged": logged.get(path)}
            for path, received in self.received["edge"]
            if logged.get(path) != received
        ]
        return {
            "samples": len(self.received["edge"]),
            "matched": len(self.received["edge"]) - len(mismatches),
            "mismatches": mismatches[:10],
        }

    def run(self) -> None:
        for scenario in SCENARIOS:
            say(f"warming up {scenario}")
            self.warm_up(scenario)
        say("measuring right after other traffic")
        self.steady()
        say("idle measurements")
        self.idle()
        say("first bursts after a restart")
        self.first_bursts()
        say("1% loss on the long link")
        self.lossy()
        say("pages from the edge's cache")
        self.cached_pages()

    def cached_pages(self) -> None:
        """A page another user loaded (one untimed load first), and the same page
        stale under stale-while-revalidate (max-age=1: 1.5 s after each load)."""
        pages = self.plan.pages
        for scenario in SCENARIOS:
            for key in ("page30_cached_tls13", "page30_swr_tls13"):
                m = MEASUREMENTS[key]
                self.batch(scenario, "page", tls=m.tls, path=m.path, alpn=m.alpn, count=1)
            self.measure(scenario, "page30_cached_tls13", "page", "total_ms", count=pages)
            for _ in range(pages):
                time.sleep(1.5)
                self.measure(scenario, "page30_swr_tls13", "page", "total_ms", count=1)


def set_loss(wan: Any, rate: float) -> None:
    """``rate`` random loss on every direction of the long links (the delay router)."""
    for a, b in LONG_LINKS:
        wan.set_pair(a, b, loss=rate)


def _one_way_delays(stack: Stack) -> dict[tuple[str, str], float]:
    return {pair: params.delay_ms for pair, params in stack.wan.links.items()}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtests.wan.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few samples of everything")
    parser.add_argument("--results", type=Path, default=RESULTS, help="output directory")
    parser.add_argument("--keep-logs", action="store_true", help="keep the daemons' logs")
    parser.add_argument(
        "--loss-rates", type=_rates, default=LOSS_RATES, metavar="P,P",
        help="loss probabilities of the lossy phases (default 0.001,0.01; '' for none)",
    )  # fmt: skip
    parser.add_argument(
        "--daemon-toml", default="", metavar="TOML",
        help="appended to the edge's and the origin's configurations, for an A/B run"
        " (e.g. $'[tunnel]\\ncongestion_control = \"\"' for the host's CUBIC)",
    )  # fmt: skip
    parser.add_argument(
        "--lossy-only", action="store_true",
        help="skip the loss-free measurements and locust (the lossy phases alone)",
    )  # fmt: skip
    for f in dataclasses.fields(Plan):
        kind = float if f.type == "float" else int
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, type=kind, default=None, help=f"(default {f.default})")
    return parser


def _rates(text: str) -> tuple[float, ...]:
    rates = tuple(float(word) for word in text.split(",") if word.strip())
    if not all(0.0 < rate < 1.0 for rate in rates):
        raise argparse.ArgumentTypeError(f"loss rates must be in (0, 1): {text!r}")
    return rates


def plan_from(args: argparse.Namespace) -> Plan:
    base = QUICK if args.quick else Plan()
    changes = {f.name: getattr(args, f.name) for f in dataclasses.fields(Plan)}
    return dataclasses.replace(base, **{k: v for k, v in changes.items() if v is not None})


@contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    if keep:
        path = Path(tempfile.mkdtemp(prefix="geoedge-wan-"))
        print(f"logs and configs in {path}")
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="geoedge-wan-") as name:
        yield Path(name)


def main(argv: list[str] | None = None) -> int:
    global _STARTED
    args = _parser().parse_args(argv)
    plan = plan_from(args)
    _STARTED = time.monotonic()
    from loadtests.wan.emulator import unsupported_reason

    reason = unsupported_reason()
    if reason is not None:
        print(f"WAN emulator unavailable: {reason}", file=sys.stderr)
        return 2
    args.results.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    extra = {"edge": args.daemon_toml, "origin": args.daemon_toml}
    with (
        _workdir(args.keep_logs) as workdir,
        Stack(workdir, DAEMON_SYSCTLS, toml_extra=extra) as stack,
    ):
        runner = Runner(stack, plan)
        if not args.lossy_only:
            runner.run()
        locust = {}
        if plan.locust_s > 0 and not args.lossy_only:
            for scenario in SCENARIOS:
                say(f"locust against {scenario} for {plan.locust_s} s")
                locust[scenario] = stack.locust(
                    scenario, args.results, plan.locust_s, plan.locust_users
                )
        lossy: dict[float, Runner] = {}
        for rate in args.loss_rates:
            say(f"{loss_label(rate)}: random loss on the long links, both ways")
            lossy[rate] = Runner(stack, plan)
            lossy[rate].lossy_phase(rate)
        delays = _one_way_delays(stack)
        time.sleep(1.5)  # the edge writes its access-log lines within a second
        access = runner.access_log_check(Path(stack.files.edge_access_log))
        say(f"edge access log vs what clients received: {access['matched']}/{access['samples']}")
        config = {
            **stack.describe(),
            "emulator": stack.emulator_counters(),
            "edge_access_log_check": access,
        }
    floors = {
        s: {k: floor_ms(m, path_rtts(SCENARIOS[s], delays)) for k, m in MEASUREMENTS.items()}
        for s in SCENARIOS
    }
    results = report.build_results(
        runner.samples, runner.errors, floors,
        config={**config, "plan": dataclasses.asdict(plan), "quick": args.quick,
                "negotiated": runner.negotiated, "lossy_only": args.lossy_only,
                "daemon_toml": args.daemon_toml,
                "long_links": [f"{a}-{b}" for a, b in LONG_LINKS]},
        locust=locust, elapsed_s=time.monotonic() - started,
    )  # fmt: skip
    results["lossy"] = {
        loss_label(rate): report.build_phase(r.samples, r.errors, floors, loss=rate)
        for rate, r in lossy.items()
    }
    report.write(results, args.results)
    print(report.format_table(results))
    expected = [] if args.lossy_only else [(results, k) for k in MEASUREMENTS]
    for phase in results["lossy"].values():
        expected += [(phase, k) for k in phase["measured"]]
    missing = [f"{s}/{k}" for rows, k in expected for s in SCENARIOS if not rows[s][k]["n"]]
    if missing:
        print(f"no samples for: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
