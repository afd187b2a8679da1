"""A skip in CI is a failure, unless the allow-list says why it cannot run there.

A test that skips because a tool is missing passes while the feature it covers
may be broken, so on CI (``CI`` set to ``true`` or ``1``, as ``.ci/run`` does)
every skip -- a ``skipif`` mark, a ``pytest.skip()`` call, an
``importorskip`` at import -- is turned into a failure whose message names the
reason, unless the test's id matches an entry of
:data:`tests.skip_allowlist.ALLOWED_SKIPS`. ``xfail`` is not a skip.

Every run, CI or not, ends with the list of what skipped and why, and the
allow-list itself, so a reader of the log sees what was not tested. Reports
are judged where the test runs and listed where they are logged, so that under
pytest-xdist (``-n``) the controller lists what its workers skipped.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Generator

import pytest

from tests.skip_allowlist import ALLOWED_SKIPS

__all__ = ["allowed_reason", "in_ci"]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def allowed_reason(nodeid: str) -> str | None:
    """The allow-list's reason for ``nodeid``, or None when it is not listed."""
    for pattern, reason in ALLOWED_SKIPS.items():
        if fnmatch.fnmatchcase(nodeid, pattern):
            return reason
    return None


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


#: How a skip turned failure begins; the listing reads the reason back from it.
_FAILED_SKIP = "skipped on CI but not on the allow-list (tests/skip_allowlist.py): "
_FAILED_SKIP_ADVICE = (
    "\nInstall what the test needs in `make test`, or list it with the reason "
    "it cannot run on this kind of machine."
)


class SkipPolicy:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.skipped: list[tuple[str, str, str | None]] = []  # nodeid, reason, allowed by

    def _judge(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        """Where the test ran: on CI an unlisted skip becomes a failure."""
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        if self.strict and allowed_reason(report.nodeid) is None:
            report.outcome = "failed"
            report.longrepr = _FAILED_SKIP + _skip_reason(report) + _FAILED_SKIP_ADVICE

    def _list(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        """Where the report is logged (the controller, under xdist): remember it."""
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = _skip_reason(report)
            self.skipped.append((report.nodeid, reason, allowed_reason(report.nodeid)))
        elif report.failed and str(report.longrepr).startswith(_FAILED_SKIP):
            reason = str(report.longrepr).removeprefix(_FAILED_SKIP)
            self.skipped.append((report.nodeid, reason.removesuffix(_FAILED_SKIP_ADVICE), None))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._list(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._list(report)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, None]:
        outcome = yield
        self._judge(outcome.get_result())  # type: ignore[attr-defined]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, pytest.CollectReport, None]:
        outcome = yield
        self._judge(outcome.get_result())  # type: ignore[attr-defined]

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        write = terminalreporter.write_line
        terminalreporter.section("skips")
        mode = "CI: a skip off the allow-list fails" if self.strict else "not CI"
        write(f"{len(self.skipped)} skipped ({mode})")
        for nodeid, reason, allowed in self.skipped:
            verdict = f"allowed: {allowed}" if allowed else "NOT on the allow-list"
            write(f"  {nodeid}: {reason} [{verdict}]")
        write(f"allow-list (tests/skip_allowlist.py): {len(ALLOWED_SKIPS)} entries")
        for pattern, reason in ALLOWED_SKIPS.items():
            write(f"  {pattern}: {reason}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipPolicy(strict=in_ci()), "geoedge-skip-policy")
