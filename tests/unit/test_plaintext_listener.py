"""A plain-TCP tunnel listener (``transport = "tcp"``, meant for inside WireGuard)
binds only private addresses unless ``allow_public_plaintext = true`` says
otherwise: the tunnel would cross any other network unencrypted, its peers
admitted by source address alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from geoedge.config import ConfigError, load_config
from origin.config import OriginConfig
from tunnel.aio.transport import plaintext_exposure

ORIGIN = """
[tunnel_listener]
address = "{address}"
transport = "{transport}"
allowed_peers = ["10.99.0.0/24"]
allowed_identities = ["*"]
cert = "origin.pem"
key = "origin-key.pem"
ca = "ca.pem"
{extra}

[[pools]]
name = "web"
default = true
[[pools.backends]]
address = "127.0.0.1:3001"
"""

REFUSED = [
    "0.0.0.0:7443",
    "[::]:7443",
    "198.51.100.7:7443",  # a documentation range: ipaddress calls it private, it is not ours
    "203.0.113.5:7443",
    "8.8.8.8:7443",
    "[2001:db8::1]:7443",
    "origin.example.com:7443",
]
ACCEPTED = [
    "10.99.0.1:7443",
    "172.16.5.1:7443",
    "192.168.1.1:7443",
    "100.64.0.1:7443",
    "127.0.0.1:7443",
    "[fd00:99::1]:7443",
    "[::1]:7443",
]


def write(tmp_path: Path, address: str, transport: str = "tcp", extra: str = "") -> Path:
    path = tmp_path / "origin.toml"
    path.write_text(ORIGIN.format(address=address, transport=transport, extra=extra))
    return path


@pytest.mark.parametrize("address", REFUSED)
def test_tcp_listener_refuses_a_public_or_wildcard_address(tmp_path: Path, address: str) -> None:
    path = write(tmp_path, address)
    with pytest.raises(ConfigError) as caught:
        load_config(path, OriginConfig)
    message = str(caught.value)
    assert message.startswith(f"{path}: [tunnel_listener] address {address!r}")
    assert "allow_public_plaintext = true" in message
    assert caught.value.key == "tunnel_listener"


@pytest.mark.parametrize("address", REFUSED)
def test_allow_public_plaintext_says_so_explicitly(tmp_path: Path, address: str) -> None:
    config = load_config(
        write(tmp_path, address, extra="allow_public_plaintext = true"), OriginConfig
    )
    assert config.tunnel_listener.allow_public_plaintext


@pytest.mark.parametrize("address", ACCEPTED)
def test_tcp_listener_binds_private_addresses(tmp_path: Path, address: str) -> None:
    assert plaintext_exposure(address.rpartition(":")[0].strip("[]")) is None
    load_config(write(tmp_path, address), OriginConfig)


def test_mutual_tls_listens_anywhere(tmp_path: Path) -> None:
    load_config(write(tmp_path, "0.0.0.0:7443", transport="tls"), OriginConfig)


def test_origin_check_names_the_key_without_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "0.0.0.0:7443")
    result = subprocess.run(
        [sys.executable, "-m", "origin", "--config", str(path), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "[tunnel_listener] address '0.0.0.0:7443'" in result.stderr
    assert "allow_public_plaintext" in result.stderr and "Traceback" not in result.stderr
