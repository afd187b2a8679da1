"""The congestion-window warm-up (tunnel/aio/warmup.py) over real sockets and
real mutual TLS: each side pads its sending direction until the kernel's
window covers the target, the peer discards the padding, and streams work
meanwhile; on a short link with the default rate nothing is sent."""

from __future__ import annotations

from tests.conftest import PkiFiles, run_async
from tests.polling import wait_until_async
from tests.tunnel_env import connect, dial_config, listener_config, open_io, start_server
from tunnel.aio.stream import StreamIO
from tunnel.aio.warmup import tcp_facts, warm_up_target
from tunnel.mux import SessionConfig

MiB = 1024 * 1024
#: A rate that makes loopback's ~50 us RTT look like a long fat pipe: the
#: target is the cap, far above the initial window (10 x 32 KiB on loopback).
EAGER = SessionConfig(initial_rate_bytes_per_s=10**12, warm_up_max_bytes=2 * MiB)


async def echo(io: StreamIO) -> None:
    data = await io.read(65536)
    io.write(data)
    io.write_eof()


def test_both_directions_warm_to_the_target_and_streams_still_work(
    test_pki: PkiFiles,
) -> None:
    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), echo, EAGER)
        try:
            edge = await connect(dial_config(test_pki, server.port), EAGER)
            io = open_io(edge)  # a stream while the padding flows
            io.write(b"during warm-up")
            assert await io.read_all() == b"during warm-up"
            await wait_until_async(
                lambda: (
                    server.connections
                    and all(
                        c.warm_up is not None and not c.warm_up.active
                        for c in (edge, *server.connections)
                    )
                ),
                "the warm-up did not end",
            )
            for connection in (edge, *server.connections):
                warm_up = connection.warm_up
                assert warm_up is not None and not warm_up.active
                assert warm_up.target == 2 * MiB
                assert 0 < warm_up.sent <= 2 * warm_up.target
                facts = tcp_facts(connection.get_extra_info("socket"))
                assert facts is not None
                mss, _, cwnd = facts
                assert cwnd * mss >= warm_up.target or warm_up.sent >= 2 * warm_up.target
            assert edge.can_open_stream  # the peer discarded every PADDING frame
            io = open_io(edge)
            io.write(b"after")
            assert await io.read_all() == b"after"
            edge.abort("test over")
        finally:
            await server.close()

    run_async(main(), 30)


def test_a_short_link_is_not_padded(test_pki: PkiFiles) -> None:
    async def main() -> None:
        server = await start_server(listener_config(test_pki, 0), echo)
        try:
            edge = await connect(dial_config(test_pki, server.port))
            # Each side decides once, as its session is established: wait for
            # both decisions (the path ran), then check that they were "no".
            await wait_until_async(
                lambda: (
                    len(server.connections) == 1
                    and all(c.warm_up is not None for c in (edge, *server.connections))
                ),
                "a side never decided about warming up",
            )
            for connection in (edge, *server.connections):
                warm_up = connection.warm_up
                assert warm_up is not None
                facts = tcp_facts(connection.get_extra_info("socket"))
                assert facts is not None and facts[0] * facts[2] >= warm_up.target  # short
                assert warm_up.sent == 0 and not warm_up.active  # so nothing, and no tick
            edge.abort("test over")
        finally:
            await server.close()

    run_async(main(), 30)


def test_the_target_is_the_bandwidth_delay_estimate_capped() -> None:
    rate = SessionConfig().initial_rate_bytes_per_s
    assert warm_up_target(0.265, rate, 4 * MiB) == int(0.265 * rate)  # 2.1 MiB
    assert warm_up_target(0.265, rate, 1 * MiB) == 1 * MiB
    assert warm_up_target(0.0001, rate, 4 * MiB) < 14600  # below ten segments
    assert warm_up_target(0.265, rate, 0) == 0
