"""Checks that objects are freed by reference counting alone.

The daemons tune the cyclic collector so that full collections almost never run
(:mod:`geoedge.memory`): an object graph that is a reference cycle lives
until restart. These helpers turn the collector off, so that anything still
alive after its connection closed is in a cycle (or still referenced).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """Run the body with the cyclic collector disabled (after one collection, so
    that earlier tests' garbage does not count)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def live(cls: type) -> int:
    """Instances of exactly ``cls`` the collector tracks (slotted classes, which
    take no weak references, included)."""
    return sum(1 for obj in gc.get_objects() if type(obj) is cls)
