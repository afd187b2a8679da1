"""The response deadlines of both hops under one vocabulary, with real edge and
origin processes and a backend that takes its time on purpose:

- ``first_byte_timeout_s`` until a response starts, ``between_bytes_timeout_s``
  once it has, at the edge as at the origin (the edge had one deadline for
  both);
- the first byte is awaited from the request's last octet, so a slow upload
  is not the backend's fault;
- a long poll listed at the edge alone is spared by the origin too (the edge
  marks its stream LONG_POLL): one list is enough.

Edge: first byte 4 s, between bytes 1 s, long polls under /poll. Origin: first
byte 3 s, between bytes 60 s, no long polls of its own. Each wait is chosen
so that the deadline it must not hit is at least a sweep (1 s) away.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack
from tests.polling import wait_until
from tests.slow_backend import slow_stack

EDGE_HTTP = """
[http]
first_byte_timeout_s = 4.0
between_bytes_timeout_s = 1.0
long_poll_prefixes = ["/poll"]
"""
ORIGIN_POOL = "first_byte_timeout_s = 3.0\n"


@pytest.fixture(scope="module")
def stack(test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with slow_stack(
        test_pki,
        tmp_path_factory.mktemp("response-deadlines"),
        extra_top=EDGE_HTTP,
        origin_pool_extra=ORIGIN_POOL,
    ) as s:
        yield s


def exchange(
    stack: Stack, head: bytes, body_pieces: tuple[bytes, ...] = ()
) -> tuple[bytes, float, str]:
    """Send ``head`` then each body piece half a second apart; everything the
    edge sends back until it closes, the seconds from the last octet sent, and
    how the read ended ("closed", or "timeout": the client's own socket timeout)."""
    context = ssl.create_default_context(cafile=str(stack.pki.ca))
    raw = socket.create_connection(("127.0.0.1", stack.https_port), timeout=scaled(20))
    with context.wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(head)
        for piece in body_pieces:
            time.sleep(0.5)
            tls.sendall(piece)
        sent = time.monotonic()
        data, ending = b"", "closed"
        try:
            while chunk := tls.recv(65536):
                data += chunk
                if data.endswith(b"\r\n\r\nok"):
                    break
        except TimeoutError:
            ending = "timeout"
        except (ssl.SSLError, OSError):
            pass
    return data, time.monotonic() - sent, ending


def get(stack: Stack, target: str) -> tuple[bytes, float, str]:
    return exchange(stack, f"GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())


def origin_outcome(stack: Stack, target: str) -> str:
    def outcome() -> str:
        for line in stack.origin_log.read_text(errors="replace").splitlines():
            if line.startswith('{"ts"') and f'"path":"{target}"' in line.replace(" ", ""):
                return str(json.loads(line)["outcome"])
        return ""

    return wait_until(outcome, f"no origin access-log line for {target}")


def test_a_response_may_take_the_first_byte_deadline_to_start(stack: Stack) -> None:
    """2.5 s before the head: past the edge's between-bytes deadline (1 s),
    which used to be the one deadline for both."""
    reply, _, _ = get(stack, "/wait?ms=2500")
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok"), reply[:200]


def test_a_response_silent_after_it_started_is_cut_at_the_between_bytes_deadline(
    stack: Stack,
) -> None:
    reply, _, ending = get(stack, "/hang-body")
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"0123456789"), reply[:200]
    # Cut by the edge's 1 s: the origin's 60 s would leave the client to its
    # own socket timeout (20 s).
    assert ending == "closed"


def test_the_first_byte_is_awaited_from_the_requests_last_octet(stack: Stack) -> None:
    """A 6 s upload, then 1.5 s to answer: within the 4 s first-byte deadline
    counted from the last octet. Counted from the head, as it was, the edge
    answered 504 a sweep after the upload ended."""
    pieces = tuple(b"%05d" % i for i in range(12))
    head = b"POST /upload?ms=1500 HTTP/1.1\r\nHost: localhost\r\nContent-Length: 60\r\n\r\n"
    reply, seconds, _ = exchange(stack, head, pieces)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    assert seconds > 1.4, seconds


def test_a_long_poll_listed_at_the_edge_alone_is_spared_at_the_origin_too(stack: Stack) -> None:
    """4.5 s before the head: past the origin's first-byte deadline (3 s),
    which the origin's own list (empty) would not lift: the edge's mark does."""
    reply, _, _ = get(stack, "/poll?ms=4500")
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok"), reply[:200]
    assert origin_outcome(stack, "/poll?ms=4500") == "ok"
    # The same wait on a path that is no long poll: the origin's deadline cuts it.
    reply, _, _ = get(stack, "/wait?ms=4500")
    assert reply.startswith(b"HTTP/1.1 504"), reply[:200]
    assert origin_outcome(stack, "/wait?ms=4500") == "timeout"
