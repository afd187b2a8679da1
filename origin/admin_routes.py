"""The origin's own part of its admin listener (:class:`geoedge.admin.AdminServer`):
the backends and their drains, and the filter that keeps a removed backend's
series out of ``/metrics``.

- ``GET /backends``: the pools and their backends (healthy, drained, weight);
- ``POST /backends/<pool>/<host:port>/drain`` and ``/undrain``: JSON, or, from
  the status page's button (an HTML form), a redirect back to the page.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client.metrics_core import Metric

from origin.control import ControlPlane
from origin.state import UnknownBackend

__all__ = ["backend_routes", "current_backends_only"]


def backend_routes(control: ControlPlane) -> list[web.RouteDef]:
    async def backends(request: web.Request) -> web.Response:
        return web.json_response(control.status())

    async def drain(request: web.Request) -> web.Response:
        pool, address = request.match_info["pool"], request.match_info["address"]
        drained = request.path.endswith("/drain")
        try:
            changed = control.drain(pool, address, drained)
        except UnknownBackend as exc:
            return web.json_response({"error": str(exc.args[0])}, status=404)
        if request.content_type == "application/x-www-form-urlencoded":
            # The status page's button (an HTML form): back to the page.
            raise web.HTTPSeeOther("/status")
        return web.json_response(
            {"pool": pool, "backend": address, "drained": drained, "changed": changed}
        )

    return [
        web.get("/backends", backends),
        web.post("/backends/{pool}/{address}/drain", drain),
        web.post("/backends/{pool}/{address}/undrain", drain),
    ]


def current_backends_only(control: ControlPlane, families: list[Metric]) -> list[Metric]:
    """The series of backends the pools still have: a backend removed by a
    reload or by DNS disappears from /metrics with it."""
    current = {
        (pool, address) for pool, backends in control.status().items() for address in backends
    }
    for family in families:
        family.samples = [
            sample
            for sample in family.samples
            if "backend" not in sample.labels
            or "pool" not in sample.labels
            or (sample.labels["pool"], sample.labels["backend"]) in current
        ]
    return [family for family in families if family.samples]
