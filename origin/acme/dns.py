"""DNS-01: a small provider interface, and the providers.

A provider sets and removes TXT records; :class:`DnsProvider` is all the
issuer asks of it. Several values may live at one name at once (a wildcard
and its apex share ``_acme-challenge.example.com``), so a provider adds and
removes single values, never replaces the set it did not make.

- :class:`origin.acme.route53.Route53Provider`: AWS Route 53 (boto3).
- :class:`ChalltestsrvProvider`: Pebble's ``pebble-challtestsrv``, the DNS
  server a local Pebble resolves with: the whole DNS-01 flow without a real
  zone (the test suite uses it; so can an operator trying a setup).
"""

from __future__ import annotations

from typing import Protocol

import aiohttp

__all__ = ["ChalltestsrvProvider", "DnsError", "DnsProvider", "challenge_name"]


class DnsError(Exception):
    """A TXT record could not be set or removed; the message says why."""


def challenge_name(domain: str) -> str:
    """RFC 8555 §8.4: where the TXT record for ``domain`` (or ``*.domain``) goes."""
    return "_acme-challenge." + domain.removeprefix("*.")


class DnsProvider(Protocol):
    async def add_txt(self, name: str, value: str) -> None:
        """Add ``value`` to the TXT records at ``name``, and return once the
        provider says it is served (:class:`DnsError` otherwise)."""

    async def remove_txt(self, name: str, value: str) -> None:
        """Remove ``value`` from the TXT records at ``name`` (gone already: fine)."""


class ChalltestsrvProvider:
    """pebble-challtestsrv's management API (``/set-txt``, ``/clear-txt``).

    challtestsrv keeps a list per name and clears a name whole, so this
    provider keeps the values it added and sets the rest again after a clear."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self._url = url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._values: dict[str, list[str]] = {}

    async def _post(self, path: str, body: dict[str, str]) -> None:
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout) as session,
                session.post(self._url + path, json=body) as response,
            ):
                if response.status != 200:
                    raise DnsError(f"challtestsrv {path}: HTTP {response.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DnsError(f"challtestsrv {path}: {exc!r}") from None

    async def add_txt(self, name: str, value: str) -> None:
        self._values.setdefault(name, []).append(value)
        await self._post("/set-txt", {"host": name + ".", "value": value})

    async def remove_txt(self, name: str, value: str) -> None:
        values = self._values.get(name, [])
        if value in values:
            values.remove(value)
        await self._post("/clear-txt", {"host": name + "."})
        for left in values:
            await self._post("/set-txt", {"host": name + ".", "value": left})
        if not values:
            self._values.pop(name, None)
