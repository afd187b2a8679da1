"""The skip policy itself: on CI an unlisted skip fails, a listed one passes,
and every run ends with the list of skips and the allow-list."""

from __future__ import annotations

import pytest

from tests.skip_allowlist import ALLOWED_SKIPS
from tests.skip_policy import allowed_reason

SUITE = """
import pytest

def test_runs():
    assert True

@pytest.mark.skipif(True, reason="no frobnicator here")
def test_marked():
    pass

def test_called():
    pytest.skip("the tool is missing")

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False
"""


def _run(
    pytester: pytest.Pytester,
    ci: str | None,
    allow: dict[str, str] | None = None,
    *args: str,
) -> pytest.RunResult:
    pytester.makeconftest(
        "from tests.skip_allowlist import ALLOWED_SKIPS\n"
        f"ALLOWED_SKIPS.update({allow or {}!r})\n"
        'pytest_plugins = ["tests.skip_policy"]\n'
    )
    pytester.makepyfile(test_sample=SUITE)
    if ci is None:
        pytester._monkeypatch.delenv("CI", raising=False)
    else:
        pytester._monkeypatch.setenv("CI", ci)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_outside_ci_a_skip_is_a_skip_and_is_listed(pytester: pytest.Pytester) -> None:
    result = _run(pytester, None)
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    out = result.stdout.str()
    assert "2 skipped (not CI)" in out
    assert "test_sample.py::test_marked: no frobnicator here [NOT on the allow-list]" in out
    assert "test_sample.py::test_called: the tool is missing [NOT on the allow-list]" in out


def test_on_ci_an_unlisted_skip_fails_with_its_reason(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "true")
    # A skipif mark skips in setup: the failure shows as an error there.
    result.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1)
    out = result.stdout.str()
    assert "skipped on CI but not on the allow-list" in out
    assert "the tool is missing" in out and "no frobnicator here" in out
    assert result.ret != 0


def test_on_ci_an_allowed_skip_stays_a_skip(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        "1",
        {"test_sample.py::test_call*": "needs a frobnicator", "*::test_marked": "none here"},
    )
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    assert "[allowed: needs a frobnicator]" in result.stdout.str()
    assert result.ret == 0


def test_under_xdist_the_controller_lists_what_its_workers_skipped(
    pytester: pytest.Pytester,
) -> None:
    """``.ci/run`` runs the sans-I/O tests with ``-n 2``: the list must not come out empty."""
    result = _run(pytester, "true", {"*::test_marked": "none here"}, "-n", "2")
    result.assert_outcomes(passed=1, failed=1, skipped=1, xfailed=1)
    out = result.stdout.str()
    assert "2 skipped (CI: a skip off the allow-list fails)" in out
    assert "test_sample.py::test_marked: no frobnicator here [allowed: none here]" in out
    assert "test_sample.py::test_called: the tool is missing [NOT on the allow-list]" in out


def test_allow_list_patterns_match_node_ids() -> None:
    for pattern in ALLOWED_SKIPS:
        assert "::" in pattern or pattern.endswith(".py"), pattern
        assert ALLOWED_SKIPS[pattern].strip(), f"{pattern} needs its reason"
    assert allowed_reason("tests/no/such_test.py::test_nothing") is None
