"""HTTP/2 at the edge, end to end: real edge, origin, TLS and Node.js, with an h2
client (tests/h2_client.py) that behaves as a browser or as an attacker would.

Each request is a stream of its own through the tunnel, so a page's requests
run at once; translation to HTTP/1.1 keeps the edge's rules; flow control
reaches the origin; the known HTTP/2 attacks are bounded; h2spec passes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import h2.errors
import h2.settings
import pytest

from edge.h2_engine import engine_description
from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack, edge_stack, node_available
from tests.h2_client import H2Client, H2Response
from tests.h2_engines import H2_ENGINES
from tests.polling import wait_until

pytestmark = pytest.mark.skipif(not node_available(), reason="npm ci the sample app first")

ROOT = Path(__file__).resolve().parents[2]
PATTERN_MODULUS = 251
CONFIG = """
[http]
send_timeout_s = 2.0
"""


@pytest.fixture(scope="module")
def stack(test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with edge_stack(test_pki, tmp_path_factory.mktemp("h2"), extra_top=CONFIG) as s:
        yield s


def client(stack: Stack, **kwargs: object) -> H2Client:
    return H2Client(stack.https_port, stack.pki.ca, **kwargs)  # type: ignore[arg-type]


def still_serving(stack: Stack) -> None:
    """A fresh HTTP/2 connection is answered (the canary)."""
    c = client(stack)
    try:
        (response,) = c.wait([c.request("/ip")])
        assert response.status == 200
    finally:
        c.close()


def test_the_start_up_line_says_which_http2_engine_runs(stack: Stack) -> None:
    """nghttp2 wherever this run has built it (``"auto"``), else h2, with the
    library's version."""
    engine = engine_description(H2_ENGINES[0])
    lines = stack.log.read_text(errors="replace").splitlines()
    serving = [line for line in lines if " serving " in line and "worker(s)" in line]
    assert serving, lines[-20:]
    assert f"HTTP/2 on {engine}, geoedge" in serving[0]


# -- requests ---------------------------------------------------------------------


def test_thirty_requests_on_one_connection_run_at_once(stack: Stack) -> None:
    """A page's 30 resources: HTTP/1.1 gave 6 at a time; here one round. Node
    holds each request until all 30 are in flight at the backend at once
    (/gate): in waves, none would be answered before the gate's own limit."""
    c = client(stack)
    gate = f"/gate?n=30&group=thirty&ms={int(scaled(15) * 1000)}"
    streams = [c.request(f"{gate}&i={i}") for i in range(30)]
    responses = c.wait(streams, timeout=scaled(30))
    assert [(r.status, json.loads(r.data)) for r in responses] == [(200, {"together": 30})] * 30
    c.close()


def test_a_large_response_and_uploads_arrive_whole(stack: Stack) -> None:
    c = client(stack)
    (large,) = c.wait([c.request("/large")], timeout=scaled(20))
    assert large.status == 200 and len(large.data) == 768 * 1024
    assert bytes(large.data) == bytes(i % PATTERN_MODULUS for i in range(768 * 1024))
    body = os.urandom(3 * 1024 * 1024)
    digest = hashlib.sha256(body).hexdigest()
    with_length = c.request("/upload", "POST", [("content-length", str(len(body)))], body=body)
    chunked = c.request("/upload", "POST", body=body)  # no length: sent up chunked
    for response in c.wait([with_length, chunked], timeout=scaled(30)):
        assert response.status == 200, response
        assert json.loads(response.data) == {"bytes": len(body), "sha256": digest}
    c.close()


def test_a_body_that_breaks_its_content_length_ends_only_its_stream(stack: Stack) -> None:
    """RFC 9113 §8.1.1: a stream error, and Node never reads past the length."""
    c = client(stack)
    longer = c.request("/upload", "POST", [("content-length", "5")], body=b"hello, world")
    shorter = c.request("/upload", "POST", [("content-length", "50")], body=b"hello")
    exact = c.request("/upload", "POST", [("content-length", "5")], body=b"hello")
    responses = c.wait([longer, shorter, exact], timeout=scaled(10))
    assert [r.reset for r in responses[:2]] == [h2.errors.ErrorCodes.PROTOCOL_ERROR] * 2
    assert responses[2].status == 200
    assert json.loads(responses[2].data) == {
        "bytes": 5, "sha256": hashlib.sha256(b"hello").hexdigest()
    }  # fmt: skip
    assert c.goaway is None and not c.closed
    c.close()


def test_request_trailers_reach_node_after_a_chunked_body(stack: Stack) -> None:
    c = client(stack)
    stream_id = c.request("/upload", "POST", body=b"hello", end=False)
    c.conn.send_headers(
        stream_id, [(b"x-checksum", b"77"), (b"x-forwarded-for", b"6.6.6.6")], end_stream=True
    )
    c.flush()
    (response,) = c.wait([stream_id], timeout=scaled(10))
    assert response.status == 200, response
    result = json.loads(response.data)
    assert result["bytes"] == 5 and result["trailers"] == {"x-checksum": "77"}
    c.close()


def test_response_trailers_from_node_reach_the_client(stack: Stack) -> None:
    c = client(stack)
    (response,) = c.wait([c.request("/bytes?n=70000&chunked=1&trailer=1")], timeout=scaled(10))
    assert response.status == 200 and len(response.data) == 70000
    assert response.trailers == [(b"x-bytes", b"70000")]
    c.close()


def test_the_request_reaches_node_as_http11_with_the_edges_rules(stack: Stack) -> None:
    c = client(stack)
    (response,) = c.wait(
        [
            c.request(
                "/headers?q=1",
                headers=[
                    ("cookie", "a=1"),
                    ("cookie", "b=2"),
                    ("x-forwarded-for", "6.6.6.6"),
                    ("x-request-id", "spoofed"),
                    ("te", "trailers"),
                ],
                authority="app.test",
            )
        ]
    )
    seen = json.loads(response.data)
    fields: dict[str, list[str]] = {}
    for name, value in seen["raw_headers"]:
        fields.setdefault(name.lower(), []).append(value)
    assert seen["http_version"] == "1.1" and seen["url"] == "/headers?q=1"
    assert fields["host"] == ["app.test"]
    assert fields["cookie"] == ["a=1; b=2"]  # RFC 9113 §8.2.3
    assert fields["x-forwarded-for"] == ["127.0.0.1"]
    assert "te" not in fields
    assert fields["x-request-id"] != ["spoofed"]
    assert response.header(b"connection") is None  # no hop-by-hop field in HTTP/2
    c.close()


def test_a_websocket_over_http2(stack: Stack) -> None:
    """RFC 8441: extended CONNECT, then WebSocket frames in DATA both ways."""
    c = client(stack)
    settings = c.wait_settings()
    assert settings.get(h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL) == 1
    stream = c.conn.get_next_available_stream_id()
    c.conn.send_headers(
        stream,
        [
            (b":method", b"CONNECT"),
            (b":protocol", b"websocket"),
            (b":scheme", b"https"),
            (b":authority", b"localhost"),
            (b":path", b"/ws"),
            (b"sec-websocket-version", b"13"),
        ],
    )
    c.responses[stream] = H2Response()
    c.flush()
    deadline = time.monotonic() + scaled(5)
    while c.responses[stream].status == 0 and time.monotonic() < deadline:
        c.receive(0.2)
    assert c.responses[stream].status == 200
    mask = b"\x01\x02\x03\x04"
    payload = b"hello over h2"
    frame = (
        bytes([0x81, 0x80 | len(payload)])
        + mask
        + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    )
    c.conn.send_data(stream, frame)
    c.flush()
    deadline = time.monotonic() + scaled(5)
    while len(c.responses[stream].data) < 2 + len(payload) and time.monotonic() < deadline:
        c.receive(0.2)
    assert bytes(c.responses[stream].data) == bytes([0x81, len(payload)]) + payload
    c.close()


# -- flow control ---------------------------------------------------------------------


def test_a_client_that_stops_reading_stops_the_origin(stack: Stack) -> None:
    """No buffer grows: with the client's window closed, the edge holds at most
    its bounded share of a 200 MB response, and the stream is reset after the
    send timeout (a zero-window stall)."""
    c = client(stack, auto_window=False)
    stream = c.request("/bytes?n=200000000")
    pid = edge_worker_pid(stack)
    rss_before = rss_kib(pid)
    deadline = time.monotonic() + scaled(4)
    while time.monotonic() < deadline and c.responses[stream].reset is None:
        c.receive(0.2)
    grown = rss_kib(pid) - rss_before
    assert grown < 32 * 1024, f"edge worker grew {grown} KiB"
    response = c.wait([stream], timeout=scaled(6))[0]
    assert response.reset is not None  # reset at the send timeout (2 s here)
    assert len(response.data) <= 65535  # the client's window, no more
    c.close()
    still_serving(stack)


def edge_worker_pid(stack: Stack) -> int:
    return int(
        subprocess.run(
            ["pgrep", "-P", str(stack.edge.pid)], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    )


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# -- attacks -------------------------------------------------------------------------


def test_rapid_reset_is_bounded(stack: Stack) -> None:
    """CVE-2023-44487: open and reset streams as fast as possible."""
    c = client(stack)
    for _ in range(600):
        stream = c.conn.get_next_available_stream_id()
        c.conn.send_headers(
            stream,
            [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"localhost"),
             (b":path", b"/slow?ms=1000")],
            end_stream=True,
        )  # fmt: skip
        c.conn.reset_stream(stream, h2.errors.ErrorCodes.CANCEL)
        if stream % 50 == 1:
            c.flush()
    c.flush()
    goaway = c.wait_goaway(scaled(5))
    assert goaway is not None and goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    c.close()
    still_serving(stack)


@pytest.mark.parametrize("flood", ["ping", "settings"])
def test_ping_and_settings_floods_are_bounded(stack: Stack, flood: str) -> None:
    c = client(stack)
    for i in range(300):
        if flood == "ping":
            c.conn.ping(i.to_bytes(8, "big"))
        else:
            c.conn.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: 4096})
    try:
        c.flush()
    except OSError:
        pass
    goaway = c.wait_goaway(scaled(5))
    assert goaway is not None and goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    c.close()
    still_serving(stack)


def test_a_continuation_flood_is_refused(stack: Stack) -> None:
    """CVE-2024-27316: a header block that never ends."""
    c = client(stack)
    stream = c.conn.get_next_available_stream_id()
    block = c.conn.encoder.encode(
        [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"localhost"),
         (b":path", b"/")]
    )  # fmt: skip
    # HEADERS without END_HEADERS, then CONTINUATION frames with junk headers.
    frames = [len(block).to_bytes(3, "big") + b"\x01\x00" + stream.to_bytes(4, "big") + block]
    junk = c.conn.encoder.encode([(b"x-junk", b"j" * 1000)])
    for _ in range(200):
        frames.append(len(junk).to_bytes(3, "big") + b"\x09\x00" + stream.to_bytes(4, "big") + junk)
    try:
        c.sock.sendall(b"".join(frames))
    except OSError:
        pass
    while c.receive(0.5) and c.goaway is None:
        pass
    assert c.goaway is not None or c.closed
    c.close()
    still_serving(stack)


def test_a_header_list_above_the_limit_is_refused(stack: Stack) -> None:
    """An HPACK bomb is bounded by max_header_list_size (max_header_bytes)."""
    c = client(stack)
    stream = c.request("/ip", headers=[(f"x-big-{i}", "v" * 1000) for i in range(40)])
    c.wait([stream], timeout=scaled(5))
    response = c.responses[stream]
    refused = c.goaway is not None or c.closed or response.reset is not None
    assert refused or response.status == 431, response
    c.close()
    still_serving(stack)


def test_too_many_concurrent_streams_are_refused(stack: Stack) -> None:
    c = client(stack)
    codes = h2.settings.SettingCodes
    limit = c.wait_settings().get(codes.MAX_CONCURRENT_STREAMS)
    assert limit == 100
    # Past the limit the h2 client itself refuses to open: make it forget the limit.
    c.conn.remote_settings[codes.MAX_CONCURRENT_STREAMS] = 1000
    c.conn.remote_settings.acknowledge()
    # The first 100 are held at Node (/gate) until the test opens it, so all
    # of them are open when the last 5 arrive, however slow the machine.
    gate = f"/gate?n={limit + 1}&group=concurrent&ms={int(scaled(60) * 1000)}"
    streams = [c.request(gate) for _ in range(limit + 5)]
    refused = c.wait(streams[limit:], timeout=scaled(20))
    # RFC 9113 §5.1.2: each one past the limit a stream error, REFUSED_STREAM
    # (safe to send again); the connection and the streams within it go on.
    assert [r.reset for r in refused] == [h2.errors.ErrorCodes.REFUSED_STREAM] * 5
    stack.answer_gate(gate)  # (held itself until all 100 are at Node)
    responses = c.wait(streams[:limit], timeout=scaled(20))
    assert [r.status for r in responses] == [200] * limit
    assert c.goaway is None and not c.closed
    c.close()
    still_serving(stack)


# -- drain and conformance -----------------------------------------------------------


def test_h2spec_passes(stack: Stack) -> None:
    h2spec = shutil.which("h2spec") or str(ROOT / ".tools" / "h2spec")
    if not Path(h2spec).exists():
        pytest.skip("h2spec is not installed (make installs it with go install)")
    done = subprocess.run(
        [h2spec, "-t", "-k", "-h", "127.0.0.1", "-p", str(stack.https_port), "-o", "5"],
        capture_output=True, text=True, timeout=scaled(300), check=False,
    )  # fmt: skip
    summary = [line for line in done.stdout.splitlines() if "tests," in line]
    assert done.returncode == 0 and summary and " 0 failed" in summary[-1], done.stdout[-4000:]


def test_drain_sends_goaway_and_finishes_open_streams(test_pki: PkiFiles, tmp_path: Path) -> None:
    """SIGTERM: GOAWAY(NO_ERROR) to the client, the stream open finishes. (curl,
    on nghttp2: the h2 library's own client state machine refuses frames after
    a GOAWAY it received, which a server may still send.)"""
    gate = f"/gate?n=2&group=drain&ms={int(scaled(30) * 1000)}"
    with edge_stack(test_pki, tmp_path) as s:
        argv = [
            "curl", "-sS", "--http2", "--cacert", str(test_pki.ca), "-v",
            "--resolve", f"localhost:{s.https_port}:127.0.0.1",
            f"https://localhost:{s.https_port}{gate}",
        ]  # fmt: skip
        witness = client(s)  # an idle connection: its GOAWAY shows the drain began
        streams = s.origin_count("geoedge_origin_streams_total")
        curl = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_until(
            lambda: s.origin_count("geoedge_origin_streams_total") > streams,
            "curl's request did not reach Node",
        )  # held there (/gate) until the drain has begun
        s.edge.send_signal(signal.SIGTERM)
        witness.wait_goaway(scaled(15))
        assert witness.goaway is not None or witness.closed, "no drain began"
        witness.close()
        s.answer_gate(gate)  # the second of the group: both are answered
        out, err = curl.communicate(timeout=scaled(15))
        assert curl.returncode == 0, err[-2000:]
        assert json.loads(out) == {"together": 2}
        assert b"HTTP/2 200" in err
        assert s.edge.wait(scaled(15)) == 0
