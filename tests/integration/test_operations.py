"""Operations tell the truth, through real daemons: ``/healthz`` during a drain,
a restarted worker after a certificate reload, ``--check`` and start-up
opening every file (as the service user too), bind errors naming the
setting, one log line for a bad certificate on SIGHUP."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from geoedge import pki
from tests.conftest import PkiFiles, scaled
from tests.edge_env import (
    ROOT,
    Stack,
    edge_stack,
    node_available,
    write_edge_config,
    write_origin_config,
)
from tests.polling import wait_for, wait_until
from tests.tunnel_env import free_port

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")


def healthz(port: int) -> int | None:
    """The status of ``GET /healthz``, or None when nothing answers."""
    answer = healthz_answer(port)
    return None if answer is None else answer[0]


def healthz_answer(port: int) -> tuple[int, bool | None] | None:
    """``GET /healthz``: its status and the body's ``draining``; None when
    nothing answers."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(5))
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        return response.status, json.loads(response.read()).get("draining")
    except OSError:
        return None


#: Held at Node until the test answers it: in flight for as long as it takes.
HELD = f"/gate?n=2&group=drain&ms={int(scaled(60) * 1000)}"


def statuses_during_drain(
    process: subprocess.Popen[bytes], admin_port: int, stack: Stack
) -> list[tuple[int, bool | None]]:
    """SIGTERM ``process`` while a request is held at Node; its ``/healthz``
    from the first answer that is not 200 (the signal was handled), five
    answers while the request is still held, then, with the request released,
    until the admin goes away."""
    process.send_signal(signal.SIGTERM)
    seen = [
        wait_for(
            lambda: healthz_answer(admin_port),
            lambda answer: answer is not None and answer[0] != 200,
            "healthz stayed 200",
        )
    ]
    while len(seen) < 5:  # the drain cannot end: the request is held
        answer = healthz_answer(admin_port)
        assert answer is not None, "the admin went away with a request in flight"
        seen.append(answer)
        time.sleep(0.1)
    stack.answer_gate(HELD)  # the held request is released
    deadline = time.monotonic() + scaled(30)
    while time.monotonic() < deadline and (answer := healthz_answer(admin_port)) is not None:
        seen.append(answer)
        time.sleep(0.1)
    return seen


def held_request(stack: Stack, result: dict[str, object]) -> threading.Thread:
    """A request held at Node (:data:`HELD`), once it got there."""

    def run() -> None:
        conn = stack.https(timeout=60)
        conn.request("GET", HELD)
        response = conn.getresponse()
        result["status"] = response.status
        response.read()

    streams = stack.origin_count("geoedge_origin_streams_total")
    thread = threading.Thread(target=run)
    thread.start()
    wait_until(
        lambda: stack.origin_count("geoedge_origin_streams_total") > streams,
        "the request never reached Node",
    )
    return thread


def test_edge_healthz_is_503_from_the_start_of_a_drain(test_pki: PkiFiles, tmp_path: Path) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        assert healthz(stack.admin_port) == 200
        result: dict[str, object] = {}
        thread = held_request(stack, result)
        seen = statuses_during_drain(stack.edge, stack.admin_port, stack)
        thread.join(scaled(30))
        assert result.get("status") == 200  # the drain let it finish
        assert len(seen) >= 5, seen  # the drain lasted while the request ran
        assert set(seen) == {(503, True)}, seen


def test_origin_healthz_is_503_from_the_start_of_a_drain(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with edge_stack(test_pki, tmp_path) as stack:
        assert stack.origin is not None
        wait_until(lambda: healthz(stack.origin_admin_port) == 200, "origin never healthy")
        result: dict[str, object] = {}
        thread = held_request(stack, result)
        seen = statuses_during_drain(stack.origin, stack.origin_admin_port, stack)
        thread.join(scaled(30))
        assert result.get("status") == 200
        assert len(seen) >= 5, seen
        assert set(seen) == {(503, True)}, seen


# -- certificates and workers ----------------------------------------------------------


def served_serial(port: int, ca: Path, name: str) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def worker_pids(parent: int) -> set[int]:
    path = Path(f"/proc/{parent}/task/{parent}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


@contextlib.contextmanager
def swappable_certificate(test_pki: PkiFiles, tmp_path: Path) -> Iterator[tuple[Stack, Path]]:
    ca = pki.load_ca(test_pki.dir / "ca")
    live = pki.issue_server_cert(ca, tmp_path, "live", ["swap.test"])
    tls_extra = f'[[tls.certificates]]\ncert = "{live.cert}"\nkey = "{live.key}"\n'
    with edge_stack(test_pki, tmp_path, tls_extra=tls_extra) as stack:
        yield stack, live.cert


def replace_certificate(test_pki: PkiFiles, directory: Path, cert: Path) -> int:
    """A new certificate and key for swap.test in place of ``cert``; its serial."""
    ca = pki.load_ca(test_pki.dir / "ca")
    directory.mkdir(exist_ok=True)
    fresh = pki.issue_server_cert(ca, directory, "live", ["swap.test"])
    os.replace(fresh.cert, cert)
    os.replace(fresh.key, cert.with_name("live-key.pem"))
    return x509.load_pem_x509_certificate(cert.read_bytes()).serial_number


def test_a_worker_restarted_after_a_reload_serves_the_current_certificate(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with swappable_certificate(test_pki, tmp_path) as (stack, cert):
        port, ca = stack.https_port, test_pki.ca
        new = replace_certificate(test_pki, tmp_path / "new", cert)
        stack.edge.send_signal(signal.SIGHUP)  # a reload: new workers with the new files
        wait_until(lambda: served_serial(port, ca, "swap.test") == new, "SIGHUP did not swap")
        wait_until(lambda: len(worker_pids(stack.edge.pid)) == 1, "the old worker stayed")
        [old_worker] = worker_pids(stack.edge.pid)
        os.kill(old_worker, signal.SIGKILL)
        wait_until(
            lambda: worker_pids(stack.edge.pid) - {old_worker, 0},
            "the supervisor did not restart the worker",
        )
        wait_until(lambda: healthz(stack.admin_port) == 200, "the new worker has no tunnel")
        assert served_serial(port, ca, "swap.test") == new


def test_a_malformed_certificate_on_sighup_is_one_log_line(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with swappable_certificate(test_pki, tmp_path) as (stack, cert):
        port, ca = stack.https_port, test_pki.ca
        before = served_serial(port, ca, "swap.test")
        good = cert.read_bytes()
        cert.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
        stack.edge.send_signal(signal.SIGHUP)  # refused by the reload's check
        wait_until(lambda: str(cert) in stack.log.read_text(), "the bad certificate was not logged")
        assert served_serial(port, ca, "swap.test") == before  # the old one stays
        cert.write_bytes(good)
        new = replace_certificate(test_pki, tmp_path / "new", cert)
        stack.edge.send_signal(signal.SIGHUP)
        wait_until(lambda: served_serial(port, ca, "swap.test") == new, "the next reload failed")
        # That reload is done (its new worker serves, the old one is gone): a
        # worker started for the refused one would have logged the file by now.
        wait_until(lambda: len(worker_pids(stack.edge.pid)) == 1, "the old worker stayed")
        log = stack.log.read_text()
        assert len([line for line in log.splitlines() if str(cert) in line]) == 1, log[-2000:]
        assert "Traceback" not in log


# -- --check and start-up -----------------------------------------------------------------


def run_daemon(daemon: str, config: Path, *args: str, timeout: float = 20) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", daemon, "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return result.returncode, result.stdout + result.stderr


@pytest.fixture
def world_pki(test_pki: PkiFiles) -> Iterator[PkiFiles]:
    """A copy of the test PKI in a directory every user may enter (the session
    one lives under pytest's 0700 root), keys 0600 owned by root."""
    directory = Path(tempfile.mkdtemp(prefix="geoedge-pki-"))
    directory.chmod(0o755)
    try:
        shutil.copytree(test_pki.dir, directory / "pki")
        (directory / "pki").chmod(0o755)

        def moved(paths: pki.CertPaths) -> pki.CertPaths:
            return pki.CertPaths(
                directory / "pki" / paths.cert.name, directory / "pki" / paths.key.name
            )

        yield PkiFiles(
            dir=directory / "pki",
            ca=directory / "pki" / "ca" / "ca.pem",
            origin=moved(test_pki.origin),
            edge=moved(test_pki.edge),
            edge2=moved(test_pki.edge2),
            server=moved(test_pki.server),
            rogue_ca=directory / "pki" / "rogue" / "ca.pem",
            rogue_edge=moved(test_pki.rogue_edge),
            impostor_origin=moved(test_pki.impostor_origin),
        )
    finally:
        shutil.rmtree(directory)


def edge_config(test_pki: PkiFiles, tmp_path: Path, **kw: object) -> Path:
    return write_edge_config(
        tmp_path / "edge.toml",
        test_pki,
        https_port=free_port(),
        admin_port=free_port(),
        origins=[("origin-a", free_port())],
        **kw,  # type: ignore[arg-type]
    )


def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def test_check_and_start_refuse_a_missing_tunnel_ca(test_pki: PkiFiles, tmp_path: Path) -> None:
    """Workers used to crash-loop with tracebacks naming no file."""
    config = edge_config(test_pki, tmp_path)
    config.write_text(config.read_text().replace(str(test_pki.ca), str(tmp_path / "gone.pem")))
    for args in (["--check"], []):
        code, out = run_daemon("edge", config, *args)
        assert code == 2
        line = one_line(out)
        assert "[origins.tunnel] (origin-a) ca:" in line and "gone.pem: cannot read" in line


def test_check_and_start_refuse_keys_others_can_read(world_pki: PkiFiles, tmp_path: Path) -> None:
    config = edge_config(world_pki, tmp_path)
    world_pki.server.key.chmod(0o644)
    for args in (["--check"], []):
        code, out = run_daemon("edge", config, *args)
        assert code == 2
        line = one_line(out)
        assert f"{world_pki.server.key}: private key mode 0644 lets everyone read it" in line
        assert f"chmod 600 {world_pki.server.key}" in line
    world_pki.server.key.chmod(0o640)  # our own group may read it
    assert run_daemon("edge", config, "--check")[0] == 0
    if os.geteuid() != 0:
        return
    os.chown(world_pki.edge.key, 0, 65534)  # group nogroup: not the service's
    world_pki.edge.key.chmod(0o640)
    # Root checking without --user cannot know the service's group ...
    assert run_daemon("edge", config, "--check")[0] == 0
    # ... with it, and at start (the daemon's own group), it does.
    for args in (["--check", "--user", "root"], []):
        code, out = run_daemon("edge", config, *args)
        assert code == 2 and "group nogroup, which is not the service's" in one_line(out)


def test_check_as_the_service_user(world_pki: PkiFiles, tmp_path: Path) -> None:
    """As root, ``--check --user nobody`` opens the files as nobody would."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch users")
    config_dir = Path(tempfile.mkdtemp(prefix="geoedge-conf-", dir=world_pki.dir.parent))
    config_dir.chmod(0o755)
    log_dir = config_dir / "log"
    log_dir.mkdir()
    config = edge_config(world_pki, config_dir)
    config.chmod(0o644)
    config.write_text(
        config.read_text().replace("[edge]\n", f'[edge]\naccess_log = "{log_dir}/a.log"\n', 1)
    )
    code, out = run_daemon("edge", config, "--check", "--user", "nobody")
    assert code == 2
    problems = out.strip().splitlines()
    assert any(
        f"{world_pki.server.key}: cannot read the private key (Permission denied)" in p
        for p in problems
    )
    assert any(f"directory {log_dir} is not writable by nobody" in p for p in problems)
    for key in (world_pki.server.key, world_pki.edge.key):
        os.chown(key, 65534, 65534)
    os.chown(log_dir, 65534, 65534)
    code, out = run_daemon("edge", config, "--check", "--user", "nobody")
    assert code == 0, out
    assert "files checked as nobody" in out


def test_origin_check_and_start_name_the_file(test_pki: PkiFiles, tmp_path: Path) -> None:
    config = write_origin_config(tmp_path / "origin.toml", test_pki, port=free_port(), backends=[1])
    assert run_daemon("origin", config, "--check")[0] == 0
    config.write_text(config.read_text().replace(str(test_pki.origin.key), str(tmp_path / "k.pem")))
    for args in (["--check"], []):
        code, out = run_daemon("origin", config, *args)
        assert code == 2
        line = one_line(out)
        assert f"[tunnel_listener] key: {tmp_path / 'k.pem'}: cannot read the private key" in line


# -- bind errors ---------------------------------------------------------------------------


@contextlib.contextmanager
def occupied() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_edge_bind_errors_name_the_setting_and_the_address(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with occupied() as port:
        config = write_edge_config(
            tmp_path / "edge.toml",
            test_pki,
            https_port=port,
            admin_port=free_port(),
            origins=[("origin-a", free_port())],
        )
        code, out = run_daemon("edge", config)
        assert code == 1
        expected = f"{config}: [[listeners]] address 127.0.0.1:{port}: Address already in use"
        assert one_line(out) == f"geoedge-edge: {expected}"
    with occupied() as port:
        config = write_edge_config(
            tmp_path / "edge.toml",
            test_pki,
            https_port=free_port(),
            admin_port=port,
            origins=[("origin-a", free_port())],
        )
        code, out = run_daemon("edge", config, "--log-level", "error")
        assert code == 1
        assert one_line(out).endswith(f"[admin] address 127.0.0.1:{port}: Address already in use")


def test_origin_bind_errors_name_the_setting_and_the_address(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with occupied() as port:
        config = write_origin_config(tmp_path / "origin.toml", test_pki, port=port, backends=[1])
        code, out = run_daemon("origin", config)
        assert code == 1
        expected = f"{config}: [tunnel_listener] address 127.0.0.1:{port}: Address already in use"
        assert one_line(out) == f"geoedge-origin: {expected}"
    with occupied() as port:
        config = write_origin_config(
            tmp_path / "origin.toml", test_pki, port=free_port(), backends=[1], admin_port=port
        )
        code, out = run_daemon("origin", config)
        assert code == 1
        last = out.strip().splitlines()[-1]
        assert last.endswith(f"[admin] address 127.0.0.1:{port}: Address already in use"), out
        assert "Traceback" not in out
