"""The edge's cache through the real chain: hits, revalidation, collapsing,
compression, ranges, HEAD (Node.js counts what reaches it)."""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
import time
from collections.abc import Iterator

import aiohttp
import brotli
import pytest
import zstandard

from tests.cache_env import CacheStack, cache_stack, start_backend
from tests.conftest import PkiFiles, run_async, scaled
from tests.edge_env import Processes, edge_stack, node_available
from tests.tunnel_env import free_port

pytestmark = [
    pytest.mark.timeout(scaled(120)),
    pytest.mark.skipif(not node_available(), reason="needs Node.js (make node)"),
]


@pytest.fixture(scope="module")
def chain(test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CacheStack]:
    with cache_stack(test_pki, tmp_path_factory.mktemp("cache"), compression=True) as s:
        yield s


def test_a_fresh_response_is_served_from_the_edge_with_age_and_cache_status(
    chain: CacheStack,
) -> None:
    path = "/hit?cc=public,max-age=60"
    first = chain.fetch(path)
    second = chain.fetch(path)
    assert first.status == second.status == 200
    assert first.body == second.body
    assert "fwd=uri-miss" in (first.field("Cache-Status") or "")
    assert "stored" in (first.field("Cache-Status") or "")
    assert (second.field("Cache-Status") or "").startswith("test-edge; hit; ttl=")
    assert second.field("Age") is not None
    assert chain.count("/hit") == 1


def test_a_stale_response_is_revalidated_with_its_etag_and_freshened_by_the_304(
    chain: CacheStack,
) -> None:
    path = '/reval?cc=max-age=0&etag="v1"'
    first = chain.fetch(path)
    second = chain.fetch(path)
    assert chain.count("/reval") == 2  # the second went up, conditionally
    assert second.status == 200 and second.body == first.body
    assert "fwd=stale; fwd-status=304" in (second.field("Cache-Status") or "")


def test_a_client_if_none_match_on_a_hit_gets_a_304_from_the_edge(chain: CacheStack) -> None:
    path = '/inm?cc=max-age=60&etag="abc"'
    chain.fetch(path)
    reply = chain.fetch(path, {"If-None-Match": '"abc"'})
    assert reply.status == 304
    assert reply.field("ETag") == '"abc"'
    assert chain.count("/inm") == 1


def test_head_is_answered_from_a_stored_get(chain: CacheStack) -> None:
    path = "/head?cc=max-age=60"
    got = chain.fetch(path)
    head = chain.fetch(path, method="HEAD")
    assert head.status == 200 and head.body == b""
    assert head.field("Content-Length") == str(len(got.body))
    assert chain.count("/head") == 1


def test_a_range_is_served_from_a_stored_whole_response(chain: CacheStack) -> None:
    path = "/range?cc=max-age=60&size=100"
    whole = chain.fetch(path)
    part = chain.fetch(path, {"Range": "bytes=10-19"})
    assert part.status == 206
    assert part.body == whole.body[10:20]
    assert part.field("Content-Range") == "bytes 10-19/100"
    beyond = chain.fetch(path, {"Range": "bytes=500-"})
    assert beyond.status == 416
    assert chain.count("/range") == 1


def test_a_post_invalidates_the_stored_response(chain: CacheStack) -> None:
    path = "/inval?cc=max-age=60"
    chain.fetch(path)
    chain.fetch(path)
    assert chain.count("/inval") == 1
    chain.fetch(path, method="POST", body=b"x")
    chain.fetch(path)
    assert chain.count("/inval") == 3


@pytest.mark.parametrize(
    ("coding", "decode"),
    [("zstd", zstandard.ZstdDecompressor().decompressobj), ("br", None), ("gzip", None)],
)
def test_a_text_response_is_compressed_once_and_served_compressed_from_the_cache(
    chain: CacheStack, coding: str, decode: object
) -> None:
    path = f"/text-{coding}?cc=public,max-age=60&size=20000&type=text/css"
    plain = chain.fetch(path)
    assert plain.field("Content-Encoding") is None
    assert "Accept-Encoding" in (plain.field("Vary") or "")
    packed = chain.fetch(path, {"Accept-Encoding": coding})
    assert packed.field("Content-Encoding") == coding
    assert len(packed.body) < len(plain.body) // 4
    if coding == "zstd":
        body = zstandard.ZstdDecompressor().decompressobj().decompress(packed.body)
    elif coding == "br":
        body = brotli.decompress(packed.body)
    else:
        body = gzip.decompress(packed.body)
    assert body == plain.body
    assert chain.count(f"/text-{coding}") == 1


def test_a_miss_is_compressed_on_its_way_and_its_chunks_are_whole(chain: CacheStack) -> None:
    path = "/chunked?cc=public,max-age=60&size=50000&type=application/json&chunked=1"
    first = chain.fetch(path, {"Accept-Encoding": "gzip"})
    assert first.field("Content-Encoding") == "gzip"
    body = gzip.decompress(first.body)
    assert len(body) == 50000
    second = chain.fetch(path, {"Accept-Encoding": "gzip"})
    assert gzip.decompress(second.body) == body
    assert chain.count("/chunked") == 1


def concurrent_gets(chain: CacheStack, path: str, count: int) -> list[tuple[int, bytes]]:
    """``count`` GETs of ``path`` at once, each on a connection of its own."""
    context = ssl.create_default_context(cafile=str(chain.stack.pki.ca))
    url = f"https://localhost:{chain.stack.https_port}{path}"

    async def one(session: aiohttp.ClientSession) -> tuple[int, bytes]:
        async with session.get(url, ssl=context) as response:
            return response.status, await response.read()

    async def all_at_once() -> list[tuple[int, bytes]]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            return await asyncio.gather(*(one(session) for _ in range(count)))

    return run_async(all_at_once(), timeout=60)


def test_one_hundred_concurrent_requests_for_a_cold_key_reach_node_once(
    chain: CacheStack,
) -> None:
    replies = concurrent_gets(chain, "/cold?cc=public,max-age=60&delay=300", 100)
    assert [status for status, _ in replies] == [200] * 100
    assert len({body for _, body in replies}) == 1
    assert chain.count("/cold") == 1


def test_waiters_go_to_the_origin_themselves_when_the_answer_is_not_storable(
    chain: CacheStack,
) -> None:
    replies = concurrent_gets(chain, "/uncacheable?cc=no-store&delay=200", 10)
    assert [status for status, _ in replies] == [200] * 10
    assert chain.count("/uncacheable") == 10


def test_waiters_go_up_at_the_head_of_an_answer_not_storable_not_after_its_body(
    chain: CacheStack,
) -> None:
    # Node sends the head and half the body at once and the rest after
    # ``body_delay``: all six requests reach it while the first body is held,
    # or the five that waited behind it were held until that body ended.
    body_delay_s = scaled(8)
    path = f"/held-body?cc=no-store&size=4000&body_delay={int(body_delay_s * 1000)}"
    context = ssl.create_default_context(cafile=str(chain.stack.pki.ca))
    url = f"https://localhost:{chain.stack.https_port}{path}"

    async def one(session: aiohttp.ClientSession) -> bytes:
        async with session.get(url, ssl=context) as response:
            return await response.read()

    async def run() -> tuple[int, float]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            started = time.monotonic()
            tasks = [asyncio.ensure_future(one(session)) for _ in range(6)]
            try:
                while (seen := await asyncio.to_thread(chain.count, "/held-body")) < 6:
                    if time.monotonic() - started > body_delay_s / 2:
                        break
                    await asyncio.sleep(0.05)
                return seen, time.monotonic() - started
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    seen, after_s = run_async(run(), timeout=scaled(60))
    assert seen == 6, f"{seen} of 6 requests reached Node in {after_s:.1f} s"


def test_a_purge_by_tag_url_and_prefix_through_the_edge_admin_api(chain: CacheStack) -> None:
    tagged = "/purge-tag?cc=max-age=60&tag=product-1%20all"
    by_url = "/purge-url?cc=max-age=60"
    by_prefix = "/purge-prefix/a?cc=max-age=60"
    for path in (tagged, by_url, by_prefix):
        chain.fetch(path)
        assert "hit" in (chain.fetch(path).field("Cache-Status") or "")
    assert chain.fetch(tagged).field("Surrogate-Key") is None  # stripped for the client
    base = "https://localhost"
    for body in (
        b'{"tag": "product-1"}',
        b'{"url": "%s%s"}' % (base.encode(), by_url.encode()),
        b'{"prefix": "%s/purge-prefix/"}' % base.encode(),
    ):
        status, answer = chain.admin("POST", "/cache/purge", body)
        assert status == 200, answer
        report = json.loads(answer)
        assert report["complete"] is True
        [worker] = report["workers"]  # the one worker purged its one entry
        assert worker["purged"] == 1 and worker["error"] is None
    for path in (tagged, by_url, by_prefix):
        assert "fwd=uri-miss" in (chain.fetch(path).field("Cache-Status") or "")
    status, answer = chain.admin("POST", "/cache/purge", b'{"tags": "x"}')
    assert status == 400 and b"unknown key" in answer


def test_the_cache_metrics_count_hits_and_what_is_held(chain: CacheStack) -> None:
    path = "/metrics-hit?cc=max-age=60"
    chain.fetch(path)
    chain.fetch(path)

    def hits() -> float:
        for line in chain.stack.metrics().splitlines():
            if line.startswith('geoedge_edge_cache_events_total{event="hit"}'):
                return float(line.split()[-1])
        return 0.0

    deadline = time.monotonic() + scaled(10)
    while hits() < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hits() >= 1
    assert "geoedge_edge_cache_bytes " in chain.stack.metrics()


def test_the_status_page_has_a_cache_panel_with_the_hit_ratio(chain: CacheStack) -> None:
    from tests.integration.test_status_page import status, table, until

    port = chain.stack.admin_port
    status(port)  # the window's first snapshot
    path = "/status-hit?cc=max-age=60"
    for _ in range(5):
        chain.fetch(path)

    def panel() -> list[list[str]] | None:
        rows = table(status(port), "Cache")
        ratio = next((row[1] for row in rows if row[0] == "hit ratio"), "-")
        return rows if ratio != "-" else None

    rows = until(panel)
    assert rows is not None, "no cache figures on the status page"
    held = next(row[1] for row in rows if row[0] == "held")
    assert "responses" in held and "MiB" in held


def test_over_http2_misses_are_stored_hits_served_and_compressed_bodies_framed_whole(
    chain: CacheStack,
) -> None:
    from tests.h2_client import H2Client

    client = H2Client(chain.stack.https_port, chain.stack.pki.ca)
    try:
        miss_path = "/h2?cc=public,max-age=60&size=30000&type=text/html&chunked=1"
        [first] = client.wait([client.request(miss_path, headers=[("accept-encoding", "gzip")])])
        [second] = client.wait([client.request(miss_path, headers=[("accept-encoding", "gzip")])])
        [plain] = client.wait([client.request(miss_path)])
    finally:
        client.close()
    assert first.status == second.status == plain.status == 200
    assert first.header(b"content-encoding") == b"gzip"
    assert first.header(b"transfer-encoding") is None
    assert gzip.decompress(bytes(first.data)) == bytes(plain.data)
    assert len(plain.data) == 30000
    assert b"hit" in (second.header(b"cache-status") or b"")
    assert gzip.decompress(bytes(second.data)) == bytes(plain.data)
    assert chain.count("/h2") == 1


def collapsed_so_far(chain: CacheStack) -> float:
    for line in chain.stack.metrics().splitlines():
        if line.startswith('geoedge_edge_cache_events_total{event="collapsed"}'):
            return float(line.split()[-1])
    return 0.0


def test_when_the_first_asker_goes_away_one_waiter_fetches_for_the_others(
    chain: CacheStack,
) -> None:
    path = "/abandoned?cc=public,max-age=60&delay=4000"
    context = ssl.create_default_context(cafile=str(chain.stack.pki.ca))
    url = f"https://localhost:{chain.stack.https_port}{path}"
    before = collapsed_so_far(chain)

    async def leader_gives_up() -> None:
        from tests.h2_client import H2Client

        client = H2Client(chain.stack.https_port, chain.stack.pki.ca)
        stream = client.request(path, authority=f"localhost:{chain.stack.https_port}")
        # Its fetch is in flight until the five others wait behind it (the
        # metrics say so within a sweep); then it resets its stream, which
        # cancels its exchange at once (an HTTP/1.1 client that goes quietly
        # is noticed only when its response is written).
        async with asyncio.timeout(scaled(30)):
            while await asyncio.to_thread(collapsed_so_far, chain) < before + 5:
                await asyncio.sleep(0.1)
        client.conn.reset_stream(stream)
        client.flush()
        client.close()

    async def waiter(session: aiohttp.ClientSession) -> int:
        await asyncio.sleep(0.2)
        async with session.get(url, ssl=context) as response:
            await response.read()
            return response.status

    async def run() -> list[int]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            results = await asyncio.gather(leader_gives_up(), *(waiter(session) for _ in range(5)))
        return [r for r in results if r is not None]

    assert run_async(run(), timeout=90) == [200] * 5
    assert chain.count("/abandoned") == 2  # the abandoned fetch, then one for the five


def test_stale_while_revalidate_serves_at_once_and_refreshes_behind(chain: CacheStack) -> None:
    path = "/swr?cc=max-age=1,stale-while-revalidate=60"
    chain.fetch(path)
    time.sleep(1.5)  # stale now, within stale-while-revalidate
    stale = chain.fetch(path)
    assert "detail=stale-while-revalidate" in (stale.field("Cache-Status") or "")
    deadline = time.monotonic() + scaled(10)
    while chain.count("/swr") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert chain.count("/swr") == 2  # one revalidation, behind the stale answer
    fresh = chain.fetch(path)
    assert (fresh.field("Cache-Status") or "").startswith("test-edge; hit; ttl=")


def test_a_stale_response_stands_in_when_the_origin_fails(chain: CacheStack) -> None:
    path = "/sie?cc=max-age=1&fail_after=1"
    first = chain.fetch(path)
    time.sleep(1.5)
    stood_in = chain.fetch(path)  # the origin answers 503 now
    assert stood_in.status == 200 and stood_in.body == first.body
    assert "stale-if-error" in (stood_in.field("Cache-Status") or "")
    assert chain.count("/sie") == 2
    strict = "/sie-strict?cc=max-age=1,must-revalidate&fail_after=1"
    chain.fetch(strict)
    time.sleep(1.5)
    assert chain.fetch(strict).status == 503  # must-revalidate: never stale


def test_the_access_log_says_what_the_cache_did(chain: CacheStack) -> None:
    path = "/logged?cc=max-age=60"
    chain.fetch(path)
    chain.fetch(path)

    def logged() -> list[str]:
        found = []
        for line in chain.stack.log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"path":"/logged' in line:
                found.append(json.loads(line).get("cache"))
        return found

    deadline = time.monotonic() + scaled(10)
    while len(logged()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert logged() == ["miss", "hit"]


def test_compression_alone_compresses_and_stores_nothing(
    test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory
) -> None:
    procs = Processes()
    port = free_port()
    start_backend(procs, port)
    extra = "\n[compression]\nenabled = true\n"  # and no [cache]: it is off
    try:
        with edge_stack(
            test_pki, tmp_path_factory.mktemp("alone"), backend_port=port, extra=extra
        ) as stack:
            alone = CacheStack(stack, port)
            path = "/alone?cc=public,max-age=60&size=5000&type=text/html"
            for _ in range(2):
                reply = alone.fetch(path, {"Accept-Encoding": "br"})
                assert reply.field("Content-Encoding") == "br"
                assert brotli.decompress(reply.body) == alone.fetch(path).body
                assert reply.field("Cache-Status") is None
            assert alone.count("/alone") == 4  # nothing stored
    finally:
        procs.stop_all()
