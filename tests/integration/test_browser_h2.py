"""A real browser through the edge: headless Chromium loads a page whose 30
subresources it fetches at once. Over HTTP/2 they share one connection (no
waves of six), and the page's WebSocket echoes through the same edge."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import Browser, chromium_path
from tests.conftest import PkiFiles, run_async
from tests.edge_env import Stack, edge_stack, node_available

pytestmark = [
    pytest.mark.skipif(not node_available(), reason="run `make node` first"),
    pytest.mark.skipif(chromium_path() is None, reason="chromium: make test installs it"),
]

#: The test CA is not in Chromium's store; the TLS under test is checked by the
#: other tests (and here: the handshake is real, with ALPN).
BROWSER_ARGS = ("--ignore-certificate-errors",)

FETCH_30 = """
(async () => {
  const started = performance.now();
  const answers = await Promise.all(
    Array.from({length: 30}, (_, i) => fetch('/slow?ms=100&n=' + i).then(r => r.status)));
  return {answers, ms: performance.now() - started};
})()
"""


async def load_the_page(stack: Stack) -> tuple[dict[str, object], list[dict[str, object]], str]:
    async with Browser(extra_args=BROWSER_ARGS) as browser:
        await browser.call("Network.enable")
        await browser.open(f"https://localhost:{stack.https_port}/")
        fetched = await browser.evaluate(FETCH_30)
        echoed = ""
        for _ in range(100):  # the page's own WebSocket echo
            echoed = await browser.evaluate("document.getElementById('ws').textContent")
            if echoed.startswith("echoed"):
                break
            await browser.evaluate("new Promise(r => setTimeout(r, 100))")
        responses = [
            event["params"]["response"]
            for event in browser.events
            if event["method"] == "Network.responseReceived"
        ]
        return fetched, responses, echoed


def test_thirty_subresources_share_one_http2_connection_and_the_websocket_echoes(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        fetched, responses, echoed = run_async(load_the_page(stack), 90)
    assert fetched["answers"] == [200] * 30  # type: ignore[index]
    slow = [r for r in responses if "/slow?" in str(r["url"])]
    assert len(slow) == 30
    assert {r["protocol"] for r in slow} == {"h2"}
    # One connection for the page and all 30 (HTTP/1.1 would open six).
    page = next(r for r in responses if str(r["url"]).endswith(f":{stack.https_port}/"))
    assert page["protocol"] == "h2"
    assert {r["connectionId"] for r in slow} == {page["connectionId"]}
    assert echoed.startswith("echoed"), echoed
    print(f"30 fetches of a 100 ms endpoint: {fetched['ms']:.0f} ms")
