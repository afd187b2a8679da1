"""The bad-input corpus: every file in ``tests/corpus/edge`` is one case, run
against a real edge and origin in front of a strict recording backend
(:mod:`tests.recording_backend`). Modelled on HAProxy's ``reg-tests`` and the
request-smuggling research of James Kettle (PortSwigger).

A case (``tests/corpus/README.md`` has the format) sends raw bytes on one
listener kind and lists the acceptable outcomes. Each case must meet all of:

- the client gets one of the expected answers (a status, or a close);
- the edge writes an access-log line for it with an expected ``outcome``
  (and, for refusals, a ``reason``);
- no traceback in the edge's or the origin's log;
- nothing ambiguous reaches the backend (it parses strictly; framing and
  forwarding fields are checked), and at most the allowed number of requests;
  when one does reach it, it names the real client in ``X-Forwarded-For``;
- the canary (one keep-alive connection open across every case, and a fresh
  one) is answered before and after;
- the edge worker's descriptors come back to their baseline.

``test_corpus_summary`` prints the README's table.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from geoedge.proxy import encode_v1, encode_v2, encode_v2_local
from tests.conftest import PkiFiles, scaled
from tests.edge_env import Stack, edge_stack, node_available
from tests.recording_backend import RecordingBackend
from tests.slow_backend import read_message
from tests.tunnel_env import free_port

pytestmark = pytest.mark.skipif(not node_available(), reason="npm ci the sample app first")

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "edge"
LISTENERS = ("tls", "proxy", "proxy_untrusted", "redirect", "tls_raw", "proxy_raw")
CASE_KEYS = {
    "description", "listener", "send", "pause_s", "expect", "log_outcome", "reason",
    "client_ip", "proxy_header", "tls_version", "backend_requests", "half_close",
    "timeout_s", "server_name",
}  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    listener: str
    send: tuple[bytes, ...]
    expect: tuple[str, ...]
    log_outcome: tuple[str, ...]
    pause_s: float = 0.05
    reason: bool = True
    client_ip: str = "127.0.0.1"
    proxy_header: str = ""
    tls_version: str = ""
    backend_requests: int = 0
    half_close: bool = False
    timeout_s: float = 4.0
    server_name: str = "localhost"

    @classmethod
    def load(cls, path: Path) -> Case:
        data = tomllib.loads(path.read_text())
        unknown = set(data) - CASE_KEYS
        if unknown:
            raise ValueError(f"{path.name}: unknown key(s) {sorted(unknown)}")
        if data.get("listener") not in LISTENERS:
            raise ValueError(f"{path.name}: listener must be one of {LISTENERS}")
        return cls(
            name=path.stem,
            description=data["description"],
            listener=data["listener"],
            send=tuple(part.encode("latin-1") for part in data["send"]),
            expect=tuple(str(e) for e in data["expect"]),
            log_outcome=tuple(data["log_outcome"]),
            pause_s=float(data.get("pause_s", 0.05)),
            reason=bool(data.get("reason", True)),
            client_ip=data.get("client_ip", "127.0.0.1"),
            proxy_header=data.get("proxy_header", ""),
            tls_version=data.get("tls_version", ""),
            backend_requests=int(data.get("backend_requests", 0)),
            half_close=bool(data.get("half_close", False)),
            timeout_s=float(data.get("timeout_s", 4.0)),
            server_name=data.get("server_name", "localhost"),
        )


CASES = [Case.load(path) for path in sorted(CORPUS.glob("*.toml"))]


@dataclass
class Env:
    stack: Stack
    backend: RecordingBackend
    ports: dict[str, int]
    canary: ssl.SSLSocket
    worker_pid: int
    fd_baseline: int
    results: dict[str, str] = field(default_factory=dict)


def corpus_config(ports: dict[str, int]) -> str:
    return f"""
[http]
header_timeout_s = 1.0
body_timeout_s = 1.0
first_byte_timeout_s = 2.0
between_bytes_timeout_s = 2.0
[http.limits]
max_body_bytes = 10000
max_headers = 50
[admission]
max_connections_per_client_ip = 64
[redirect]
address = "127.0.0.1:{ports["redirect"]}"
pass_through_prefixes = ["/.well-known/acme-challenge/", "/pass/"]
[[listeners]]
address = "127.0.0.1:{ports["proxy"]}"
proxy_protocol = "any"  # the corpus sends both versions
trusted_proxies = ["127.0.0.1/32"]
"""


@pytest.fixture(scope="module")
def env(test_pki: PkiFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    ports = {"proxy": free_port(), "redirect": free_port()}
    with (
        RecordingBackend() as backend,
        edge_stack(
            test_pki,
            tmp_path_factory.mktemp("corpus"),
            extra_top=corpus_config(ports),
            tls_table="handshake_timeout_s = 1.0\n",
            backend_port=backend.port,
        ) as stack,
    ):
        ports["tls"] = ports["tls_raw"] = stack.https_port
        ports["proxy_untrusted"] = ports["proxy_raw"] = ports["proxy"]
        canary = open_tls(stack.https_port, stack)
        worker = subprocess.run(
            ["pgrep", "-P", str(stack.edge.pid)], capture_output=True, text=True, check=True
        ).stdout.split()[0]
        e = Env(stack, backend, ports, canary, int(worker), 0)
        check_canary(e)
        e.fd_baseline = count_fds(e.worker_pid)
        yield e
        canary.close()


def open_tls(port: int, stack: Stack, source: str = "127.0.0.1") -> ssl.SSLSocket:
    raw = socket.create_connection(
        ("127.0.0.1", port), timeout=scaled(10), source_address=(source, 0)
    )
    return stack.tls_context().wrap_socket(raw, server_hostname="localhost")


def count_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def check_canary(e: Env) -> None:
    """The keep-alive canary and a fresh connection are both answered."""
    fresh = open_tls(e.stack.https_port, e.stack)
    try:
        for sock in (e.canary, fresh):
            sock.sendall(b"GET /canary HTTP/1.1\r\nHost: canary\r\n\r\n")
            reply = read_message(sock)
            assert reply.startswith(b"HTTP/1.1 200"), f"canary: {reply[:200]!r}"
    finally:
        fresh.close()


def proxy_preamble(case: Case) -> list[bytes]:
    """The PROXY header a case sends before TLS, as the parts to send (README)."""
    spec = case.proxy_header
    if not spec:
        return []
    if spec.startswith("raw:"):
        return [spec[4:].encode("latin-1")]
    split = spec.startswith("split:")
    kind, _, source = spec.removeprefix("split:").partition(" ")
    if kind == "v2local":
        header = encode_v2_local()
    else:
        host, port = source.rsplit(":", 1)
        host = host.strip("[]")
        destination = ("::1", 443) if ":" in host else ("127.0.0.1", 443)
        if kind == "v1":
            header = encode_v1((host, int(port)), destination)
        else:
            tlvs = [(0xEA, b"\x01vpce-0123456789abcdef0")] if kind == "v2tlv" else []
            header = encode_v2((host, int(port)), destination, tlvs=tlvs)
    return [header[:9], header[9:]] if split else [header]


def run_client(case: Case, e: Env) -> str:
    """Send the case's bytes; the answer's status ("400"), or "close"."""
    source = "127.0.0.2" if case.listener == "proxy_untrusted" else "127.0.0.1"
    raw = socket.create_connection(
        ("127.0.0.1", e.ports[case.listener]),
        timeout=scaled(case.timeout_s),
        source_address=(source, 0),
    )
    sock: socket.socket = raw
    try:
        parts = list(case.send)
        for index, piece in enumerate(proxy_preamble(case)):
            if index:
                time.sleep(case.pause_s)
            raw.sendall(piece)
        if case.listener in ("tls", "proxy", "proxy_untrusted"):
            context = e.stack.tls_context()
            if case.tls_version:
                version = getattr(ssl.TLSVersion, case.tls_version)
                context.minimum_version = context.maximum_version = version
            if case.server_name != "localhost":  # the default certificate answers
                context.check_hostname = False
            try:
                sock = context.wrap_socket(raw, server_hostname=case.server_name or None)
            except (ssl.SSLError, OSError):
                return "close"
        for index, part in enumerate(parts):
            if index:
                time.sleep(case.pause_s)
            try:
                sock.sendall(part)
            except (ssl.SSLError, OSError):
                break
        if case.half_close:  # a TCP FIN without close_notify (SSLSocket's would unwrap)
            socket.socket.shutdown(sock, socket.SHUT_WR)
        try:
            reply = read_message(sock)
        except TimeoutError:
            return "timeout"
        except (ssl.SSLError, OSError):
            return "close"
        if not reply or reply.startswith(b"\x15\x03"):  # nothing, or a TLS alert
            return "close"
        if not reply.startswith(b"HTTP/1."):
            return f"garbage:{reply[:40]!r}"
        return reply.split(b" ", 2)[1].decode()
    finally:
        sock.close()


def access_lines(stack: Stack, offset: int) -> list[dict]:
    with open(stack.log, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"ts"')]


def log_sizes(stack: Stack) -> tuple[int, int]:
    return stack.log.stat().st_size, stack.origin_log.stat().st_size


def tracebacks(stack: Stack, offsets: tuple[int, int]) -> list[str]:
    found = []
    for path, offset in ((stack.log, offsets[0]), (stack.origin_log, offsets[1])):
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
        if "Traceback" in text:
            found.append(f"{path.name}: {text[text.index('Traceback') :][:1500]}")
    return found


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_case(case: Case, env: Env) -> None:
    e = env
    e.results[case.name] = "failed"
    offsets = log_sizes(e.stack)
    mark = e.backend.snapshot()
    outcome = run_client(case, e)
    assert outcome in case.expect, f"{case.name}: got {outcome}, expected {case.expect}"

    # One access-log line with an expected outcome (and a reason for refusals).
    deadline = time.monotonic() + scaled(20)  # lines are written within a second
    matching: list[dict] = []
    while time.monotonic() < deadline and not matching:
        time.sleep(0.1)
        lines = [
            line
            for line in access_lines(e.stack, offsets[0])
            if (line.get("host") or "") != "canary"
        ]
        matching = [line for line in lines if line.get("outcome") in case.log_outcome]
    assert matching, f"{case.name}: no access-log line with outcome in {case.log_outcome}: {lines}"
    if case.reason:
        assert any(line.get("reason") for line in matching), f"{case.name}: no reason: {matching}"

    assert not tracebacks(e.stack, offsets), tracebacks(e.stack, offsets)

    requests, violations = e.backend.since(mark)
    requests = [r for r in requests if r.target != b"/canary"]
    assert not violations, f"{case.name}: ambiguous input reached the backend: {violations}"
    assert len(requests) <= case.backend_requests, (
        f"{case.name}: {len(requests)} request(s) reached the backend: {requests}"
    )
    for request in requests:
        xff = [v for n, v in request.headers if n == b"x-forwarded-for"]
        assert xff == [case.client_ip.encode()], f"{case.name}: X-Forwarded-For {xff}"
        assert b"6.6.6.6" not in b"".join(v for _, v in request.headers)

    check_canary(e)
    deadline = time.monotonic() + scaled(20)
    while count_fds(e.worker_pid) > e.fd_baseline and time.monotonic() < deadline:
        time.sleep(0.1)
    assert count_fds(e.worker_pid) <= e.fd_baseline, f"{case.name}: descriptors not released"
    e.results[case.name] = "met"


def test_corpus_summary(env: Env) -> None:
    """The README's corpus table (printed; run with -s to see it)."""
    met = sum(1 for r in env.results.values() if r == "met")
    print(f"\nbad-input corpus: {len(CASES)} cases, {met} met")
    assert len(CASES) >= 80
    assert met == len(env.results) == len(CASES)
