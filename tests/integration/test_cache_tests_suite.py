"""http-tests/cache-tests through the whole chain, as issue 30 judges the cache.

The suite's Node.js server is the only backend behind a real origin, its
client talks HTTPS to a real edge configured with
``deploy/config/cache.example.toml`` appended (loadtests/cache_tests.py). The
score must not fall below :data:`FLOOR`, which only rises.

Of the suite's 165 required tests, 10 cannot pass here, and why
(docs/cache.md, "cache-tests"): four ``stale-close-*`` tests need a response
from a server that has just closed the connection (no proxy passes them on
cache-tests.fyi), four ``*-Set-Cookie*`` tests need a response that sets a
cookie served from the cache (never, by DESIGN principle 16),
``age-parse-prefix`` contradicts ``age-parse-dup-0``, and
``surrogate-fresh-cc-nostore`` needs a Surrogate-Control directive targeted
at a device the request never names to be taken as ours.
"""

from __future__ import annotations

import shutil

import pytest

from loadtests.cache_tests import CACHE_EXAMPLE, report, run_suite
from tests.conftest import scaled

FLOOR = 153
"""155 measured on this machine; two tests' spare for the timing-bound ones
(``max-age=2`` and a 3 s pause) on a loaded machine. Raise it, never lower it."""

pytestmark = [
    pytest.mark.timeout(scaled(600)),
    pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (make node)"),
]


def test_cache_tests_score_stays_at_or_above_the_floor() -> None:
    score, results = run_suite(str(CACHE_EXAMPLE))
    assert len(results) > 300, "the suite's client ran only part of the suite"
    assert score.passed >= FLOOR, report(score)
