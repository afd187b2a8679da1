"""Tunnel sockets over real TCP and mutual TLS: the congestion control each side
asks for (``SessionConfig.congestion_control``, TCP_CONGESTION) and the kernel's
view of the connection (TCP_INFO, tunnel/aio/tcp_info.py) that the status pages
count retransmits from."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.conftest import PkiFiles, run_async
from tests.tunnel_env import connect, dial_config, listener_config, open_io, start_server
from tunnel.aio.stream import StreamIO
from tunnel.aio.tcp_info import RetransmitTally, congestion_control
from tunnel.mux import SessionConfig

AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def available() -> list[str]:
    return AVAILABLE.read_text().split() if AVAILABLE.exists() else []


async def sink(io: StreamIO) -> None:
    data = await io.read_all()
    io.write(str(len(data)).encode())
    io.write_eof()


@pytest.mark.parametrize("algorithm", ["reno", "bbr"])
def test_each_side_runs_the_congestion_control_it_asks_for(
    test_pki: PkiFiles, algorithm: str
) -> None:
    if algorithm not in available():
        pytest.skip(f"this kernel has no {algorithm}")
    config = SessionConfig(congestion_control=algorithm)

    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), sink, config)
        try:
            edge = await connect(dial_config(test_pki, server.port), config)
            sockets = [c.get_extra_info("socket") for c in (edge, *server.connections)]
            assert len(sockets) == 2
            # Loopback's route pins nothing: without the option both would be the host's.
            assert [congestion_control(s) for s in sockets] == [algorithm, algorithm]
            edge.abort("test over")
        finally:
            await server.close()

    run_async(main(), 30)


def test_a_congestion_control_the_kernel_lacks_keeps_the_default_and_says_so(
    test_pki: PkiFiles, caplog: pytest.LogCaptureFixture
) -> None:
    config = SessionConfig(congestion_control="nosuchcc")

    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), sink)
        try:
            edge = await connect(dial_config(test_pki, server.port), config)
            host_default = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
            assert congestion_control(edge.get_extra_info("socket")) == host_default
            io = open_io(edge)  # and the tunnel works
            io.write(b"x" * 1000)
            io.write_eof()
            assert await io.read_all() == b"1000"
            edge.abort("test over")
        finally:
            await server.close()

    with caplog.at_level(logging.WARNING, logger="geoedge.tunnel"):
        run_async(main(), 30)
    said = [r.getMessage() for r in caplog.records if "nosuchcc" in r.getMessage()]
    assert len(said) == 1, said


def test_tcp_info_counts_what_a_stream_sent(test_pki: PkiFiles) -> None:
    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), sink)
        try:
            edge = await connect(dial_config(test_pki, server.port))
            tally = RetransmitTally()
            first = tally.take([("origin", edge, edge.tcp_info())])
            io = open_io(edge)
            io.write(b"y" * (2 << 20))
            io.write_eof()
            assert await io.read_all() == str(2 << 20).encode()
            info = edge.tcp_info()
            assert info is not None
            assert info.bytes_sent >= 2 << 20 and info.snd_cwnd >= 10 and info.rtt_us > 0
            # (Even loopback retransmits now and then: tail-loss probes on a busy host.)
            assert 0 <= info.bytes_retrans < info.bytes_sent
            (peer,) = server.connections
            peer_info = peer.tcp_info()
            assert peer_info is not None and peer_info.bytes_received >= 2 << 20
            second = tally.take([("origin", edge, info)])
            # The tally counts what was sent since its last look, not since the start.
            assert second["origin"].bytes == info.bytes_sent - first["origin"].bytes
            assert (
                second["origin"].retransmitted == info.bytes_retrans - first["origin"].retransmitted
            )
            edge.abort("test over")
        finally:
            await server.close()

    run_async(main(), 30)
