"""The admin's status page (/status, /status.json) on a real edge and origin:
what an operator reads in an incident, and the drain button, in a real
browser (headless Chromium, driven over the DevTools protocol)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from geoedge.version import build_mode, package_version
from tests.browser import Browser, chromium_path
from tests.conftest import PkiFiles, run_async, scaled
from tests.edge_env import Stack, edge_stack, node_available

pytestmark = pytest.mark.skipif(not node_available(), reason="run `make node` first")


def fetch(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        if path.startswith("/status"):
            assert response.headers["Cache-Control"] == "no-store"
        return response.read()


def status(port: int) -> dict[str, Any]:
    return json.loads(fetch(port, "/status.json"))


def table(page: dict[str, Any], title: str) -> list[list[str]]:
    (found,) = [t for t in page["tables"] if t["title"].startswith(title)]
    return [[c["text"] for c in row["cells"]] for row in found["rows"]]


def fact(page: dict[str, Any], label: str) -> str:
    return next(value["text"] for name, value in page["facts"] if name == label)


def until(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + scaled(timeout)
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.3)


def test_the_edge_page_shows_its_tunnels_and_where_the_time_goes(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        status(stack.admin_port)  # the window's first snapshot
        for _ in range(10):
            assert stack.get("/")[0] == 200

        def phases() -> dict[str, Any] | None:
            page = status(stack.admin_port)
            rows = table(page, "Where the time goes")
            return page if any(r[0] == "request (h1)" for r in rows) else None

        page = until(phases)
        assert page is not None, "no request figures on the status page"
        assert fact(page, "state") == "serving"
        ((origin, _, state, connections, _, rtt_now, *_, ttfb95, rate, resent),) = table(
            page, "Tunnels"
        )
        assert (origin, state) == ("origin-a", "up")
        assert int(connections) >= 1 and rtt_now.endswith("ms") and ttfb95.endswith("ms")
        assert rate.endswith("/s") and float(rate[:-2]) > 0
        # Octets the tunnel sockets retransmitted, of those they sent (TCP_INFO): the
        # requests went out, so there is a ratio, and loopback hardly loses any.
        assert resent.endswith(" %") and float(resent[:-2]) < 5, resent
        assert any(row[0].startswith("TLS handshake (TLSv1.3)") for row in table(page, "Where"))
        workers = table(page, "Workers")
        assert workers, "no worker rows"
        # Each worker says which version it runs (a reload shows old and new).
        assert {row[1] for row in workers} == {f"{package_version()} ({build_mode()})"}

        html = fetch(stack.admin_port, "/status").decode()
        assert html.startswith("<!doctype html>") and "<main>" in html and "origin-a" in html
        fragment = fetch(stack.admin_port, "/status?fragment=1").decode()
        assert fragment.startswith("<h1>") and "<script>" not in fragment

        stack.stop_origin()
        down = until(lambda: table(status(stack.admin_port), "Tunnels")[0][2] == "down")
        assert down, "a lost tunnel is not shown as down"


def test_the_origin_page_shows_edges_and_backends(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        port = stack.origin_admin_port
        status(port)
        for _ in range(10):
            assert stack.get("/")[0] == 200

        def backends() -> list[list[str]] | None:
            rows = table(status(port), "Backends")
            # Streams per second: from the per-stream counts, published once a second.
            settled = rows and rows[0][5] not in ("-", "0.0/s") and rows[0][4] == "0"
            return rows if settled else None

        rows = until(backends)
        assert rows, "no stream figures on the origin's status page"
        ((pool, backend, state, _, in_flight, streams, _, first95, _),) = rows
        assert (pool, state, in_flight) == ("app", "up", "0")
        assert backend == f"127.0.0.1:{stack.node_port}"
        assert float(streams[:-2]) > 0 and first95.endswith("ms"), rows

        def edges_with_rtt() -> dict[str, Any] | None:
            page = status(port)
            return page if table(page, "Edges")[0][2] != "-" else None

        page = until(edges_with_rtt)
        assert page, "no edge RTT on the origin's status page"
        ((edge, connections, rtt, resent),) = table(page, "Edges")
        assert edge == "edge-1" and int(connections) >= 1 and rtt.endswith("ms")
        assert resent.endswith(" %") and float(resent[:-2]) < 5, resent
        assert fact(page, "state") == "serving"
        assert table(page, "Workers"), "no worker rows"
        (backend_row,) = next(t for t in page["tables"] if t["title"] == "Backends")["rows"]
        assert [a["label"] for a in backend_row["actions"]] == ["drain"]


ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts"


@pytest.mark.skipif(chromium_path() is None, reason="chromium: make test installs it")
def test_in_a_browser_the_drain_button_drains_and_the_page_refreshes_in_place(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with edge_stack(test_pki, tmp_path) as stack:
        for _ in range(5):
            assert stack.get("/")[0] == 200
        run_async(drive_the_browser(stack), 120)
    assert (ARTIFACTS / "status-origin.png").stat().st_size > 10_000
    assert (ARTIFACTS / "status-edge.png").stat().st_size > 10_000


async def drive_the_browser(stack: Stack) -> None:
    origin = f"http://127.0.0.1:{stack.origin_admin_port}/status"
    async with Browser() as browser:
        await browser.open(origin)
        state = "document.querySelector('table[data-table=backends] td:nth-child(3)').textContent"
        assert await browser.evaluate(state) == "up"
        assert await browser.evaluate("document.querySelectorAll('form button').length") == 1

        # The button: a form POST, answered 303 back to the page, which shows the drain.
        await browser.evaluate("document.querySelector('form button').click()")
        await browser.wait_event("Page.loadEventFired")
        assert await browser.evaluate("location.pathname") == "/status"
        assert await browser.evaluate(state) == "drained"
        assert await browser.evaluate("document.querySelector('form button').textContent") == (
            "undrain"
        )
        (drained,) = json.loads(fetch(stack.origin_admin_port, "/backends"))["app"].values()
        assert drained["drained"] is True
        await browser.screenshot(ARTIFACTS / "status-origin.png")

        # Undrained through the API: the open page shows it within a refresh or
        # two, without reloading (the marker set on the window survives).
        await browser.evaluate("window.notReloaded = true")
        backend = f"127.0.0.1:{stack.node_port}"
        request = urllib.request.Request(
            f"http://127.0.0.1:{stack.origin_admin_port}/backends/app/{backend}/undrain",
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.loads(response.read())["drained"] is False
        deadline = time.monotonic() + scaled(15)
        while await browser.evaluate(state) != "up":
            assert time.monotonic() < deadline, "the page did not refresh in place"
            await asyncio.sleep(0.5)
        assert await browser.evaluate("window.notReloaded") is True

        await browser.open(f"http://127.0.0.1:{stack.admin_port}/status")
        tunnel = "document.querySelector('table[data-table=tunnels] td:nth-child(3)').textContent"
        assert await browser.evaluate(tunnel) == "up"
        await browser.screenshot(ARTIFACTS / "status-edge.png")
