"""``make mutation``: how many deliberate bugs the suite lets through.

mutmut (3.x) rewrites the modules that matter most one small change at a
time (an operator flipped, a constant moved, a call dropped) and runs the
tests that cover the changed function; a *surviving* mutant is a change no
test noticed. On demand, not on CI: it takes from minutes (the balancer) to
hours (the mux) on a 2-core machine.

Each target runs in a scratch copy of the tracked tree (mutmut writes its
``mutants/`` beside the code it mutates) with its own test selection: the
unit and property tests of that layer. The long fuzz loops are left out (the
same inputs, 20,000 times, for every mutant); their Hypothesis parts stay. So
are the tests that read the package's source for its imports (the mutated
source imports mutmut).

Prints, per target, killed / survived / not covered and the surviving rate
((survived + not covered) / total), and writes them with every survivor's
diff to ``loadtests/results/mutation.json`` (``--output``). README.md quotes
the rates; a survivor worth a test gets one (see that file's history).

A fixed subset (``--only edge/http1/chunked.py``, a glob per file, repeatable)
keeps the long targets to a size that runs in an afternoon; ``--tree`` runs the
same target on another checkout (a worktree of an older commit: the suite
before a change), so a before and an after figure count the same mutants when
the mutated files are the same in both trees. The subset is part of the
figure's name in the results file.
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

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    name: str
    source: str
    tests: tuple[str, ...]
    deselect: tuple[str, ...] = ()


TARGETS = (
    Target(
        "origin/balancer.py",
        "origin/balancer.py",
        ("tests/unit/test_origin_balancer.py", "tests/unit/test_origin_balancer_props.py"),
    ),
    Target(
        "edge/http1",
        "edge/http1",
        (
            "tests/unit/test_http1_request.py",
            "tests/unit/test_http1_response.py",
            "tests/property/test_http1_props.py",
            "tests/fuzz/test_http1_fuzz.py",
        ),
        (
            # Reads the package's source for its imports: mutmut's own import is in it.
            "tests/unit/test_http1_request.py::test_http1_package_imports_no_io_modules",
            "tests/fuzz/test_http1_fuzz.py::test_mutated_requests_never_raise_nor_smuggle",
            "tests/fuzz/test_http1_fuzz.py::test_mutated_responses_never_raise_and_forward_a_prefix",
        ),
    ),
    Target(
        "tunnel/mux",
        "tunnel/mux",
        (
            "tests/unit/test_mux_frames.py",
            "tests/unit/test_mux_session.py",
            "tests/unit/test_mux_window.py",
            "tests/property/test_mux_props.py",
            "tests/fuzz/test_mux_fuzz.py",
        ),
        ("tests/fuzz/test_mux_fuzz.py::test_many_mutated_sessions",),
    ),
)

#: The packages a test may import besides the one mutated (mutmut copies them).
PACKAGES = ("tunnel", "edge", "origin", "geoedge", "deploy")


def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line for line in out.splitlines() if (root / line).is_file()]


def scratch_tree(root: Path, dest: Path) -> None:
    for rel in tracked_files(root):
        if rel.split("/", 1)[0] in (*PACKAGES, "tests"):
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, target)


def figure_name(target: Target, only: tuple[str, ...]) -> str:
    """The results file's key: the target, and the subset when there is one."""
    return f"{target.name} (only {', '.join(only)})" if only else target.name


def setup_cfg(target: Target, only: tuple[str, ...] = ()) -> str:
    def block(key: str, values: tuple[str, ...]) -> str:
        return f"{key} =\n" + "".join(f"    {v}\n" for v in values)

    args = ("-p", "no:cacheprovider", "-q", "-x", *(f"--deselect={d}" for d in target.deselect))
    return (
        "[mutmut]\n"
        f"source_paths = {target.source}\n"
        + block("pytest_add_cli_args_test_selection", target.tests)
        + block("pytest_add_cli_args", args)
        + block("also_copy", PACKAGES)
        + (block("only_mutate", only) if only else "")
    )


def survivors(work: Path, mutmut: str) -> list[dict[str, str]]:
    listed = subprocess.run(
        [mutmut, "results"], cwd=work, capture_output=True, text=True, check=False
    ).stdout
    found = []
    for line in listed.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if status in {"survived", "no tests"}:
            diff = subprocess.run(
                [mutmut, "show", name], cwd=work, capture_output=True, text=True, check=False
            ).stdout
            found.append({"mutant": name, "status": status, "diff": diff})
    return found


def run_target(
    target: Target, children: int, keep: Path | None, root: Path, only: tuple[str, ...]
) -> dict[str, object]:
    mutmut = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or "mutmut"
    # The commit the copy is made from (not the one checked out when the run ends).
    tree = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=7"],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="geoedge-mutation-") as tmp:
        work = Path(tmp)
        scratch_tree(root, work)
        (work / "setup.cfg").write_text(setup_cfg(target, only))
        (work / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
        env = {**os.environ, "GEOEDGE_HYPOTHESIS_PROFILE": "ci", "PYTHONDONTWRITEBYTECODE": "1"}
        began = time.monotonic()
        subprocess.run(
            [mutmut, "run", "--max-children", str(children)],
            cwd=work,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run([mutmut, "export-cicd-stats"], cwd=work, check=True, capture_output=True)
        stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
        found = survivors(work, mutmut)
        if keep is not None:
            shutil.copytree(work / "mutants", keep / target.name.replace("/", "_"))
    total = stats["total"]
    escaped = stats["survived"] + stats["no_tests"]
    return {
        "target": target.name,
        "only": list(only),
        "tree": tree,
        "tests": list(target.tests),
        "killed": stats["killed"],
        "survived": stats["survived"],
        "no_tests": stats["no_tests"],
        "timeout": stats["timeout"],
        "total": total,
        "surviving_rate": round(escaped / total, 4) if total else 0.0,
        "seconds": round(time.monotonic() - began),
        "survivors": found,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="target names (default: all)")
    parser.add_argument("--children", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--output", type=Path, default=ROOT / "loadtests/results/mutation.json")
    parser.add_argument("--keep", type=Path, help="keep each target's mutants/ under this folder")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GLOB",
        help="mutate only the files matching this glob (repeatable), e.g. edge/http1/chunked.py",
    )
    parser.add_argument(
        "--tree",
        type=Path,
        default=ROOT,
        help="the checkout whose code and tests are mutated and run (default: this one)",
    )
    args = parser.parse_args()
    chosen = [t for t in TARGETS if not args.targets or t.name in args.targets]
    if not chosen:
        parser.error(f"no such target; choose from {[t.name for t in TARGETS]}")
    previous = json.loads(args.output.read_text()) if args.output.exists() else {}
    results = dict(previous.get("targets", {}))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    only = tuple(args.only)
    for target in chosen:
        result = run_target(target, args.children, args.keep, args.tree.resolve(), only)
        name = figure_name(target, only)
        results[name] = result
        args.output.write_text(json.dumps({"targets": results}, indent=1) + "\n")
        print(
            f"{name}: {result['killed']} killed, {result['survived']} survived, "
            f"{result['no_tests']} not covered of {result['total']}: "
            f"surviving rate {100 * float(result['surviving_rate']):.1f}% "  # type: ignore[arg-type]
            f"({result['seconds']} s)",
            flush=True,
        )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
