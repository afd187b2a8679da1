"""Waiting for a condition, not for a time.

A test that sleeps and then asserts passes or fails by how busy the machine
is; one that polls for what it waits for passes as soon as the condition
holds. The deadline here only bounds a failure: it is scaled by
``GEOEDGE_TEST_TIMEOUT_SCALE`` (:func:`tests.conftest.scaled`) and generous
at scale 1, because a passing test never waits for it.

A negative check ("no X happened") first waits with these for a positive
event proving that the path which would have done X ran (a log line, a
counter), then asserts.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tests.conftest import scaled

__all__ = ["wait_for", "wait_until", "wait_until_async"]

T = TypeVar("T")

#: At scale 1 on a loaded 2-core machine: well past any wait that succeeds.
DEFAULT_TIMEOUT_S = 20.0


def _describe(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


def wait_until(
    check: Callable[[], T],
    what: str | Callable[[], str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = 0.05,
) -> T:
    """Call ``check`` until it returns a truthy value, and return that value;
    fail naming ``what`` (a string, or a function that says more, such as a
    log's tail) once ``scaled(timeout_s)`` has passed."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {scaled(timeout_s):.0f} s: {_describe(what)}")
        time.sleep(interval_s)


def wait_for(
    measure: Callable[[], T],
    done: Callable[[T], bool],
    what: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = 0.1,
) -> T:
    """Measure until ``done(measurement)`` and return that measurement (a
    /metrics page that has a series now); fail naming ``what`` and showing the
    last measurement once ``scaled(timeout_s)`` has passed."""
    last: list[T] = []

    def check() -> bool:
        last[:] = [measure()]
        return done(last[0])

    wait_until(
        check,
        lambda: f"{what}; last: {last[0]!r}"[:3000],
        timeout_s=timeout_s,
        interval_s=interval_s,
    )
    return last[0]


async def wait_until_async(
    check: Callable[[], T | Awaitable[T]],
    what: str | Callable[[], str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = 0.01,
) -> T:
    """:func:`wait_until` inside an event loop: the loop runs between calls,
    and ``check`` may be a coroutine function (an admin request)."""
    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {scaled(timeout_s):.0f} s: {_describe(what)}")
        await asyncio.sleep(interval_s)
