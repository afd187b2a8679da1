"""The origin's per-stream deadlines (pool ``first_byte_timeout_s``,
``between_bytes_timeout_s``, ``long_poll_prefixes``) with real edge and origin processes
and a backend that hangs on purpose: a silent backend becomes the edge's 504
(or a cut, once its response started), logged at both hops; long polls and
answers in time are left alone."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest

from origin.snapshot import PoolSnapshot
from origin.worker import stream_deadline
from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack
from tests.polling import wait_until
from tests.slow_backend import SlowBackend, slow_stack

POOL_EXTRA = """
first_byte_timeout_s = 1.0
between_bytes_timeout_s = 1.0
long_poll_prefixes = ["/poll"]
"""


@pytest.fixture(scope="module")
def stack(test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with slow_stack(
        test_pki, tmp_path_factory.mktemp("deadlines"), origin_pool_extra=POOL_EXTRA
    ) as s:
        yield s


def get(stack: Stack, path: str) -> tuple[int | str, bytes, float, str]:
    """(status or how it ended, body, seconds, how the read ended: "closed", or
    "timeout" when the client's own socket timeout ended it)."""
    context = ssl.create_default_context(cafile=str(stack.pki.ca))
    started = time.monotonic()
    raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=scaled(15))
    with context.wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        data, ending = b"", "closed"
        try:
            while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 2:
                chunk = tls.recv(65536)
                if not chunk:
                    break
                data += chunk
            if b"Content-Length: 100" in data:  # the hanging body: read until the cut
                while chunk := tls.recv(65536):
                    data += chunk
        except TimeoutError:
            ending = "timeout"
        except (ssl.SSLError, OSError):
            pass
    seconds = time.monotonic() - started
    if not data:
        return "closed", b"", seconds, ending
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1], seconds, ending


def origin_lines(stack: Stack, path: str) -> list[dict[str, object]]:
    lines = []
    for line in stack.origin_log.read_text(errors="replace").splitlines():
        if line.startswith('{"ts"') and f'"path":"{path}"' in line.replace(" ", ""):
            lines.append(json.loads(line))
    return lines


def wait_for_line(stack: Stack, path: str) -> dict[str, object]:
    lines = wait_until(lambda: origin_lines(stack, path), f"no origin access-log line for {path}")
    return lines[-1]


def test_a_backend_that_never_answers_gets_the_client_a_504_at_the_deadline(stack: Stack) -> None:
    status, _, seconds, _ = get(stack, "/hang-head")
    assert status == 504
    assert seconds > 0.9, seconds  # not before the 1 s deadline (load only adds)
    line = wait_for_line(stack, "/hang-head")  # the origin's deadline, not the edge's
    assert line["outcome"] == "timeout" and line["status"] == 0
    wait_until(
        lambda: "/hang-head" in stack.backend.closed_by_peer,  # type: ignore[attr-defined]
        "the hung backend connection was kept",
    )


def test_a_backend_silent_mid_response_is_cut_not_left_hanging(stack: Stack) -> None:
    status, body, _, ending = get(stack, "/hang-body")
    assert status == 200 and body == b"0123456789"  # what it sent; then the cut
    assert ending == "closed"  # cut, not left until the client's own timeout
    assert wait_for_line(stack, "/hang-body")["outcome"] == "timeout"


def test_long_polls_and_answers_in_time_are_left_alone(stack: Stack) -> None:
    """The long poll is answered only once the origin has cut a request that
    reached the backend after it (its 1 s deadline passed for both): a poll the
    deadline applied to would have been cut by then."""
    backend: SlowBackend = stack.backend  # type: ignore[attr-defined]
    assert get(stack, "/ok")[:2] == (200, b"ok")
    poll: list[tuple[int | str, bytes, float, str]] = []
    thread = threading.Thread(target=lambda: poll.append(get(stack, "/poll?hold=1")))
    thread.start()
    try:
        wait_until(lambda: "/poll?hold=1" in backend.received, "the poll never reached it")
        assert get(stack, "/hang-head?canary=1")[0] == 504  # cut by the origin's deadline
        wait_until(lambda: "/hang-head?canary=1" in backend.closed_by_peer, "the canary was kept")
    finally:
        backend.release.set()
        thread.join(scaled(30))
    assert poll and poll[0][:2] == (200, b"ok"), poll
    assert wait_for_line(stack, "/poll?hold=1")["outcome"] == "ok"


def test_which_deadline_applies() -> None:
    pool = PoolSnapshot(
        "app", first_byte_timeout_s=60, between_bytes_timeout_s=30, long_poll_prefixes=("/lp",)
    )
    assert stream_deadline(pool, 0, 0.0, "/x") == 60  # waiting for the first octet
    assert stream_deadline(pool, 200, 12.5, "/x") == 30  # the response has started
    assert stream_deadline(pool, 101, 12.5, "/ws") == 0  # a WebSocket: the edge's idle timeout
    assert stream_deadline(pool, 0, 0.0, "/lp/events") == 0  # a long poll
    assert stream_deadline(pool, 0, 0.0, None) == 60
    # The edge marked it a long poll (LONG_POLL): the pool's own list need not say so.
    assert stream_deadline(pool, 0, 0.0, "/events", long_poll=True) == 0
    assert stream_deadline(pool, 200, 12.5, "/events", long_poll=True) == 0
    off = PoolSnapshot("app", first_byte_timeout_s=0, between_bytes_timeout_s=0)
    assert stream_deadline(off, 0, 0.0, "/x") == 0
