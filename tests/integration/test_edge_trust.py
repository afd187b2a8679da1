"""Trust follows the hop (README "Trust"), end to end on every listener kind.

A client's forwarding headers (X-Forwarded-For, X-Real-IP, Forwarded,
X-Forwarded-Proto/Host/Port, X-Request-Id, and their underscore spellings)
reach the backend only when the hop that spoke HTTP to the edge is one of the
listener's ``http_proxies``. A PROXY header vouches for TCP addresses only: a
user behind the NLB used to have every one of them kept and appended to.
The backend (the sample app's ``/headers``) reports the head it received.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Iterator

import pytest

from edge.config import ListenerConfig
from geoedge.proxy import encode_v2
from tests.conftest import PkiFiles
from tests.edge_env import Stack, edge_stack, node_available
from tests.tunnel_env import free_port

pytestmark = pytest.mark.skipif(not node_available(), reason="npm ci the sample app first")

SPOOFED = {
    "X-Forwarded-For": "6.6.6.6",
    "X-Real-IP": "6.6.6.6",
    "Forwarded": "for=6.6.6.6;proto=gopher",
    "X-Forwarded-Proto": "gopher",
    "X-Forwarded-Host": "evil.test",
    "X-Forwarded-Port": "6666",
    "X-Request-Id": "spoofed-666",
    "X_Forwarded_For": "6.6.6.6",
    "X_Real_IP": "6.6.6.6",
    "x_forwarded_proto": "gopher",
}
MARKS = ("6.6.6.6", "gopher", "evil.test", "6666", "spoofed-666")


class Ports:
    def __init__(self) -> None:
        self.plain_trusting = free_port()  # http_proxies = 127.0.0.2
        self.proxied = free_port()  # PROXY from 127.0.0.1, no http_proxies
        self.proxied_trusting = free_port()  # PROXY from 127.0.0.1, http_proxies 198.51.100.0/24
        self.redirect = free_port()


@pytest.fixture(scope="module")
def stack(test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    ports = Ports()
    extra_top = f"""
[redirect]
address = "127.0.0.1:{ports.redirect}"
pass_through_prefixes = ["/headers"]

[[listeners]]
address = "127.0.0.1:{ports.plain_trusting}"
http_proxies = ["127.0.0.2/32"]

[[listeners]]
address = "127.0.0.1:{ports.proxied}"
proxy_protocol = "v2"
trusted_proxies = ["127.0.0.1/32"]

[[listeners]]
address = "127.0.0.1:{ports.proxied_trusting}"
proxy_protocol = "v2"
trusted_proxies = ["127.0.0.1/32"]
http_proxies = ["198.51.100.0/24"]
"""
    with edge_stack(test_pki, tmp_path_factory.mktemp("trust"), extra_top=extra_top) as s:
        s.ports = ports  # type: ignore[attr-defined]
        yield s


def request_bytes(path: str = "/headers") -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: app.test", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in SPOOFED.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def exchange(sock: socket.socket, stack: Stack | None, payload: bytes) -> dict:
    """Send ``payload`` (over TLS unless ``stack`` is None), read to the close."""
    conn: socket.socket = sock
    if stack is not None:
        conn = stack.tls_context().wrap_socket(sock, server_hostname="localhost")
    conn.sendall(payload)
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    conn.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return json.loads(body)


def fields(seen: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in seen["raw_headers"]:
        out.setdefault(name.lower(), []).append(value)
    return out


def assert_replaced(seen: dict, client_ip: str) -> None:
    got = fields(seen)
    text = json.dumps(seen["raw_headers"])
    assert not any(mark in text for mark in MARKS), text
    assert not [name for name in got if "_" in name], got  # underscore spellings gone
    assert got["x-forwarded-for"] == [client_ip]
    assert got["x-real-ip"] == [client_ip]
    assert got["x-forwarded-proto"] == ["https"]
    assert got["x-forwarded-host"] == ["app.test"]


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def test_a_plain_listener_replaces_a_clients_forwarding_headers(stack: Stack) -> None:
    assert_replaced(exchange(connect(stack.https_port), stack, request_bytes()), "127.0.0.1")


def test_a_plain_listener_keeps_them_only_from_its_http_proxies(stack: Stack) -> None:
    port = stack.ports.plain_trusting  # type: ignore[attr-defined]
    assert_replaced(exchange(connect(port), stack, request_bytes()), "127.0.0.1")
    kept = fields(exchange(connect(port, "127.0.0.2"), stack, request_bytes()))
    assert kept["x-forwarded-for"] == ["6.6.6.6, 127.0.0.2"]
    assert kept["x-request-id"] == ["spoofed-666"]
    assert kept["x-forwarded-proto"] == ["gopher"]
    assert "x_forwarded_for" not in kept  # an underscore spelling is never kept


def test_behind_a_proxy_protocol_balancer_the_users_headers_are_replaced(stack: Stack) -> None:
    """The documented NLB setup: the PROXY header comes from a trusted balancer,
    the forwarding headers from the user behind it."""
    port = stack.ports.proxied  # type: ignore[attr-defined]
    sock = connect(port)
    sock.sendall(encode_v2(("203.0.113.7", 5555), ("127.0.0.1", port)))
    assert_replaced(exchange(sock, stack, request_bytes()), "203.0.113.7")


def test_behind_a_balancer_only_a_listed_http_proxy_is_believed(stack: Stack) -> None:
    port = stack.ports.proxied_trusting  # type: ignore[attr-defined]
    sock = connect(port)
    sock.sendall(encode_v2(("203.0.113.7", 5555), ("127.0.0.1", port)))
    assert_replaced(exchange(sock, stack, request_bytes()), "203.0.113.7")
    sock = connect(port)
    sock.sendall(encode_v2(("198.51.100.5", 5555), ("127.0.0.1", port)))
    kept = fields(exchange(sock, stack, request_bytes()))
    assert kept["x-forwarded-for"] == ["6.6.6.6, 198.51.100.5"]


def test_the_redirect_listeners_pass_through_replaces_them(stack: Stack) -> None:
    port = stack.ports.redirect  # type: ignore[attr-defined]
    seen = exchange(connect(port), None, request_bytes())
    got = fields(seen)
    assert not any(mark in json.dumps(seen["raw_headers"]) for mark in MARKS)
    assert got["x-forwarded-for"] == ["127.0.0.1"]
    assert got["x-forwarded-proto"] == ["http"]


def test_a_clients_request_id_is_replaced_and_echoed_by_no_one_else(stack: Stack) -> None:
    seen = fields(exchange(connect(stack.https_port), stack, request_bytes()))
    (request_id,) = seen["x-request-id"]
    assert request_id != "spoofed-666" and len(request_id) >= 8


def test_trusted_proxies_without_proxy_protocol_is_refused_by_the_loader() -> None:
    """The old meaning (forwarding headers from these peers) is gone: say so."""
    with pytest.raises(ValueError, match="http_proxies"):
        ListenerConfig(address="127.0.0.1:1", trusted_proxies=(ipaddress.ip_network("10.0.0.0/8"),))
