"""The HTTP caching conformance suite through the whole chain: ``make cache-tests``.

http-tests/cache-tests (npm ``http-cache-tests``, pinned below) is the suite
behind cache-tests.fyi, where ATS, httpd, Squid, Varnish, nginx and the CDNs
are scored. Here it runs as issue 30 judges the edge:

    suite's client ──HTTPS──▶ edge ══ tunnel ══▶ origin ──▶ suite's Node.js server

the edge configured with a working local config plus
``deploy/config/cache.example.toml`` appended as it stands (``--cache-config``
names another file, ``--cache-config ''`` none: the chain without a cache).

It prints the score, ``N of M required tests pass``, counted as the suite's
own page counts it (``lib/display.mjs``: a test passes when its result is
true and every test it depends on passed), then each required test that did
not pass with the suite's reason, and the optimal and check tests' results in
one line each. ``--json FILE`` writes the raw results; ``--id ID`` runs one
test with the suite's dump of every request and response.

The suite installs into ``.tools/cache-tests`` (``npm install``, the pinned
version) the first time; ``make tools`` does it ahead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from geoedge import devstack
from geoedge.devstack import ProcessGroup, free_port

ROOT = Path(__file__).resolve().parent.parent
SUITE_VERSION = "0.4.5"
SUITE_PREFIX = ROOT / ".tools" / "cache-tests"
SUITE_DIR = SUITE_PREFIX / "node_modules" / "http-cache-tests"
META_SCRIPT = Path(__file__).with_name("cache_tests_meta.mjs")
CACHE_EXAMPLE = ROOT / "deploy" / "config" / "cache.example.toml"

PASS_RESULTS = ("pass", "yes")


class SuiteUnavailable(RuntimeError):
    """The suite is not installed and could not be (no npm, no registry)."""


def suite_installed() -> bool:
    package = SUITE_DIR / "package.json"
    if not package.is_file():
        return False
    return bool(json.loads(package.read_text()).get("version") == SUITE_VERSION)


def ensure_suite() -> Path:
    """The suite's package directory, installed with npm if need be."""
    if suite_installed():
        return SUITE_DIR
    SUITE_PREFIX.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            "npm",
            "install",
            "--prefix",
            str(SUITE_PREFIX),
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            f"http-cache-tests@{SUITE_VERSION}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not suite_installed():
        raise SuiteUnavailable(f"npm install http-cache-tests failed:\n{done.stderr[-2000:]}")
    return SUITE_DIR


# ------------------------------------------------------------------ scoring


@dataclass(frozen=True, slots=True)
class TestInfo:
    kind: str
    depends_on: tuple[str, ...]
    name: str


def load_meta(suite: Path) -> dict[str, TestInfo]:
    out = subprocess.run(
        ["node", str(META_SCRIPT), str(suite)], capture_output=True, text=True, check=True
    ).stdout
    return {
        test_id: TestInfo(info["kind"], tuple(info["depends_on"]), info["name"])
        for test_id, info in json.loads(out).items()
    }


def verdict(meta: dict[str, TestInfo], results: dict[str, object], test_id: str) -> str:
    """What the suite's page shows for one test (lib/display.mjs determineTestResult)."""
    result = results.get(test_id)
    if result is None:
        return "untested"
    info = meta[test_id]
    for dependency in info.depends_on:
        if verdict(meta, results, dependency) not in PASS_RESULTS:
            return "dependency_fail"
    if isinstance(result, list) and result and result[0] == "Setup":
        return "retry" if len(result) > 1 and result[1] == "retry" else "setup_fail"
    if info.kind == "required":
        return "pass" if result is True else "fail"
    if info.kind == "optimal":
        return "pass" if result is True else "optional_fail"
    return "yes" if result is True else "no"


@dataclass(frozen=True, slots=True)
class Score:
    passed: int
    required: int
    failing: dict[str, str]
    """Required tests that did not pass: their verdict and the suite's reason."""
    others: dict[str, str]
    """Optimal and check tests: their verdict."""


def score(meta: dict[str, TestInfo], results: dict[str, object]) -> Score:
    passed, failing, others = 0, {}, {}
    required = [t for t, info in meta.items() if info.kind == "required"]
    for test_id in required:
        seen = verdict(meta, results, test_id)
        if seen == "pass":
            passed += 1
        else:
            result = results.get(test_id)
            reason = result[1] if isinstance(result, list) and len(result) > 1 else ""
            failing[test_id] = f"{seen}: {reason}"
    for test_id, info in meta.items():
        if info.kind != "required":
            others[test_id] = verdict(meta, results, test_id)
    return Score(passed, len(required), failing, others)


# ------------------------------------------------------------------ the chain


class Chain:
    """The suite's server, an origin and an edge, on free ports of 127.0.0.1."""

    def __init__(self, workdir: Path, suite: Path, cache_config: str, workers: int = 1) -> None:
        self.workdir = workdir
        self.suite = suite
        self.cache_config = cache_config
        self.workers = workers
        self.group = ProcessGroup()
        self.https_port = free_port()
        self.keys = devstack.make_dev_pki(
            workdir / "pki", edge_id="cache-tests-edge", origin_id="cache-tests-origin"
        )

    def start(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        work, keys = self.workdir, self.keys
        server_port, tunnel_port = free_port(), free_port()
        origin_admin, edge_admin = free_port(), free_port()
        env = dict(
            os.environ,
            npm_config_port=str(server_port),
            npm_config_protocol="http",
            npm_config_pidfile=str(work / "server.pid"),
        )
        server_log = work / "server.log"
        server = self.group.spawn(
            "server",
            ["node", "server/server.mjs"],
            log=server_log,
            cwd=self.suite,
            env=env,
        )
        devstack.wait_port(server_port, deadline, server, server_log)
        origin_toml = work / "origin.toml"
        origin_toml.write_text(
            devstack.origin_toml(
                keys,
                origin_id=keys.origin_id,
                tunnel_port=tunnel_port,
                admin_port=origin_admin,
                allowed_identities=[keys.edge_id],
                backends=[server_port],
                log_level="warning",
            )
        )
        edge_toml = work / "edge.toml"
        text = devstack.edge_toml(
            keys,
            edge_id=keys.edge_id,
            https_port=self.https_port,
            admin_port=edge_admin,
            origins=[("origin", tunnel_port)],
            workers=self.workers,
            access_log=str(work / "access.log"),
        )
        if self.cache_config:
            text += "\n" + Path(self.cache_config).read_text()
        edge_toml.write_text(text)
        python = sys.executable
        for name, argv, admin in (
            ("origin", [python, "-m", "origin", "--config", str(origin_toml)], origin_admin),
            ("edge", [python, "-m", "edge", "--config", str(edge_toml)], edge_admin),
        ):
            log = work / f"{name}.log"
            proc = self.group.spawn(name, argv, log=log, cwd=ROOT)
            devstack.wait_healthy(admin, deadline, name, log, (proc,))

    def run_client(self, test_id: str = "", timeout_s: float = 600.0) -> str:
        env = dict(
            os.environ,
            npm_config_base=f"https://localhost:{self.https_port}",
            npm_config_id=test_id,
            npm_package_config_id=test_id,  # cli.mjs reads `id || this`
            NODE_EXTRA_CA_CERTS=str(self.keys.ca),
        )
        done = subprocess.run(
            ["node", "--no-warnings", "cli.mjs"],
            cwd=self.suite,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the suite's client failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def stop(self) -> None:
        self.group.stop()


def run_suite(cache_config: str, workers: int = 1) -> tuple[Score, dict[str, object]]:
    """The whole suite through a fresh chain: its score and its raw results."""
    suite = ensure_suite()
    meta = load_meta(suite)
    with tempfile.TemporaryDirectory(prefix="geoedge-cache-tests-") as tmp:
        chain = Chain(Path(tmp), suite, cache_config, workers)
        try:
            chain.start()
            output = chain.run_client()
        finally:
            chain.stop()
    results: dict[str, object] = json.loads(output)
    return score(meta, results), results


def report(result: Score) -> str:
    passed, required = result.passed, result.required
    lines = [f"cache-tests {SUITE_VERSION}: {passed} of {required} required tests pass"]
    for test_id, why in sorted(result.failing.items()):
        lines.append(f"  not passed: {test_id}: {why}")
    tally: dict[str, int] = {}
    for seen in result.others.values():
        tally[seen] = tally.get(seen, 0) + 1
    lines.append(
        "  optimal and check tests: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-config",
        default=str(CACHE_EXAMPLE) if CACHE_EXAMPLE.exists() else "",
        help="TOML appended to the edge's config ('' for none)",
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--id", default="", help="run one test, with the suite's dump")
    parser.add_argument("--json", default="", help="write the raw results here")
    parser.add_argument("--keep", action="store_true", help="print the work directory's logs")
    args = parser.parse_args(argv)
    if args.id:
        suite = ensure_suite()
        with tempfile.TemporaryDirectory(prefix="geoedge-cache-tests-") as tmp:
            chain = Chain(Path(tmp), suite, args.cache_config, args.workers)
            try:
                chain.start()
                print(chain.run_client(args.id))
            finally:
                chain.stop()
                if args.keep:
                    for name in ("edge", "origin", "access"):
                        print(f"==== {name}.log\n{devstack.tail(Path(tmp) / f'{name}.log')}")
        return 0
    result, results = run_suite(args.cache_config, args.workers)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
