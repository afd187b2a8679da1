"""Active health checks: an HTTP GET per backend per interval (aiohttp).

One task per (pool, backend); each reports pass/fail to ``on_result`` and the
control state decides (rise/fall: :class:`origin.balancer.RiseFall`). A pass is
a 2xx or 3xx answer within ``timeout_s``; anything else (refused, reset,
timeout, 4xx/5xx) is a failure. Checks run in the parent only, once for the
whole origin, not once per worker.

The first check of each backend starts at a random point of its interval, so
a pool's checks do not all fire in the same millisecond. Connections are not
reused (``force_close``): a check should prove that a *new* connection works,
which is what a stream needs.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

import aiohttp

from origin.config import HealthCheckConfig
from tunnel.aio.transport import parse_host_port

__all__ = ["HealthChecker", "check_once"]

log = logging.getLogger("geoedge.origin.health")

Target = tuple[str, str]  # (pool, address)
ResultSink = Callable[[str, str, bool], None]


def _url(address: str, path: str) -> str:
    host, port = parse_host_port(address)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"


async def check_once(
    session: aiohttp.ClientSession, address: str, check: HealthCheckConfig
) -> bool:
    """One check of ``address``; True on a 2xx/3xx answer in time."""
    try:
        async with session.get(
            _url(address, check.path),
            timeout=aiohttp.ClientTimeout(total=check.timeout_s),
            allow_redirects=False,
        ) as response:
            return response.status < 400
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


class HealthChecker:
    """Keeps one check loop per target; :meth:`sync` adds and removes them."""

    def __init__(self, on_result: ResultSink, *, rng: random.Random | None = None) -> None:
        self._on_result = on_result
        self._rng = rng or random.Random()
        self._tasks: dict[Target, tuple[HealthCheckConfig, asyncio.Task[None]]] = {}
        self._session: aiohttp.ClientSession | None = None

    def sync(self, targets: dict[Target, HealthCheckConfig]) -> None:
        """Run exactly ``targets``: start new ones, stop gone or changed ones."""
        for target, (check, task) in list(self._tasks.items()):
            if targets.get(target) != check:
                task.cancel()
                del self._tasks[target]
        for target, check in targets.items():
            if target not in self._tasks:
                task = asyncio.get_running_loop().create_task(
                    self._run(target, check), name=f"health {target[0]}/{target[1]}"
                )
                self._tasks[target] = (check, task)

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True, limit=0),
                headers={"User-Agent": "geoedge-origin-health"},
                auto_decompress=False,
            )
        return self._session

    async def _run(self, target: Target, check: HealthCheckConfig) -> None:
        pool, address = target
        await asyncio.sleep(self._rng.uniform(0.0, check.interval_s))
        while True:
            started = time.monotonic()
            passed = await check_once(self._client(), address, check)
            try:
                self._on_result(pool, address, passed)
            except Exception:
                log.exception("health result for %s/%s not recorded", pool, address)
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, check.interval_s - elapsed))
