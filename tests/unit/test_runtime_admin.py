"""The admin listener: /readyz (and /healthz) follow the daemon's readiness,
/livez its liveness, each on its own, /metrics serves the
registries, daemon routes are added, port 0 binds a free port."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from geoedge.admin import AdminServer
from geoedge.metrics import MetricSet
from tests.conftest import run_async


def test_healthz_metrics_and_extra_routes() -> None:
    state = {"ok": True, "live": True}
    metrics = MetricSet("demo")
    metrics.counter("hits", "hits").inc(3)

    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"hello": request.match_info["name"]})

    async def main() -> list[tuple[int, object]]:
        admin = AdminServer(
            "127.0.0.1:0",
            health=lambda: (state["ok"], {"workers": 2}),
            liveness=lambda: (state["live"], {"workers": 2}),
            registries=[metrics.registry],
            routes=[web.post("/hello/{name}", hello)],
        )
        await admin.start()
        assert admin.port > 0 and admin.fileno() is not None
        results: list[tuple[int, object]] = []
        base = f"http://127.0.0.1:{admin.port}"
        try:
            async with aiohttp.ClientSession() as session:
                for method, path in [
                    ("GET", "/healthz"),
                    ("FLIP", ""),
                    ("GET", "/healthz"),
                    ("GET", "/readyz"),
                    ("GET", "/livez"),
                    ("KILL", ""),
                    ("GET", "/livez"),
                    ("GET", "/metrics"),
                    ("POST", "/hello/world"),
                    ("GET", "/nope"),
                ]:
                    if method == "FLIP":
                        state["ok"] = False
                        continue
                    if method == "KILL":
                        state["live"] = False
                        continue
                    async with session.request(method, base + path) as response:
                        body = await response.text()
                        if response.content_type == "application/json":
                            body = await response.json()
                        results.append((response.status, body))
        finally:
            await admin.close()
        assert admin.fileno() is None
        return results

    healthy, sick, not_ready, live, dead, text, hello_result, missing = run_async(main(), 15)
    assert healthy == (200, {"ready": True, "healthy": True, "workers": 2})
    assert sick == (503, {"ready": False, "healthy": False, "workers": 2})
    assert not_ready == sick
    # Not ready is not dead: liveness answers on its own.
    assert live == (200, {"live": True, "workers": 2})
    assert dead == (503, {"live": False, "workers": 2})
    assert text[0] == 200 and "demo_hits_total 3.0" in str(text[1])
    assert hello_result == (200, {"hello": "world"})
    assert missing[0] == 404
