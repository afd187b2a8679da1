"""The control plane: DNS discovery, active health checks and drains, run once per
origin (in the parent), published to the workers as pool snapshots.

It wires the pure :class:`~origin.state.ControlState` to its inputs
(:class:`~origin.discovery.DnsWatcher`, :class:`~origin.health.HealthChecker`,
the admin's drain requests, SIGHUP reloads) and calls ``publish(snapshots)``
after every change that alters what workers should do. ``publish`` is
:meth:`geoedge.workers.Supervisor.broadcast` in the daemon, and
:meth:`origin.worker.OriginWorker.apply_snapshots` in process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from geoedge.logs import log_event
from origin.config import OriginConfig
from origin.discovery import DnsWatcher
from origin.health import HealthChecker
from origin.metrics import ControlMetrics
from origin.snapshot import PoolSnapshot
from origin.state import ControlState, Member

__all__ = ["ControlPlane"]

log = logging.getLogger("geoedge.origin")

Publish = Callable[[tuple[PoolSnapshot, ...]], None]


class ControlPlane:
    def __init__(
        self,
        config: OriginConfig,
        publish: Publish,
        *,
        metrics: ControlMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._publish_to = publish
        self.metrics = metrics or ControlMetrics()
        self._clock = clock
        self.state = ControlState(config, clock())
        self._health = HealthChecker(self._on_health)
        self._watchers: dict[str, DnsWatcher] = {}
        self.snapshots: tuple[PoolSnapshot, ...] = self.state.snapshots()

    async def start(self) -> None:
        """Resolve DNS pools once (so workers start with their members), then keep
        checking and resolving in the background."""
        await self._sync_watchers(first=True)
        self._health.sync(self.state.check_targets())
        self._publish()

    async def close(self) -> None:
        for watcher in self._watchers.values():
            await watcher.close()
        self._watchers.clear()
        await self._health.close()

    async def reload(self, config: OriginConfig) -> None:
        """Adopt ``config``'s pools (already validated); what stays keeps its state."""
        self.config = config
        self.state.reload(config, self._clock())
        await self._sync_watchers(first=False)
        self._health.sync(self.state.check_targets())
        self._publish()

    def restore(self, carried: dict[str, object]) -> None:
        """What the supervisor before a reload knew (drains, backends found down:
        :meth:`origin.state.ControlState.carried`), published to the workers."""
        self.state.restore(carried)
        self._publish()

    def drain(self, pool: str, address: str, drained: bool) -> bool:
        """Drain (or undrain) a backend; raises :class:`~origin.state.UnknownBackend`."""
        changed = self.state.set_drained(pool, address, drained)
        if changed:
            log_event(
                log,
                "info",
                "backend drained" if drained else "backend undrained",
                pool=pool,
                backend=address,
            )
            self._publish()
        return changed

    # -- inputs ------------------------------------------------------------------------

    def _on_health(self, pool: str, address: str, passed: bool) -> None:
        self.metrics.health_checks.labels(pool, address, "pass" if passed else "fail").inc()
        if self.state.observe_health(pool, address, passed, self._clock()):
            log_event(
                log,
                "info" if passed else "warning",
                "backend is up" if passed else "backend is down",
                pool=pool,
                backend=address,
            )
            self._publish()

    def _on_members(self, pool: str, members: tuple[Member, ...]) -> None:
        self.metrics.dns_resolutions.labels(pool, "ok").inc()
        if self.state.set_discovered(pool, members, self._clock()):
            log_event(
                log,
                "info",
                "DNS discovery changed a pool",
                pool=pool,
                backends=[address for address, _ in members],
            )
            self._health.sync(self.state.check_targets())
            self._publish()

    def _on_dns_error(self, pool: str, exc: BaseException) -> None:
        self.metrics.dns_resolutions.labels(pool, "error").inc()

    async def _sync_watchers(self, *, first: bool) -> None:
        wanted = {p.name: p.dns for p in self.config.pools if p.dns is not None}
        for name, watcher in list(self._watchers.items()):
            if wanted.get(name) != watcher.config:
                await watcher.close()
                del self._watchers[name]
        for name, dns in wanted.items():
            if name in self._watchers:
                continue
            watcher = DnsWatcher(name, dns, self._on_members, self._on_dns_error)
            self._watchers[name] = watcher
            if first:
                await watcher.resolve_once()
            watcher.start(resolved=first)

    # -- output ------------------------------------------------------------------------

    def _publish(self) -> None:
        self.snapshots = self.state.snapshots()
        for snapshot in self.snapshots:
            for backend in snapshot.backends:
                labels = (snapshot.name, backend.address)
                self.metrics.backend_healthy.labels(*labels).set(1 if backend.healthy else 0)
                self.metrics.backend_drained.labels(*labels).set(1 if backend.drained else 0)
        self._publish_to(self.snapshots)

    def status(self) -> dict[str, dict[str, dict[str, object]]]:
        """Pools and their backends, for the admin's /healthz and /backends."""
        return {
            snapshot.name: {
                backend.address: {
                    "healthy": backend.healthy,
                    "drained": backend.drained,
                    "weight": backend.weight,
                }
                for backend in snapshot.backends
            }
            for snapshot in self.snapshots
        }
