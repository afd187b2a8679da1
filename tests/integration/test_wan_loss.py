"""The WAN emulator's random loss drops the fraction asked, both ways, on the long link.

``make wan``'s lossy phases (0.1% and 1% on the long links) are only worth
their figures if the delay router really drops that fraction. Here UDP
datagrams cross the edge-origin link in both directions at each rate, and
what arrives is counted at the far end: the drop fraction must lie within
4.5 standard deviations of the binomial expectation (a false alarm about once
in 150,000 runs), and every datagram must
be either delivered or counted as dropped by the delay process (none lost
elsewhere, none dropped on a link that has no loss). Skipped where the
emulator cannot run.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from loadtests.wan.emulator import WanEmulator, unsupported_reason

pytestmark = pytest.mark.timeout(120)

PORT = 7009
#: Datagrams per direction and rate: at 0.1%, 40 drops expected, and the band
#: below (4.5 standard deviations, 28 drops) excludes no loss at all.
COUNT = 40_000

# argv: address port. Counts datagrams until none came for a second (the link
# delays them 132.5 ms), then prints the count. Exits after 60 s whatever happens.
SINK = textwrap.dedent(
    """
    import socket, sys, threading
    watchdog = threading.Timer(60, lambda: __import__("os")._exit(3))
    watchdog.daemon = True
    watchdog.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    sock.bind((sys.argv[1], int(sys.argv[2])))
    print("ready", flush=True)
    sock.settimeout(10.0)
    got = 0
    try:
        sock.recv(64)
        got = 1
        sock.settimeout(1.0)
        while True:
            sock.recv(64)
            got += 1
    except socket.timeout:
        pass
    print(got, flush=True)
    """
)

# argv: address port count. Sends in bursts of 50 with a pause, well below
# what the delay process handles, so nothing but the configured loss drops.
SOURCE = textwrap.dedent(
    """
    import socket, sys, time
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(count):
        sock.sendto(b"%d" % i, (host, port))
        if i % 50 == 49:
            time.sleep(0.002)
    """
)


@pytest.fixture(scope="module")
def wan() -> Iterator[WanEmulator]:
    reason = unsupported_reason()
    if reason is not None:
        pytest.skip(f"WAN emulator unavailable: {reason}")
    with WanEmulator() as emulator:
        yield emulator


def send(wan: WanEmulator, source: str, sink: str) -> int:
    """COUNT datagrams from ``source`` to ``sink``; how many arrived."""
    receiver = wan.popen(
        sink,
        [sys.executable, "-c", SINK, wan.address(sink), str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert receiver.stdout is not None
    assert receiver.stdout.readline().strip() == "ready"
    subprocess.run(
        wan.exec_argv(source, [sys.executable, "-c", SOURCE, wan.address(sink), str(PORT),
                               str(COUNT)]),
        check=True, timeout=60,
    )  # fmt: skip
    out, _ = receiver.communicate(timeout=30)
    return int(out.strip())


def dropped(wan: WanEmulator) -> dict[str, int]:
    return {name: link["dropped_loss"] for name, link in wan.statistics()["links"].items()}


@pytest.mark.parametrize("rate", [0.001, 0.01])
def test_loss_drops_the_fraction_asked_both_ways(wan: WanEmulator, rate: float) -> None:
    wan.set_pair("edge", "origin", loss=rate)
    try:
        before = dropped(wan)
        arrived = {"edge>origin": send(wan, "edge", "origin")}
        arrived["origin>edge"] = send(wan, "origin", "edge")
        after = dropped(wan)
    finally:
        wan.set_pair("edge", "origin", loss=0.0)
    spread = 4.5 * math.sqrt(COUNT * rate * (1 - rate))
    assert COUNT * rate > spread  # the band excludes a link that drops nothing
    report = json.dumps({"rate": rate, "arrived": arrived, "dropped": after})
    for link, got in arrived.items():
        lost = COUNT - got
        assert abs(lost - COUNT * rate) <= spread, report
        # Every datagram that did not arrive was dropped by the configured loss.
        assert after[link] - before[link] == lost, report
    # Links without loss dropped nothing.
    assert all(n == 0 for link, n in after.items() if link not in arrived), report
