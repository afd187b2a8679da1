"""The admin listener: /readyz (and /healthz) follow the daemon's readiness,
/livez its liveness, each on its own, /metrics serves the
registries, daemon routes are added, port 0 binds a free port."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from geoedge.admin import AdminServer
from geoedge.metrics import MetricSet
from tests.acme_env import free_port_on
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


def test_a_hand_over_answers_what_it_holds_and_keeps_the_listener() -> None:
    """Before a reload's exec (geoedge.reload): a request in progress is
    answered, a connection made after it waits in the listener's queue, and
    the same listener serves again (the next image, or this one when the
    exec failed)."""
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="answered")

    async def get(port: int, path: str) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}{path}") as response,
        ):
            return response.status, await response.text()

    async def main() -> tuple[tuple[int, str], tuple[int, str], bool, bool]:
        address = f"127.0.0.1:{free_port_on('127.0.0.1')}"  # (port 0: start binds anew)
        admin = AdminServer(address, health=lambda: (True, {}), routes=[web.get("/slow", slow)])
        await admin.start()
        port, listener = admin.port, admin.listening_socket()
        assert listener is not None
        in_progress = asyncio.ensure_future(get(port, "/slow"))
        await asyncio.sleep(0.2)  # the request is in its handler
        handing_over = asyncio.ensure_future(admin.hand_over())
        await asyncio.sleep(0.2)
        held = not handing_over.done()  # it waits for the request in progress
        release.set()
        await handing_over
        kept = admin.listening_socket()
        assert kept is not None and kept.getsockname() == ("127.0.0.1", port)
        after = asyncio.ensure_future(get(port, "/livez"))  # queued, not refused
        await asyncio.sleep(0.2)
        queued = not after.done()
        await admin.start(kept)
        try:
            return await in_progress, await asyncio.wait_for(after, 5), held, queued
        finally:
            await admin.close()

    answered, later, held, queued = run_async(main(), 15)
    assert answered == (200, "answered")
    assert held and queued
    assert later[0] == 200
