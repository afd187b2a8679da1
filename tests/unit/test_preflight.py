"""Operator errors found before serving (geoedge.preflight and the host
check of every address setting): each names the file or the key."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from geoedge.config import ConfigError, config_from_mapping, load_config
from geoedge.preflight import (
    FileCheck,
    ListenError,
    PreflightError,
    check_files,
    key_mode_problem,
)
from origin.config import OriginConfig
from tunnel.aio.transport import parse_host_port


def fake_stat(mode: int, gid: int) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, 0, gid, 100, 0, 0, 0))


def test_without_the_services_group_only_everyone_is_refused() -> None:
    assert key_mode_problem(Path("/k"), fake_stat(0o640, 7), service_gid=None) is None
    assert key_mode_problem(Path("/k"), fake_stat(0o644, 7), service_gid=None) is not None


@pytest.mark.parametrize(
    ("mode", "gid", "problem"),
    [
        (0o600, 0, None),
        (0o400, 7, None),
        (0o640, 100, None),  # the service's own group
        (0o660, 100, None),
        (0o640, 7, "lets group"),  # another group
        (0o604, 100, "lets everyone read it"),
        (0o644, 100, "lets everyone read it"),
        (0o602, 100, "lets everyone"),
    ],
)
def test_which_key_modes_are_refused(mode: int, gid: int, problem: str | None) -> None:
    found = key_mode_problem(Path("/k.pem"), fake_stat(mode, gid), service_gid=100)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert f"mode {mode:04o}" in found and "chmod 600 /k.pem" in found


def test_every_problem_is_reported_with_its_setting(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("k")
    key.chmod(0o644)
    cert = tmp_path / "cert.pem"
    cert.write_text("c")
    checks = [
        FileCheck(cert, "certificate", "[[tls.certificates]] cert"),
        FileCheck(key, "private key", "[[tls.certificates]] key"),
        FileCheck(tmp_path / "nope.pem", "CA", "[origins.tunnel] (a) ca"),
        FileCheck(tmp_path, "certificate", "[x] cert"),
        FileCheck(tmp_path / "a-file" / "access.log", "log file", "[edge] access_log"),
        FileCheck(tmp_path / "no-dir" / "access.log", "log file", "[edge] access_log"),
    ]
    (tmp_path / "a-file").write_text("")
    with pytest.raises(PreflightError) as caught:
        check_files(checks, service_gid=os.getegid())
    assert caught.value.problems == [
        f"[[tls.certificates]] key: {key}: private key mode 0644 lets everyone read it; "
        f"chmod 600 {key} (or 640 with the service's group)",
        f"[origins.tunnel] (a) ca: {tmp_path / 'nope.pem'}: cannot read the CA "
        "(No such file or directory)",
        f"[x] cert: {tmp_path}: cannot read the certificate (Is a directory)",
        f"[edge] access_log: {tmp_path / 'a-file' / 'access.log'}: "
        f"{tmp_path / 'a-file'} is not a directory",
    ]  # (a missing directory is made by the daemon: only its parent must be writable)
    key.chmod(0o600)
    log = FileCheck(tmp_path / "a.log", "log file", "[edge] access_log")
    check_files([*checks[:2], log], service_gid=None)


def test_a_listen_error_names_the_setting_the_address_and_the_reason() -> None:
    error = ListenError("[admin] address", "127.0.0.1:9100", OSError(errno.EADDRINUSE, "x"))
    assert str(error) == "[admin] address 127.0.0.1:9100: Address already in use"
    assert error.errno == errno.EADDRINUSE


@pytest.mark.parametrize(
    "text",
    [
        *("app#frag:3000", "127.0.0.1#x:80", "a b:80", "host/path:80", ":80", "[::1]x:80"),
        *("[nope]:80", "999.1.1.1:80", "-app:80", "app-:80", "http://app:80"),
    ],
)
def test_a_host_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_host_port(text)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.1:3000", ("127.0.0.1", 3000)),
        ("[::1]:80", ("::1", 80)),
        ("app.internal:3000", ("app.internal", 3000)),
        ("_http._tcp.web.service.consul:80", ("_http._tcp.web.service.consul", 80)),
        ("origin.example.com.:7443", ("origin.example.com.", 7443)),
    ],
)
def test_hosts_that_are_hosts_pass(text: str, parsed: tuple[str, int]) -> None:
    assert parse_host_port(text) == parsed


ORIGIN = """
[tunnel_listener]
address = "127.0.0.1:7443"
transport = "tcp"
allowed_peers = ["10.0.0.0/8"]

[[pools]]
name = "web"
[[pools.backends]]
address = "{backend}"
"""


def test_a_backend_target_with_junk_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "origin.toml"
    path.write_text(ORIGIN.format(backend="app.internal:3000#frag"))
    with pytest.raises(ConfigError, match=r"origin.toml: \[pools\[0\].backends\[0\]\] .*port"):
        load_config(path, OriginConfig)
    path.write_text(ORIGIN.format(backend="app.internal#frag:3000"))
    with pytest.raises(
        ConfigError,
        match=r"origin.toml: \[pools\[0\].backends\[0\]\] .*host must be an IP address",
    ):
        load_config(path, OriginConfig)


def test_a_dns_pool_name_with_junk_is_refused() -> None:
    mapping = {
        "tunnel_listener": {"transport": "tcp", "allowed_peers": ["10.0.0.0/8"]},
        "pools": [{"name": "web", "dns": {"name": "web.consul#x", "port": 80}}],
    }
    with pytest.raises(ConfigError, match="is not a DNS name"):
        config_from_mapping(mapping, OriginConfig)
