"""How much property and fuzz tests try: fixed counts, the same on every machine.

What a property or fuzz test covers must not depend on how fast the machine
is, so nothing here is bounded by time. Two Hypothesis profiles:

- ``ci`` (the default): each test's own example count, derandomized (the
  examples follow from the test itself, so a failure on CI reproduces
  anywhere), no deadline (a loaded machine is slow, not wrong), no database.
- ``long`` (``make test-long``, or ``GEOEDGE_HYPOTHESIS_PROFILE=long``):
  :data:`SCALE` times the examples and fuzz iterations, from a random seed
  that ``make test-long`` prints and passes as ``--hypothesis-seed`` (give
  ``SEED=...`` to replay one).

Counts are written as ``examples(n)`` so the long profile scales them all.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["PROFILE", "SCALE", "examples"]

PROFILE = os.environ.get("GEOEDGE_HYPOTHESIS_PROFILE", "ci")
SCALE = 20 if PROFILE == "long" else 1

_COMMON = {
    "deadline": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("ci", derandomize=True, database=None, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("long", max_examples=100 * SCALE, **_COMMON)  # type: ignore[arg-type]
if PROFILE not in {"ci", "long"}:
    raise SystemExit(f"GEOEDGE_HYPOTHESIS_PROFILE={PROFILE!r}: use 'ci' or 'long'")
settings.load_profile(PROFILE)


def examples(count: int) -> int:
    """``count`` examples (or fuzz iterations) on CI, :data:`SCALE` times that in ``long``."""
    return count * SCALE
