"""The processes of both scenarios inside one emulated WAN, started and stopped by PID.

``app``: the Node.js sample app. ``origin``: HAProxy (the direct scenario's TLS
terminator, and the origin the nginx edge proxies to) and the origin balancer
(the tunnel's far end), side by side as they would share a data centre.
``edge``: the geoedge edge and the nginx edge (:mod:`loadtests.wan.nginx`) on
ports of their own. ``user``: the
measuring agent (:mod:`loadtests.wan.measure`) and locust. One private CA
issues the users' server certificate (with the edge's and the origin's
addresses as IP SANs, so one certificate serves both scenarios) and the tunnel's
mutual-TLS certificates.

Every process is started with :meth:`WanEmulator.popen`, so the emulator's
teardown stops whatever is left; restarts stop the old process by its PID.
Each daemon logs to a file in the work directory; when start-up fails the tail
of that log is in the error.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from edge.config import MOZILLA_INTERMEDIATE_CIPHERS
from geoedge import pki
from loadtests.wan import report
from loadtests.wan.emulator import WanEmulator
from loadtests.wan.nginx import nginx_conf
from loadtests.wan.scenarios import (
    APP_PORT,
    EDGE_ADMIN,
    EDGE_IDENTITY,
    HTTPS_PORT,
    ORIGIN_ADMIN,
    ORIGIN_IDENTITY,
    SCENARIOS,
    StackFiles,
    edge_toml,
    haproxy_cfg,
    origin_toml,
)

__all__ = ["Stack", "StackError"]

ROOT = Path(__file__).resolve().parents[2]
NODE_APP = ROOT / "deploy" / "node-app" / "server.js"
LOCUSTFILE = ROOT / "loadtests" / "locustfile.py"
READY_TIMEOUT_S = 30.0


class StackError(RuntimeError):
    """A process of the stack did not start, or stopped answering."""


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


class Stack:
    """``with Stack(workdir, sysctls) as stack:`` everything is up and healthy inside."""

    def __init__(
        self,
        workdir: Path,
        daemon_sysctls: Mapping[str, str],
        *,
        edge_workers: int = 0,
        origin_workers: int = 0,
        toml_extra: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.daemon_sysctls = dict(daemon_sysctls)
        self.edge_workers = edge_workers
        self.origin_workers = origin_workers
        self.wan = WanEmulator(
            congctl="cubic",
            sysctls={"edge": daemon_sysctls, "origin": daemon_sysctls},
            tag=os.environ.get("GEOEDGE_WAN_TAG"),  # e.g. a branch's own namespace names
        )
        self.procs: dict[str, subprocess.Popen[Any]] = {}
        self._log_files: list[IO[bytes]] = []
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        #: TOML appended to the daemons' configurations ("edge", "origin"), to
        #: compare a variant against the shipped defaults (an A/B run).
        self.toml_extra: dict[str, str] = dict(toml_extra or {})

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Stack:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.files = self._issue_certificates()
        self.wan.up()
        try:
            self._write_configs()
            self._start("app", "app", ["node", str(NODE_APP), str(APP_PORT), "--host",
                                       self.wan.address("app")])  # fmt: skip
            self.wait("app", f"http://{self.wan.address('app')}:{APP_PORT}/health", "app")
            self._start_terminator("direct")
            self._start("origin", "origin", [sys.executable, "-m", "origin", "--config",
                                             str(self.workdir / "origin.toml")])  # fmt: skip
            self.wait("origin", f"http://{ORIGIN_ADMIN}/healthz", "origin")
            self._start_terminator("edge")
            self._start_terminator("nginx")
            self._start(
                "agent", "user", [sys.executable, "-m", "loadtests.wan.measure", "agent"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        agent = self.procs.get("agent")
        if agent is not None and agent.stdin is not None and agent.poll() is None:
            agent.stdin.close()  # the agent exits on EOF
        try:
            for name in reversed(list(self.procs)):  # clients first, the app last
                self._stop(name)
        finally:
            self.wan.down()
            for f in self._log_files:
                f.close()

    # ------------------------------------------------------------------ set-up

    def _issue_certificates(self) -> StackFiles:
        d = self.workdir / "pki"
        pki.create_ca(d / "ca")
        ca = pki.load_ca(d / "ca")
        edge_ip, origin_ip = self.wan.address("edge"), self.wan.address("origin")
        server = pki.issue_server_cert(ca, d, "server", ["app.geoedge.test", edge_ip, origin_ip])
        combined = d / "server-combined.pem"
        combined.write_bytes(server.cert.read_bytes() + server.key.read_bytes())
        combined.chmod(0o600)
        edge = pki.issue_peer_cert(ca, d, "edge", EDGE_IDENTITY, role="edge")
        origin = pki.issue_peer_cert(
            ca, d, "origin", ORIGIN_IDENTITY, role="origin", dns_names=[origin_ip]
        )
        return StackFiles(
            ca=str(ca.paths.cert), server_cert=str(server.cert), server_key=str(server.key),
            server_pem=str(combined), edge_cert=str(edge.cert), edge_key=str(edge.key),
            origin_cert=str(origin.cert), origin_key=str(origin.key),
            edge_access_log=str(self.logs / "edge-access.log"),
        )  # fmt: skip

    def _write_configs(self) -> None:
        addresses = {h: self.wan.address(h) for h in ("user", "edge", "origin", "app")}
        w = self.workdir
        edge = edge_toml(self.files, addresses, workers=self.edge_workers)
        origin = origin_toml(self.files, addresses, workers=self.origin_workers)
        (w / "edge.toml").write_text(edge + self.toml_extra.get("edge", ""))
        (w / "origin.toml").write_text(origin + self.toml_extra.get("origin", ""))
        (w / "haproxy.cfg").write_text(
            haproxy_cfg(self.files, addresses, MOZILLA_INTERMEDIATE_CIPHERS)
        )
        (w / "nginx.conf").write_text(
            nginx_conf(self.files, addresses, w, MOZILLA_INTERMEDIATE_CIPHERS)
        )

    def _start(self, name: str, host: str, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed in __exit__
        self._log_files.append(log)
        kw.setdefault("stdout", log)
        proc = self.wan.popen(host, argv, stderr=log, cwd=ROOT, env=self.env, **kw)
        self.procs[name] = proc
        return proc

    def _stop(self, name: str, timeout_s: float = 10.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def wait(self, host: str, url: str, name: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll ``url`` from inside ``host``'s namespace until it is ready; fail at once
        if process ``name`` exits meanwhile."""
        argv = [sys.executable, "-m", "loadtests.wan.measure", "wait", url]
        argv += ["--timeout", str(timeout_s)]
        waiter = subprocess.Popen(
            self.wan.exec_argv(host, argv), cwd=ROOT, env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        proc = self.procs.get(name)
        deadline = time.monotonic() + timeout_s + 15
        while waiter.poll() is None and time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.05)
        if waiter.poll() is None:
            waiter.kill()
        _, stderr = waiter.communicate(timeout=5)
        if waiter.returncode != 0:
            status = "running" if proc is not None and proc.poll() is None else "exited"
            raise StackError(
                f"{name} not ready ({url}, {status}): {stderr.strip()}\n"
                f"--- {name}.log ---\n{_tail(self.logs / f'{name}.log')}"
            )

    # ------------------------------------------------------------------ terminators

    #: The process that terminates each scenario's TLS (what a restart stops).
    TERMINATORS = {"direct": "haproxy", "edge": "edge", "nginx": "nginx"}

    def _start_terminator(self, scenario: str) -> None:
        if scenario == "direct":
            haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
            config = str(self.workdir / "haproxy.cfg")
            self._start("haproxy", "origin", [haproxy, "-db", "-f", config])
            self.wait("origin", f"tcp://{self.wan.address('origin')}:{HTTPS_PORT}", "haproxy")
        elif scenario == "nginx":
            nginx = shutil.which("nginx") or "/usr/sbin/nginx"
            self._start("nginx", "edge", [nginx, "-c", str(self.workdir / "nginx.conf")])
            port = SCENARIOS["nginx"].port
            self.wait("edge", f"tcp://{self.wan.address('edge')}:{port}", "nginx")
        else:
            argv = [sys.executable, "-m", "edge", "--config", str(self.workdir / "edge.toml")]
            self._start("edge", "edge", [*argv, "--log-format", "plain"])
            self.wait("edge", f"http://{EDGE_ADMIN}/healthz", "edge")

    def restart(self, scenario: str) -> None:
        """Stop the scenario's TLS terminator by PID, start it, wait until it is ready
        (the edge: its admin ``/healthz`` is 200, i.e. a tunnel is up; nginx and
        HAProxy: their port accepts)."""
        self._stop(self.TERMINATORS[scenario])
        self._start_terminator(scenario)

    # ------------------------------------------------------------------ clients

    def agent_request(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Send one batch to the measuring agent and return its JSON answer."""
        agent = self.procs["agent"]
        assert agent.stdin is not None and agent.stdout is not None
        agent.stdin.write(json.dumps(batch) + "\n")
        agent.stdin.flush()
        rounds = batch.get("count", 1) * (2 if batch["kind"] == "ws" else 1)
        timeout_s = 30.0 + rounds * float(batch.get("timeout_s", 30.0))
        ready, _, _ = select.select([agent.stdout], [], [], timeout_s)
        line = agent.stdout.readline() if ready else ""
        if not line:
            raise StackError(
                f"measuring agent gave no answer ({'exited' if ready else 'timed out'}):\n"
                + _tail(self.logs / "agent.log")
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    def locust(self, scenario: str, results: Path, seconds: int, users: int) -> dict[str, Any]:
        """Run locust headless from the user namespace; its CSVs go to ``results``."""
        host = self.wan.address(SCENARIOS[scenario].terminator)
        port = SCENARIOS[scenario].port
        prefix = results / f"locust_{scenario}"
        argv = [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "-u", str(users), "-r", str(max(1, users // 2)), "-t", f"{seconds}s",
            "--stop-timeout", "5", "--csv", str(prefix), "--host", f"https://{host}:{port}",
            "--only-summary", "--loglevel", "WARNING",
        ]  # fmt: skip
        env = {**self.env, "GEOEDGE_WAN_CA": self.files.ca}
        started = time.monotonic()
        with open(self.logs / f"locust_{scenario}.log", "ab") as log:
            proc = self.wan.popen(
                "user", argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            code = proc.wait(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=5)
        summary = report.read_locust_stats(Path(f"{prefix}_stats.csv"))
        summary["exit_status"] = code
        summary["duration_s"] = round(time.monotonic() - started, 1)
        summary["users"] = users
        return summary

    def describe(self) -> dict[str, Any]:
        """What the run was configured with, for ``wan.json``."""
        return {
            "one_way_delays_ms": {f"{a}>{b}": p.delay_ms for (a, b), p in self.wan.links.items()},
            "congctl": self.wan.congctl,
            "sysctls_edge_and_origin": self.daemon_sysctls,
            "edge_workers": self.edge_workers or os.cpu_count(),
            "origin_workers": self.origin_workers or os.cpu_count(),
            "haproxy": subprocess.run(
                ["haproxy", "-v"], capture_output=True, text=True, check=False
            ).stdout.splitlines()[:1],
            "nginx": subprocess.run(
                ["nginx", "-v"], capture_output=True, text=True, check=False
            ).stderr.splitlines()[:1],
        }

    def emulator_counters(self) -> dict[str, Any]:
        """Drops the emulator made (configured loss) or suffered (full queue, netlink
        overrun) and how late it released packets: a sample's outlier with no loss
        configured is the machine's, not the path's, when these are all zero."""
        stats = self.wan.statistics()
        links = {
            name: {k: link[k] for k in ("packets", "dropped_loss", "dropped_queue")}
            for name, link in stats["links"].items()
            if link["packets"]
        }
        # Kernel-side NFQUEUE drops: columns queue_dropped and user_dropped.
        done = subprocess.run(
            self.wan.exec_argv("router", ["cat", "/proc/net/netfilter/nfnetlink_queue"]),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        fields = done.stdout.split()
        kernel = {"queue_dropped": int(fields[5]), "user_dropped": int(fields[6])} if (
            len(fields) >= 7
        ) else {}  # fmt: skip
        return {
            "links": links,
            "netlink_overruns": stats["netlink_overruns"],
            "late_mean_us": stats["late_mean_us"],
            "late_max_us": stats["late_max_us"],
            "nfqueue": kernel,
        }
