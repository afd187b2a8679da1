"""The admin HTTP listener both daemons run in their parent process (aiohttp).

Built in, with Kubernetes' names for the two questions a fleet asks:

- ``GET /livez``: liveness, "is this process and are its listeners working?"
  (the ``liveness`` callable). Only a failing liveness check should replace a
  host or restart the daemon: it stays 200 while the origin is down, while
  this edge is refused by the origin, and during a drain.
- ``GET /readyz``: readiness, "should users be sent here?" (the ``health``
  callable: the edge has a usable tunnel, the origin a usable backend). A
  failing readiness check moves traffic elsewhere and replaces nothing.
- ``GET /healthz``: the same as ``/readyz`` (the name older checks use).

Each answers 200 or 503 with the JSON detail the daemon's callable returns,
so a load balancer reads the status and a person reads why.
- ``GET /metrics``: the Prometheus text format (:func:`geoedge.metrics.exposition`:
  every worker's metrics merged in multiprocess mode).

- ``GET /status`` (and ``/status.json``): the daemon's status page
  (:mod:`geoedge.status_page`) when it gives a ``status`` source, which
  the admin samples every few seconds for its last-minute figures.

A daemon adds its own routes (the origin's backend drain) with ``routes``.
There is no authentication: bind it to loopback or a management network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from geoedge.metrics import FamilyFilter, exposition
from geoedge.status_page import REFRESH_S, StatusPage, render, render_main
from geoedge.systemd import same_address
from tunnel.aio.transport import parse_host_port

__all__ = ["AdminServer", "HealthReport"]

log = logging.getLogger("geoedge.admin")

#: How long requests in progress have to finish when the admin server stops
#: (a reload's exec, the daemon's stop): a scrape or a purge takes milliseconds.
HANDOVER_TIMEOUT_S = 5.0

#: ``health()`` and ``liveness()`` return (ok, detail); the detail becomes the JSON body.
HealthReport = tuple[bool, dict[str, Any]]


def _always_live() -> HealthReport:
    return True, {}


class StatusSource(Protocol):
    """What a daemon gives the admin for its status page."""

    def sample(self) -> None:
        """Take a snapshot of the metrics (called every few seconds)."""

    def page(self) -> StatusPage: ...


class AdminServer:
    """``await start()`` binds ``address``; ``await close()`` stops. ``port`` is the
    bound port (useful with port 0)."""

    def __init__(
        self,
        address: str,
        *,
        health: Callable[[], HealthReport],
        liveness: Callable[[], HealthReport] = _always_live,
        registries: Sequence[CollectorRegistry] = (),
        routes: Sequence[web.AbstractRouteDef] = (),
        status: StatusSource | None = None,
        keep_metrics: FamilyFilter | None = None,
        collectors: Sequence[Collector] = (),
    ) -> None:
        self.address = address
        self._health = health
        self._liveness = liveness
        self._registries = tuple(registries)
        self._status = status
        self._keep_metrics = keep_metrics
        # The parent's own collectors (certificate expiry): outside the
        # multiprocess files, appended to what the workers export.
        self._own = CollectorRegistry(auto_describe=False)
        for collector in collectors:
            self._own.register(collector)
        self._app = web.Application()
        self._app.add_routes(
            [
                web.get("/livez", self._livez),
                web.get("/readyz", self._readyz),
                web.get("/healthz", self._readyz),
                web.get("/metrics", self._metrics),
                *routes,
            ]
        )
        if status is not None:
            self._app.add_routes(
                [web.get("/status", self._status_page), web.get("/status.json", self._status_json)]
            )
        self._sampler: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self.port = 0

    async def start(self, inherited: socket.socket | None = None) -> None:
        """Listen; on ``inherited`` (the socket of the supervisor's previous image,
        :mod:`geoedge.reexec`) if it is bound to this address, else on a new one."""
        host, port = parse_host_port(self.address)
        if inherited is not None and same_address(inherited, host, port):
            self._sock = inherited
        else:
            if inherited is not None:
                inherited.close()  # the reload moved the admin listener
            # Our own socket rather than TCPSite: the bound port (port 0 in tests) and
            # the descriptor (which forked workers close) are then ours to read.
            self._sock = socket.create_server(
                (host, port), family=_family(host), reuse_port=False, backlog=128
            )
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._runner = web.AppRunner(
            self._app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=HANDOVER_TIMEOUT_S,
        )
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()
        if self._status is not None:
            self._sampler = asyncio.get_running_loop().create_task(self._sample(self._status))
        log.info("admin listening on %s:%d", host, self.port)

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def hand_over(self) -> None:
        """Stop serving before the supervisor re-executes (:mod:`geoedge.reload`),
        and lose no request: the listening socket stays open (the next image
        serves it, and connections made meanwhile wait in its queue), idle
        keep-alive connections close, and requests in progress are answered
        first (at most :data:`HANDOVER_TIMEOUT_S`). An exec ends every accepted
        connection, answered or not. ``await start(listening_socket())``
        serves again (an exec that failed)."""
        if self._runner is None or self._sock is None:
            return
        # The server closes the socket it serves (uvloop detaches it): a
        # duplicate of its descriptor keeps it listening.
        kept = socket.socket(fileno=os.dup(self._sock.fileno()))
        served, self._sock = self._sock, kept
        await self._runner.cleanup()
        self._runner = None
        served.close()  # (closed already by the server: then a no-op)

    def listening_socket(self) -> socket.socket | None:
        """The listening socket (what a re-exec passes on)."""
        return self._sock

    def fileno(self) -> int | None:
        """The listening socket's descriptor (a forked worker closes its copy)."""
        return self._sock.fileno() if self._sock is not None else None

    async def _readyz(self, request: web.Request) -> web.Response:
        ready, detail = self._health()
        body = {"ready": ready, "healthy": ready, **detail}
        return web.json_response(body, status=200 if ready else 503, headers=_NO_STORE)

    async def _livez(self, request: web.Request) -> web.Response:
        live, detail = self._liveness()
        body = {"live": live, **detail}
        return web.json_response(body, status=200 if live else 503, headers=_NO_STORE)

    async def _sample(self, status: StatusSource) -> None:
        while True:
            try:
                status.sample()
            except Exception:  # a page with old figures beats no admin
                log.exception("status sample failed")
            await asyncio.sleep(REFRESH_S)

    async def _status_page(self, request: web.Request) -> web.Response:
        assert self._status is not None
        self._status.sample()  # the freshest figures (the window keeps its span)
        page = self._status.page()
        body = render_main(page) if request.query.get("fragment") else render(page)
        return web.Response(text=body, content_type="text/html", headers=_NO_STORE)

    async def _status_json(self, request: web.Request) -> web.Response:
        assert self._status is not None
        self._status.sample()
        return web.json_response(self._status.page().as_json(), headers=_NO_STORE)

    async def _metrics(self, request: web.Request) -> web.Response:
        body, content_type = exposition(self._registries, self._keep_metrics)
        response = web.Response(body=body + generate_latest(self._own))
        response.headers["Content-Type"] = content_type
        return response


_NO_STORE = {"Cache-Control": "no-store"}


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
