"""The control plane's view of the backends (pure, no I/O): who is in each pool,
who passes the health checks, who is drained; rendered as snapshots for workers.

Membership of a pool is its static ``[[pools.backends]]`` plus what DNS
discovery last found (a static entry wins over a discovered one with the same
address). Health is kept per (pool, address) and dropped when the backend
leaves the pool. Drains are kept per (pool, address) even while the address is
not a member, so a drained backend that DNS drops and re-adds stays drained.

Backends start *healthy*, as HAProxy's do: the origin serves from the first
second, and a backend that is in fact down is caught by connect-failure retries
and passive ejection until its checks fail ``fall`` times. A backend that
joins later (DNS) or comes back (checks) starts its slow start then.
"""

from __future__ import annotations

from dataclasses import dataclass

from geoedge.workers import resolve_worker_count
from origin.balancer import RiseFall
from origin.config import HealthCheckConfig, OriginConfig, PoolConfig
from origin.snapshot import BackendSpec, PoolSnapshot

__all__ = ["ControlState", "UnknownBackend"]

Member = tuple[str, int]  # (address, weight)
_UNCHECKED = HealthCheckConfig(rise=1, fall=1)


def _pairs(value: object) -> list[tuple[str, str]]:
    """``[[pool, address], ...]`` from JSON; anything else is skipped."""
    if not isinstance(value, list):
        return []
    return [
        (item[0], item[1])
        for item in value
        if isinstance(item, list)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], str)
    ]


class UnknownBackend(KeyError):
    """No such pool, or no such backend in it (the admin answers 404)."""


@dataclass(slots=True)
class _Health:
    verdict: RiseFall
    up_since: float


class ControlState:
    def __init__(self, config: OriginConfig, now: float) -> None:
        self.pools: dict[str, PoolConfig] = {}
        self._discovered: dict[str, tuple[Member, ...]] = {}
        self._health: dict[tuple[str, str], _Health] = {}
        self.drained: set[tuple[str, str]] = set()
        self._booted = False
        #: Caps in the config are per host; each worker enforces its share.
        self.workers = resolve_worker_count(config.origin.workers)
        self.reload(config, now)
        self._booted = True

    # -- inputs -------------------------------------------------------------------------

    def reload(self, config: OriginConfig, now: float) -> None:
        """Adopt a new config's pools; health and discoveries of what stays are kept."""
        self.pools = {pool.name: pool for pool in config.pools}
        self._discovered = {
            name: members
            for name, members in self._discovered.items()
            if name in self.pools and self.pools[name].dns is not None
        }
        self._sync_health(now)

    def set_discovered(self, pool: str, members: tuple[Member, ...], now: float) -> bool:
        """DNS found ``members`` for ``pool``; True when membership changed."""
        if pool not in self.pools:
            return False
        old = self._discovered.get(pool)
        members = tuple(sorted(set(members)))
        if old == members:
            return False
        self._discovered[pool] = members
        self._sync_health(now)
        return True

    def observe_health(self, pool: str, address: str, passed: bool, now: float) -> bool:
        """One active check's result; True when the backend's verdict flipped."""
        health = self._health.get((pool, address))
        if health is None or not health.verdict.observe(passed):
            return False
        if health.verdict.healthy:
            health.up_since = now
        return True

    def set_drained(self, pool: str, address: str, drained: bool) -> bool:
        """Drain or undrain; raises :class:`UnknownBackend`; True when it changed."""
        if address not in {a for a, _ in self.members(pool)}:
            raise UnknownBackend(f"pool {pool!r} has no backend {address!r}")
        key = (pool, address)
        if (key in self.drained) == drained:
            return False
        if drained:
            self.drained.add(key)
        else:
            self.drained.discard(key)
        return True

    def restore(self, carried: dict[str, object]) -> None:
        """Take back what :meth:`carried` gave before a reload's re-exec: drains
        (kept even for a backend the new config no longer has, as DNS drops are)
        and backends the checks had found down (down until their checks rise,
        not up until they fall: the new workers send them nothing meanwhile)."""
        for pool, address in _pairs(carried.get("drained")):
            self.drained.add((pool, address))
        for key in _pairs(carried.get("down")):
            health = self._health.get(key)
            if health is not None:
                health.verdict.healthy = False
                health.verdict.streak = 0

    # -- outputs ---------------------------------------------------------------------------

    def carried(self) -> dict[str, object]:
        """What a reload passes to the next image of the supervisor (JSON):
        the drained backends and the ones the checks found down."""
        return {
            "drained": sorted([pool, address] for pool, address in self.drained),
            "down": sorted(
                [pool, address]
                for (pool, address), health in self._health.items()
                if not health.verdict.healthy
            ),
        }

    def members(self, pool: str) -> tuple[Member, ...]:
        config = self.pools.get(pool)
        if config is None:
            raise UnknownBackend(f"no pool {pool!r}")
        out = {b.address: b.weight for b in config.backends}
        for address, weight in self._discovered.get(pool, ()):
            out.setdefault(address, weight)
        return tuple(out.items())

    def healthy(self, pool: str, address: str) -> bool:
        health = self._health.get((pool, address))
        return health is None or health.verdict.healthy

    def snapshots(self) -> tuple[PoolSnapshot, ...]:
        out = []
        for name, config in self.pools.items():
            specs = []
            for address, weight in self.members(name):
                health = self._health.get((name, address))
                specs.append(
                    BackendSpec(
                        address=address,
                        weight=weight,
                        healthy=health is None or health.verdict.healthy,
                        up_since=health.up_since if health is not None else float("-inf"),
                        drained=(name, address) in self.drained,
                    )
                )
            out.append(PoolSnapshot.from_config(config, tuple(specs), workers=self.workers))
        return tuple(out)

    def check_targets(self) -> dict[tuple[str, str], HealthCheckConfig]:
        """(pool, address) -> its health check, for every backend of a checked pool."""
        return {
            (name, address): config.health
            for name, config in self.pools.items()
            if config.health is not None
            for address, _ in self.members(name)
        }

    def usable_backends(self) -> int:
        """Backends that are healthy and not drained, over all pools."""
        return sum(
            1
            for name in self.pools
            for address, _ in self.members(name)
            if self.healthy(name, address) and (name, address) not in self.drained
        )

    # -- internals ---------------------------------------------------------------------

    def _sync_health(self, now: float) -> None:
        """One record per member (checked or not: it also holds when it joined)."""
        wanted = {
            (name, address): config.health or _UNCHECKED
            for name, config in self.pools.items()
            for address, _ in self.members(name)
        }
        for key in list(self._health):
            if key not in wanted:
                del self._health[key]
        start = now if self._booted else float("-inf")
        for key, check in wanted.items():
            health = self._health.get(key)
            if health is None:
                self._health[key] = _Health(RiseFall(check.rise, check.fall), start)
            else:
                health.verdict.rise, health.verdict.fall = check.rise, check.fall
                if check is _UNCHECKED and not health.verdict.healthy:
                    health.verdict.healthy, health.up_since = True, now  # checks removed
