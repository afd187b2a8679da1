"""What the parent tells its workers about pools: plain data, JSON on the control pipe.

The parent process owns everything that must be decided once for the whole
origin (DNS discovery, active health checks, drained backends, the pool
settings of the config file it last loaded) and publishes it as one
:class:`PoolSnapshot` per pool. A worker reconciles its balancer state with each
snapshot it receives (:meth:`origin.balancer.BackendPool.apply`), keeping the
counters of backends that stay. A snapshot is complete, not a delta, so a lost
or reordered message cannot leave a worker with a half-applied change, and a
worker forked later starts from the latest one.

Times are ``time.monotonic()`` values: CLOCK_MONOTONIC is one clock for every
process on the host, so a worker can compute a slow-start ramp from the moment
the parent saw a backend come back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from geoedge.workers import worker_share
from origin.config import PassiveHealthConfig, PoolConfig

__all__ = ["BackendSpec", "PoolSnapshot", "decode_snapshots", "encode_snapshots"]


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend as the parent sees it."""

    address: str
    """host:port to connect to."""
    weight: int = 1
    healthy: bool = True
    """Verdict of the active health checks (True when the pool has none)."""
    up_since: float = float("-inf")
    """When the backend last became healthy (monotonic); slow start ramps from here."""
    drained: bool = False
    """Set through the admin API: no new streams, in-flight ones carry on."""


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """A pool's settings (from the config) and its current backends."""

    name: str
    hosts: tuple[str, ...] = ()
    default: bool = False
    algorithm: str = "least_connections"
    hash_key: str = "client_ip"
    proxy_protocol: str = "off"
    connect_timeout_s: float = 2.0
    connect_retries: int = 2
    max_connections_per_backend: int = 0
    queue_timeout_s: float = 5.0
    max_queued: int = 1024
    keepalive_timeout_s: float = 3.0
    keepalive_max_idle: int = 64
    slow_start_s: float = 0.0
    first_byte_timeout_s: float = 60.0
    between_bytes_timeout_s: float = 60.0
    long_poll_prefixes: tuple[str, ...] = ()
    passive: PassiveHealthConfig = dataclasses.field(default_factory=PassiveHealthConfig)
    backends: tuple[BackendSpec, ...] = ()

    @classmethod
    def from_config(
        cls, pool: PoolConfig, backends: tuple[BackendSpec, ...], *, workers: int = 1
    ) -> PoolSnapshot:
        """``workers``: the host's worker count. ``max_connections_per_backend``
        is per host in the config; each worker gets its share, rounded up (so
        at least 1: with more workers than the cap, the host may exceed it by
        up to a worker each)."""
        cap = pool.max_connections_per_backend
        return cls(
            name=pool.name,
            hosts=pool.hosts,
            default=pool.default,
            algorithm=pool.algorithm,
            hash_key=pool.hash_key,
            proxy_protocol=pool.proxy_protocol,
            connect_timeout_s=pool.connect_timeout_s,
            connect_retries=pool.connect_retries,
            max_connections_per_backend=worker_share(cap, workers),
            queue_timeout_s=pool.queue_timeout_s,
            max_queued=pool.max_queued,
            keepalive_timeout_s=pool.keepalive_timeout_s,
            keepalive_max_idle=pool.keepalive_max_idle,
            slow_start_s=pool.slow_start_s,
            first_byte_timeout_s=pool.first_byte_timeout_s,
            between_bytes_timeout_s=pool.between_bytes_timeout_s,
            long_poll_prefixes=pool.long_poll_prefixes,
            passive=pool.passive,
            backends=backends,
        )


def encode_snapshots(pools: tuple[PoolSnapshot, ...]) -> list[dict[str, Any]]:
    """JSON-ready form; ``-inf`` (never went down) is sent as None."""
    out = []
    for pool in pools:
        item = dataclasses.asdict(pool)
        for backend in item["backends"]:
            if backend["up_since"] == float("-inf"):
                backend["up_since"] = None
        out.append(item)
    return out


_POOL_FIELDS = frozenset(f.name for f in dataclasses.fields(PoolSnapshot))


def decode_snapshots(items: list[dict[str, Any]]) -> tuple[PoolSnapshot, ...]:
    """Inverse of :func:`encode_snapshots`; raises ValueError/TypeError/KeyError on junk."""
    pools = []
    for item in items:
        # Fields this version does not know are left out: a parent may be newer
        # than a worker it still talks to (a reload in place).
        fields = {k: v for k, v in item.items() if k in _POOL_FIELDS}
        backends = []
        for raw in fields.pop("backends"):
            spec = dict(raw)
            if spec.get("up_since") is None:
                spec["up_since"] = float("-inf")
            backends.append(BackendSpec(**spec))
        passive = PassiveHealthConfig(**fields.pop("passive"))
        fields["hosts"] = tuple(fields["hosts"])
        fields["long_poll_prefixes"] = tuple(fields.get("long_poll_prefixes", ()))
        pools.append(PoolSnapshot(**fields, passive=passive, backends=tuple(backends)))
    return tuple(pools)
