"""The edge's admin endpoint for a single-process edge: ``/healthz`` (200 only
while a tunnel is up) and Prometheus ``/metrics``. Multi-worker edges serve the
same from the supervisor (:mod:`tunnel.runtime.workers`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tunnel.aio.transport import parse_host_port

if TYPE_CHECKING:
    from edge.worker import EdgeWorker


async def start_admin(address: str, worker: EdgeWorker) -> web.AppRunner:
    async def healthz(request: web.Request) -> web.Response:
        if worker.origins.any_usable and not worker.draining:
            return web.Response(text="ok\n")
        return web.Response(status=503, text="no usable tunnel\n")

    async def metrics(request: web.Request) -> web.Response:
        worker._export_tunnel_metrics()
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = parse_host_port(address)
    await web.TCPSite(runner, host, port).start()
    return runner
