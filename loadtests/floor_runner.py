"""What the floor benchmarks (``make bench-tls-floor``, ``make bench-request-floor``)
share: their rounds, and the run from the machine's checks to the result file."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loadtests.bench_edge import preflight, prepare_process
from loadtests.edge_stack import StackError

Details = dict[str, Any]


def alternating_rounds(
    rounds: int, chains: Sequence[str], measure: Callable[[str], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` measurements of every chain, the order reversed every other
    round so that no chain always runs first (or right after another)."""
    runs: dict[str, list[dict[str, Any]]] = {chain: [] for chain in chains}
    for index in range(rounds):
        for chain in chains if index % 2 == 0 else chains[::-1]:
            runs[chain].append(measure(chain))
    return runs


def run_and_write(
    prog: str,
    rounds: int,
    seconds: float,
    output: Path,
    run: Callable[[int, float, Path], Details],
    summarize: Callable[[Details], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    environment: Callable[[Details], dict[str, Any]] = lambda details: {},
) -> int:
    """Check the machine, ``run`` in a scratch directory, write ``summarize``'s
    figures with the details to ``output`` and print ``report``; the exit status."""
    problems = preflight()
    if problems:
        print(f"{prog}: cannot run:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    prepare_process()
    load_before = os.getloadavg()
    try:
        with tempfile.TemporaryDirectory(prefix=f"{prog}-") as tmp:
            details = run(rounds, seconds, Path(tmp))
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; servers stopped", file=sys.stderr)
        return 130
    except (StackError, RuntimeError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    figures = summarize(details)
    result = {
        **figures,
        "environment": {
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "rounds": rounds,
            "seconds": seconds,
            **environment(details),
        },
        "details": details,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(report(figures))
    print(f"wrote {output}")
    return 0
