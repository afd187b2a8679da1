"""Backends from DNS: A/AAAA or SRV records, resolved again every ``interval_s``.

- A/AAAA with no ``nameservers``: the system resolver (``loop.getaddrinfo``),
  so /etc/hosts and nsswitch apply, as for any other program on the host.
- With ``nameservers`` (Consul at ``127.0.0.1:8600``, a cluster DNS), and for
  SRV always: aiodns (c-ares), asynchronous and told which servers to ask.
- SRV (RFC 2782): only the records of the lowest priority are used (the
  others are backups); each record's weight becomes the backend's weight
  (0 becomes 1, the smallest we have); a target is resolved from the
  answer's additional section when the server included it, else with an A
  (then AAAA) query.

c-ares caches answers for their TTL, so a name is in effect re-read every
``max(interval_s, TTL)``: the DNS owner's TTL is respected.

A failed lookup keeps the last members: a DNS outage must not empty a pool
of backends that are still up. The decisions (:func:`members_from_addresses`,
:func:`members_from_srv`) are pure and tested without DNS.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from origin.config import DnsConfig

__all__ = [
    "DnsWatcher",
    "SrvRecord",
    "members_from_addresses",
    "members_from_srv",
    "resolve",
]

log = logging.getLogger("geoedge.origin.dns")

Member = tuple[str, int]  # (address "host:port", weight)
MAX_WEIGHT = 1000


@dataclass(frozen=True, slots=True)
class SrvRecord:
    priority: int
    weight: int
    port: int
    target: str


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def members_from_addresses(ips: Iterable[str], port: int, weight: int = 1) -> tuple[Member, ...]:
    """Unique ``ip:port`` members, sorted (so an unchanged answer compares equal)."""
    return tuple(sorted({(_address(ip, port), weight) for ip in ips}))


def members_from_srv(
    records: Sequence[SrvRecord], addresses: Mapping[str, Sequence[str]]
) -> tuple[Member, ...]:
    """Members from the lowest-priority SRV records; ``addresses`` maps a
    target (without trailing dot, lower case) to its IPs. Targets without
    addresses are skipped; the same ip:port twice keeps the larger weight."""
    if not records:
        return ()
    best = min(record.priority for record in records)
    out: dict[str, int] = {}
    for record in records:
        if record.priority != best or record.target in ("", "."):
            continue
        weight = min(MAX_WEIGHT, max(1, record.weight))
        for ip in addresses.get(_name(record.target), ()):
            address = _address(ip, record.port)
            out[address] = max(weight, out.get(address, 0))
    return tuple(sorted(out.items()))


def _name(text: str) -> str:
    return text.lower().rstrip(".")


async def _getaddrinfo(name: str, family: socket.AddressFamily) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(name, None, family=family, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def _aiodns_addresses(resolver: object, name: str, qtype: str) -> list[str]:
    result = await resolver.query_dns(name, qtype)  # type: ignore[attr-defined]
    return [record.data.addr for record in result.answer if hasattr(record.data, "addr")]


async def resolve(config: DnsConfig, resolver: object | None = None) -> tuple[Member, ...]:
    """One lookup; raises OSError (getaddrinfo) or aiodns.error.DNSError on failure."""
    if config.type in ("A", "AAAA"):
        if resolver is None:
            family = socket.AF_INET if config.type == "A" else socket.AF_INET6
            ips = await _getaddrinfo(config.name, family)
        else:
            ips = await _aiodns_addresses(resolver, config.name, config.type)
        return members_from_addresses(ips, config.port)
    assert resolver is not None
    result = await resolver.query_dns(config.name, "SRV")  # type: ignore[attr-defined]
    records = [
        SrvRecord(r.data.priority, r.data.weight, r.data.port, r.data.target)
        for r in result.answer
        if hasattr(r.data, "priority") and hasattr(r.data, "target")
    ]
    addresses: dict[str, list[str]] = {}
    for extra in result.additional:
        if hasattr(extra.data, "addr"):
            addresses.setdefault(_name(extra.name), []).append(extra.data.addr)
    for target in {_name(r.target) for r in records} - set(addresses):
        ips = await _aiodns_addresses(resolver, target, "A")
        if not ips:
            ips = await _aiodns_addresses(resolver, target, "AAAA")
        addresses[target] = ips
    return members_from_srv(records, addresses)


class DnsWatcher:
    """Resolves one pool's name every ``interval_s``; reports each successful
    answer to ``on_members(pool, members)``."""

    def __init__(
        self,
        pool: str,
        config: DnsConfig,
        on_members: Callable[[str, tuple[Member, ...]], None],
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.pool = pool
        self.config = config
        self._on_members = on_members
        self._on_error = on_error
        self._resolver: object | None = None
        self._task: asyncio.Task[None] | None = None
        self.last_error: BaseException | None = None

    def start(self, *, resolved: bool = False) -> None:
        """Resolve every ``interval_s`` from now on (after one interval if the
        caller has just resolved, with :meth:`resolve_once`)."""
        self._task = asyncio.get_running_loop().create_task(
            self._run(resolved), name=f"dns {self.pool}"
        )

    def _ensure_resolver(self) -> object | None:
        if self._resolver is None and (self.config.nameservers or self.config.type == "SRV"):
            import aiodns  # only pools that need it load c-ares

            self._resolver = aiodns.DNSResolver(
                nameservers=list(self.config.nameservers) or None, timeout=2.0, tries=2
            )
        return self._resolver

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._resolver is not None:
            await self._resolver.close()  # type: ignore[attr-defined]
            self._resolver = None

    async def resolve_once(self) -> tuple[Member, ...] | None:
        try:
            members = await resolve(self.config, self._ensure_resolver())
        except Exception as exc:  # OSError, aiodns.error.DNSError, malformed answers
            self.last_error = exc
            log.warning(
                "DNS discovery for pool %s (%s %s) failed, keeping the last members: %s",
                self.pool,
                self.config.type,
                self.config.name,
                exc,
            )
            if self._on_error is not None:
                self._on_error(self.pool, exc)
            return None
        self.last_error = None
        self._on_members(self.pool, members)
        return members

    async def _run(self, resolved: bool) -> None:
        if resolved:
            await asyncio.sleep(self.config.interval_s)
        while True:
            await self.resolve_once()
            await asyncio.sleep(self.config.interval_s)
