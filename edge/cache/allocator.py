"""Keeping a full cache's memory within its limit: large bodies get pages of
their own.

glibc's malloc serves an allocation of 128 KiB or more with a mapping of its
own, returned to the kernel when freed, but it raises that threshold to the
size of each such block freed (up to 32 MiB). A cache that evicts bodies all
day teaches it to put them in the heap, where freed space is reused only by
blocks that fit and the heap's pages are not given back: measured here,
filling a 32 MiB cache with 256 KiB bodies three times over grew a worker's
RSS by 43 MiB. With the threshold fixed at its starting value
(``mallopt(M_MMAP_THRESHOLD)``, which also turns the adjustment off) the
same fill grew it by 33 MiB, which ``tests/integration/test_cache_memory.py``
holds under the limit plus 10%.

Only where glibc is the C library; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["MMAP_THRESHOLD_BYTES", "bound_large_blocks"]

log = logging.getLogger("geoedge.edge")

M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024
"""Blocks at least this large are mapped alone: glibc's own starting value,
kept rather than lowered, so every other allocation (TLS and tunnel buffers)
is placed as it is without a cache; only the adaptation is turned off."""


def bound_large_blocks(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold``; False where that cannot be done."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not done:
        log.warning("mallopt(M_MMAP_THRESHOLD) failed: a full cache may hold more than its limit")
    return done
