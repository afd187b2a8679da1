"""DNS discovery: the pure member decisions, getaddrinfo on ``localhost``, and SRV
and A lookups through aiodns against a small DNS server of our own on loopback
(nothing leaves the machine)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import pytest

from origin.config import DnsConfig
from origin.discovery import (
    DnsWatcher,
    SrvRecord,
    members_from_addresses,
    members_from_srv,
    resolve,
)
from tests.conftest import run_async

# --------------------------------------------------------------------------- pure


def test_members_from_addresses_are_unique_sorted_and_bracket_ipv6() -> None:
    assert members_from_addresses(["10.0.0.2", "::1", "10.0.0.2", "10.0.0.1"], 3000) == (
        ("10.0.0.1:3000", 1),
        ("10.0.0.2:3000", 1),
        ("[::1]:3000", 1),
    )


def test_members_from_srv_use_the_lowest_priority_and_weights() -> None:
    records = [
        SrvRecord(10, 5, 3001, "a.node.test."),
        SrvRecord(10, 0, 3002, "B.node.test"),
        SrvRecord(20, 9, 3003, "backup.node.test"),
        SrvRecord(10, 7, 3004, "missing.node.test"),
        SrvRecord(10, 5000, 3005, "a.node.test"),
    ]
    addresses = {
        "a.node.test": ["10.0.0.1"],
        "b.node.test": ["10.0.0.2", "fd00::2"],
        "backup.node.test": ["10.0.0.3"],
    }
    assert members_from_srv(records, addresses) == (
        ("10.0.0.1:3001", 5),
        ("10.0.0.1:3005", 1000),  # capped
        ("10.0.0.2:3002", 1),  # weight 0 -> 1
        ("[fd00::2]:3002", 1),
    )
    assert members_from_srv([], addresses) == ()


def test_a_records_from_the_system_resolver() -> None:
    config = DnsConfig(name="localhost", type="A", port=3000)
    assert run_async(resolve(config)) == (("127.0.0.1:3000", 1),)


# --------------------------------------------------------------------------- a DNS server


def _name(text: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in text.rstrip(".").split(".")) + b"\0"


def _rr(name: bytes, rtype: int, rdata: bytes) -> bytes:
    return name + struct.pack("!HHIH", rtype, 1, 0, len(rdata)) + rdata  # TTL 0: no cache


class FakeDns(asyncio.DatagramProtocol):
    """Answers A and SRV questions from ``zone``; NXDOMAIN for the rest."""

    A, SRV = 1, 33

    def __init__(self) -> None:
        self.zone: dict[tuple[str, int], list[object]] = {}
        self.glue = True
        self.queries: list[tuple[str, int]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        labels, pos = [], 12
        while data[pos]:
            labels.append(data[pos + 1 : pos + 1 + data[pos]].decode())
            pos += 1 + data[pos]
        qtype = struct.unpack_from("!H", data, pos + 1)[0]
        question = data[12 : pos + 5]
        name = ".".join(labels).lower()
        self.queries.append((name, qtype))
        answers, extra = [], []
        for item in self.zone.get((name, qtype), []):
            if qtype == self.A:
                answers.append(_rr(b"\xc0\x0c", 1, bytes(map(int, str(item).split(".")))))
            else:
                prio, weight, port, target = item  # type: ignore[misc]
                rdata = struct.pack("!HHH", prio, weight, port) + _name(target)
                answers.append(_rr(b"\xc0\x0c", 33, rdata))
                for ip in self.zone.get((target, self.A), []) if self.glue else []:
                    extra.append(_rr(_name(target), 1, bytes(map(int, str(ip).split(".")))))
        rcode = 0 if (name, qtype) in self.zone else 3
        header = struct.pack(
            "!HHHHHH",
            struct.unpack_from("!H", data)[0],
            0x8180 | rcode,
            1,
            len(answers),
            0,
            len(extra),
        )
        assert self.transport is not None
        self.transport.sendto(header + question + b"".join(answers) + b"".join(extra), addr)


@pytest.fixture
def dns() -> Iterator[FakeDns]:
    yield FakeDns()


async def serve(dns: FakeDns) -> str:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: dns, local_addr=("127.0.0.1", 0))
    return f"127.0.0.1:{transport.get_extra_info('sockname')[1]}"


def fill(dns: FakeDns) -> None:
    dns.zone[("_web._tcp.app.test", FakeDns.SRV)] = [
        (10, 3, 3001, "n1.app.test"),
        (10, 1, 3002, "n2.app.test"),
        (20, 1, 3009, "spare.app.test"),
    ]
    dns.zone[("n1.app.test", FakeDns.A)] = ["127.0.0.11"]
    dns.zone[("n2.app.test", FakeDns.A)] = ["127.0.0.12", "127.0.0.13"]
    dns.zone[("spare.app.test", FakeDns.A)] = ["127.0.0.19"]


EXPECTED = (("127.0.0.11:3001", 3), ("127.0.0.12:3002", 1), ("127.0.0.13:3002", 1))


@pytest.mark.parametrize("glue", [True, False])
def test_srv_discovery_through_aiodns(dns: FakeDns, glue: bool) -> None:
    fill(dns)
    dns.glue = glue

    async def main() -> tuple[object, ...]:
        server = await serve(dns)
        watcher = DnsWatcher(
            "web",
            DnsConfig(name="_web._tcp.app.test", type="SRV", nameservers=(server,)),
            lambda pool, members: None,
        )
        try:
            return await watcher.resolve_once()  # type: ignore[return-value]
        finally:
            await watcher.close()

    assert run_async(main(), 10) == EXPECTED
    asked_for_targets = ("n1.app.test", FakeDns.A) in dns.queries
    assert asked_for_targets is not glue


def test_a_discovery_with_nameservers(dns: FakeDns) -> None:
    fill(dns)

    async def main() -> object:
        server = await serve(dns)
        config = DnsConfig(name="n2.app.test", type="A", port=8080, nameservers=(server,))
        watcher = DnsWatcher("web", config, lambda pool, members: None)
        try:
            return await watcher.resolve_once()
        finally:
            await watcher.close()

    assert run_async(main(), 10) == (("127.0.0.12:8080", 1), ("127.0.0.13:8080", 1))


def test_watcher_re_resolves_and_keeps_members_when_dns_fails(dns: FakeDns) -> None:
    fill(dns)
    seen: list[tuple[object, ...]] = []

    async def main() -> DnsWatcher:
        server = await serve(dns)
        config = DnsConfig(
            name="_web._tcp.app.test", type="SRV", interval_s=0.05, nameservers=(server,)
        )
        watcher = DnsWatcher("web", config, lambda pool, members: seen.append(members))
        watcher.start()
        try:
            while len(seen) < 2:
                await asyncio.sleep(0.01)
            dns.zone.clear()  # NXDOMAIN from now on
            while watcher.last_error is None:
                await asyncio.sleep(0.01)
            return watcher
        finally:
            await watcher.close()

    watcher = run_async(main(), 10)
    assert seen[0] == seen[1] == EXPECTED
    assert watcher.last_error is not None
    assert all(members == EXPECTED for members in seen)  # nothing reported on failure
