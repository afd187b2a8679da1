"""A real browser for tests: headless Chromium driven over the DevTools protocol.

Debian's ``chromium`` (the Makefile installs it) with ``--remote-debugging-port``
and aiohttp's WebSocket client; no driver package. Enough for what the tests
do: open a page, run JavaScript in it (read the DOM, click), take a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from tests.conftest import scaled

__all__ = ["Browser", "chromium_path"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """``async with Browser() as browser: await browser.open(url)``."""

    def __init__(
        self, width: int = 1280, height: int = 900, *, extra_args: tuple[str, ...] = ()
    ) -> None:
        self._width, self._height = width, height
        self._extra_args = extra_args
        #: Every DevTools event since start (Network.* once ``Network.enable`` is called).
        self.events: list[dict[str, Any]] = []
        self._profile = tempfile.TemporaryDirectory(prefix="geoedge-chromium-")
        self._process: subprocess.Popen[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Browser:
        binary = chromium_path()
        assert binary is not None, "chromium is not installed (make test installs it)"
        profile = Path(self._profile.name)
        self._process = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # root in a container
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={self._width},{self._height}",
                *self._extra_args,
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # its helpers are stopped with it, as a group
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + scaled(30)
        while not port_file.exists() or not port_file.read_text().strip():
            assert self._process.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        page = next(t for t in targets if t["type"] == "page")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        await self.call("Page.enable")
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=self._width,
            height=self._height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()
        if self._process is not None:
            self._stop_group(signal.SIGTERM)
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._stop_group(signal.SIGKILL)  # helpers that outlived it would write on
        # A helper may still be flushing into the profile as it dies.
        for _ in range(20):
            try:
                self._profile.cleanup()
                break
            except OSError:
                time.sleep(0.1)

    def _stop_group(self, sig: signal.Signals) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, sig)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        assert self._ws is not None
        message_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[message_id] = future
        await self._ws.send_str(json.dumps({"id": message_id, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, scaled(30))
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})  # type: ignore[no-any-return]

    async def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        while not self._events.empty():
            self._events.get_nowait()
        await self.call("Page.navigate", url=url)
        await self.wait_event("Page.loadEventFired")

    async def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        async def wait() -> dict[str, Any]:
            while True:
                event = await self._events.get()
                if event["method"] == method:
                    return event

        return await asyncio.wait_for(wait(), timeout)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited)."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        """A PNG of the whole page (not just the viewport)."""
        height = await self.evaluate("document.documentElement.scrollHeight")
        result = await self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": self._width, "height": height, "scale": 1},
        )
        path.write_bytes(base64.b64decode(result["data"]))

    async def _read(self) -> None:
        assert self._ws is not None
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                self.events.append(data)
                self._events.put_nowait(data)
