"""Pure balancing decisions (STYLE.md §11): which backend gets a stream, which pool a
host belongs to, when a backend is ejected. No I/O, no clock (``now`` is a
parameter), no global randomness: everything here is tested without sockets.

Algorithms (:class:`BackendPool` picks one per pool):

- ``least_connections`` (default), as nginx's ``least_conn``: the available
  backend with the fewest streams in flight *relative to its weight*
  (``active / weight``); ties are broken by smooth weighted round robin among
  the tied ones. The tie-break matters for short streams: at low load every
  backend has 0 streams in flight, and a fixed "first wins" would send all
  traffic to one of them.
- ``round_robin``: each available backend in turn, weights ignored.
- ``weighted``: nginx's *smooth* weighted round robin: each pick adds every
  backend's weight to its ``current``, takes the largest, and subtracts the
  total from the winner. Weights 5,1,1 give ``a a b a c a a``, not ``a a a a a b c``.
- ``consistent_hash`` on the pool's ``hash_key`` (the client IP by default; a
  path, header or cookie: :mod:`origin.hash_key`): a hash ring with virtual nodes
  (Ketama-style, 100 points per unit of weight). Chosen over Maglev because
  an unavailable backend (down, drained, at its cap) is skipped by walking
  to the next point of the ring: nothing is rebuilt when health flips, and
  only the keys of that backend move, spread over all the others by its
  virtual nodes. Maglev's table is evener but must be rebuilt (65537 slots in
  Python, tens of milliseconds) to exclude a backend. The ring is rebuilt
  only when membership or weights change.

Slow start: a backend that comes back (active checks, or the end of a passive
ejection) has its weight ramped linearly from 5% to 100% over
``slow_start_s``, which steers least_connections and weighted; round_robin
ignores weights and consistent_hash ignores slow start (moving keys during a
ramp would defeat the stickiness it is for).

Every decision is per stream, and a stream is one request: a keep-alive client
connection is balanced request by request. Counts are per worker: each worker
balances the streams its tunnel connections carry with its own in-flight
counts, without sharing them. Sharing (a shared-memory array of counters)
would put a cross-process write on every stream start and end for a gain
that shrinks as load grows (each worker's share of the streams is itself
spread evenly; the per-request spread test, 4 backends and 8 keep-alive
clients, stays within 10% of the mean); caps (``max_connections_per_backend``)
are per worker for the same reason.

Passive ejection: ``failures`` consecutive connect failures in this worker
eject a backend for ``eject_base_s``, doubling with each ejection in a row up
to ``eject_max_s``. After an ejection one more failure ejects it again at
once (probation); a successful connect clears the record.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from origin.config import PassiveHealthConfig, normalize_host
from origin.snapshot import BackendSpec, PoolSnapshot
from tunnel.aio.transport import parse_host_port

__all__ = [
    "ALGORITHMS",
    "Backend",
    "BackendPool",
    "ConsistentHash",
    "LeastConnections",
    "PoolRouter",
    "RiseFall",
    "RoundRobin",
    "SmoothWeighted",
    "effective_weight",
    "hash_key",
]

#: Weight fraction a backend starts its slow start with (never 0: it must be
#: able to take a first stream to prove itself).
SLOW_START_FLOOR = 0.05
#: Virtual nodes per unit of weight on the consistent-hash ring.
VNODES_PER_WEIGHT = 100


@dataclass(slots=True, eq=False)
class Backend:
    """One backend's state in one worker. Compared by identity."""

    address: str
    host: str
    port: int
    weight: int = 1
    healthy: bool = True
    drained: bool = False
    up_since: float = float("-inf")
    active: int = 0
    """Streams in flight to it from this worker."""
    failures: int = 0
    """Consecutive connect failures."""
    ejections: int = 0
    """Consecutive passive ejections (sets the next ejection's length)."""
    ejected_until: float = float("-inf")
    current_weight: float = 0.0
    """Smooth weighted round robin state."""
    tag: Any = None
    """Owned by the caller (the worker keeps its metric handles here)."""

    @classmethod
    def from_spec(cls, spec: BackendSpec) -> Backend:
        host, port = parse_host_port(spec.address)
        backend = cls(spec.address, host, port)
        backend.update(spec)
        return backend

    def update(self, spec: BackendSpec) -> None:
        if spec.healthy and not self.healthy:
            # The parent's active checks brought it back (``rise`` passes in a
            # row): fresher evidence than this worker's connect failures from
            # while it was down, so its passive ejection ends here.
            self.ejected_until = float("-inf")
            self.ejections = 0
            self.failures = 0
        self.weight = spec.weight
        self.healthy = spec.healthy
        self.drained = spec.drained
        self.up_since = spec.up_since

    def available(self, now: float, max_connections: int) -> bool:
        """May take a new stream: healthy, not drained, not ejected, under its cap."""
        return (
            self.healthy
            and not self.drained
            and now >= self.ejected_until
            and (max_connections == 0 or self.active < max_connections)
        )

    def ejected(self, now: float) -> bool:
        return now < self.ejected_until


def effective_weight(backend: Backend, now: float, slow_start_s: float) -> float:
    """The weight after slow start: linear from 5% to 100% over ``slow_start_s``
    since the backend came back (``up_since``, or the end of its ejection)."""
    if slow_start_s <= 0.0:
        return float(backend.weight)
    elapsed = now - max(backend.up_since, backend.ejected_until)
    if elapsed >= slow_start_s:
        return float(backend.weight)
    return backend.weight * max(SLOW_START_FLOOR, elapsed / slow_start_s)


def record_connect_failure(backend: Backend, now: float, policy: PassiveHealthConfig) -> bool:
    """Count a failed connect; True when this failure ejects the backend."""
    backend.failures += 1
    if backend.failures < policy.failures:
        return False
    duration = min(policy.eject_max_s, policy.eject_base_s * 2 ** min(backend.ejections, 30))
    backend.ejected_until = now + duration
    backend.ejections += 1
    backend.failures = policy.failures - 1  # probation: the next failure ejects again
    return True


def record_connect_success(backend: Backend) -> None:
    backend.failures = 0
    backend.ejections = 0


def hash_key(data: bytes) -> int:
    """64-bit hash for the ring (blake2b: stable across processes and runs,
    unlike ``hash()``, so every worker maps a client to the same backend)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


# --------------------------------------------------------------------------- algorithms

Eligible = Callable[[Backend], bool]
WeightOf = Callable[[Backend], float]


class LeastConnections:
    """nginx ``least_conn``: fewest ``active / weight``; ties by smooth weighted RR."""

    def choose(
        self, backends: Sequence[Backend], eligible: Eligible, weight_of: WeightOf, key: bytes
    ) -> Backend | None:
        ties: list[Backend] = []
        tie_weights: list[float] = []
        best_active, best_weight = 0, 1.0
        for backend in backends:
            if not eligible(backend):
                continue
            weight = weight_of(backend)
            if not ties or backend.active * best_weight < best_active * weight:
                ties, tie_weights = [backend], [weight]
                best_active, best_weight = backend.active, weight
            elif backend.active * best_weight == best_active * weight:
                ties.append(backend)
                tie_weights.append(weight)
        if len(ties) <= 1:
            return ties[0] if ties else None
        return _smooth_pick(ties, tie_weights)

    def rebuild(self, backends: Sequence[Backend]) -> None:
        return None


class RoundRobin:
    """Each available backend in turn."""

    def __init__(self) -> None:
        self._next = 0

    def choose(
        self, backends: Sequence[Backend], eligible: Eligible, weight_of: WeightOf, key: bytes
    ) -> Backend | None:
        count = len(backends)
        for step in range(count):
            index = (self._next + step) % count
            if eligible(backends[index]):
                self._next = index + 1
                return backends[index]
        return None

    def rebuild(self, backends: Sequence[Backend]) -> None:
        return None


class SmoothWeighted:
    """nginx's smooth weighted round robin over the available backends."""

    def choose(
        self, backends: Sequence[Backend], eligible: Eligible, weight_of: WeightOf, key: bytes
    ) -> Backend | None:
        candidates = [b for b in backends if eligible(b)]
        if not candidates:
            return None
        return _smooth_pick(candidates, [weight_of(b) for b in candidates])

    def rebuild(self, backends: Sequence[Backend]) -> None:
        for backend in backends:
            backend.current_weight = 0.0


class ConsistentHash:
    """A hash ring with ``VNODES_PER_WEIGHT * weight`` points per backend; a key
    goes to the first eligible backend clockwise from its hash."""

    def __init__(self) -> None:
        self._points: list[int] = []
        self._owners: list[Backend] = []
        self._fallback = RoundRobin()

    def rebuild(self, backends: Sequence[Backend]) -> None:
        ring = []
        for backend in backends:
            for vnode in range(VNODES_PER_WEIGHT * backend.weight):
                ring.append((hash_key(f"{backend.address}#{vnode}".encode()), backend.address))
        ring.sort()
        by_address = {b.address: b for b in backends}
        self._points = [point for point, _ in ring]
        self._owners = [by_address[address] for _, address in ring]

    def choose(
        self, backends: Sequence[Backend], eligible: Eligible, weight_of: WeightOf, key: bytes
    ) -> Backend | None:
        if not key or not self._points:
            return self._fallback.choose(backends, eligible, weight_of, key)
        start = bisect.bisect_left(self._points, hash_key(key))
        owners, count = self._owners, len(self._owners)
        seen: set[int] = set()
        for step in range(count):
            owner = owners[(start + step) % count]
            if id(owner) in seen:
                continue
            if eligible(owner):
                return owner
            seen.add(id(owner))
            if len(seen) == len(backends):
                break
        return None


ALGORITHMS: dict[str, Callable[[], Any]] = {
    "least_connections": LeastConnections,
    "round_robin": RoundRobin,
    "weighted": SmoothWeighted,
    "consistent_hash": ConsistentHash,
}


def _smooth_pick(candidates: Sequence[Backend], weights: Sequence[float]) -> Backend:
    total = 0.0
    best: Backend | None = None
    for backend, weight in zip(candidates, weights, strict=True):
        backend.current_weight += weight
        total += weight
        if best is None or backend.current_weight > best.current_weight:
            best = backend
    assert best is not None
    best.current_weight -= total
    return best


# --------------------------------------------------------------------------- pools


@dataclass(slots=True, eq=False)
class BackendPool:
    """A pool's settings and backends in one worker; :meth:`choose` is the decision."""

    settings: PoolSnapshot
    backends: list[Backend] = field(default_factory=list)
    algorithm: Any = None

    @classmethod
    def from_snapshot(cls, snapshot: PoolSnapshot) -> BackendPool:
        pool = cls(snapshot)
        pool.apply(snapshot)
        return pool

    @property
    def name(self) -> str:
        return self.settings.name

    def apply(self, snapshot: PoolSnapshot) -> tuple[list[Backend], list[Backend]]:
        """Reconcile with a snapshot; returns (added, removed) backends. Backends
        that stay keep their counters; removed ones live on in their streams."""
        old_algorithm = self.settings.algorithm
        self.settings = snapshot
        by_address = {b.address: b for b in self.backends}
        backends, added = [], []
        membership_changed = self.algorithm is None or old_algorithm != snapshot.algorithm
        for spec in snapshot.backends:
            backend = by_address.pop(spec.address, None)
            if backend is None:
                backend = Backend.from_spec(spec)
                added.append(backend)
                membership_changed = True
            elif backend.weight != spec.weight:
                membership_changed = True
            backend.update(spec)
            backends.append(backend)
        removed = list(by_address.values())
        self.backends = backends
        if membership_changed or removed:
            if self.algorithm is None or old_algorithm != snapshot.algorithm:
                self.algorithm = ALGORITHMS[snapshot.algorithm]()
            self.algorithm.rebuild(backends)
        return added, removed

    def choose(
        self, now: float, client_key: bytes = b"", exclude: Collection[Backend] = ()
    ) -> Backend | None:
        """The backend for a new stream, or None when none is available.
        ``exclude``: backends already tried for this stream."""
        cap = self.settings.max_connections_per_backend
        slow_start_s = self.settings.slow_start_s

        if exclude:

            def eligible(b: Backend) -> bool:
                return b.available(now, cap) and b not in exclude
        else:

            def eligible(b: Backend) -> bool:
                return b.available(now, cap)

        def weight_of(b: Backend) -> float:
            return effective_weight(b, now, slow_start_s)

        chosen: Backend | None = self.algorithm.choose(
            self.backends, eligible, weight_of, client_key
        )
        return chosen

    def usable(self, now: float) -> bool:
        """Some backend could take a stream (ignoring caps)."""
        return any(b.available(now, 0) for b in self.backends)

    def find(self, address: str) -> Backend | None:
        return next((b for b in self.backends if b.address == address), None)


class PoolRouter:
    """Host or SNI -> pool name: exact names first, then ``*.suffix`` wildcards
    (most specific suffix wins), then the default pool."""

    def __init__(self, pools: Iterable[PoolSnapshot]) -> None:
        self._exact: dict[str, str] = {}
        self._wildcard: dict[str, str] = {}
        self.default: str | None = None
        for pool in pools:
            for host in pool.hosts:
                name = host.lower().rstrip(".")
                if name.startswith("*."):
                    self._wildcard[name[2:]] = pool.name
                else:
                    self._exact[name] = pool.name
            if pool.default:
                self.default = pool.name

    def route(self, host: str | None, server_name: str | None = None) -> str | None:
        """The pool for a stream: by HTTP Host (port stripped), else TLS SNI, else default."""
        for candidate in (host, server_name):
            if candidate:
                found = self._lookup(normalize_host(candidate))
                if found is not None:
                    return found
        return self.default

    def _lookup(self, name: str) -> str | None:
        found = self._exact.get(name)
        if found is not None or not self._wildcard:
            return found
        labels = name.split(".")
        for start in range(1, len(labels)):
            found = self._wildcard.get(".".join(labels[start:]))
            if found is not None:
                return found
        return None


@dataclass(slots=True)
class RiseFall:
    """The active-check verdict: ``rise`` passes in a row bring a down backend
    up, ``fall`` failures in a row take an up one down; anything else keeps it."""

    rise: int
    fall: int
    healthy: bool = True
    streak: int = 0

    def observe(self, passed: bool) -> bool:
        """Record one check; True when the verdict flipped."""
        if passed == self.healthy:
            self.streak = 0
            return False
        self.streak += 1
        if self.streak < (self.rise if passed else self.fall):
            return False
        self.healthy = passed
        self.streak = 0
        return True
