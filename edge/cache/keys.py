"""Cache keys: which stored responses a request may be answered from (pure).

The primary key is ``scheme://authority/path?query`` (RFC 9111 §2: the
target URI), the authority from ``Host`` lowercased. Configuration
(:class:`edge.cache.config.CacheKeyConfig`) may leave query parameters out,
sort them, and add request fields' or cookies' values: those follow the URL
on lines of their own, so a key never reads as another URL.

What the key can never be made of: the forwarding fields
(``X-Forwarded-Host`` and friends). The edge sets them itself from the
connection and drops the client's (:mod:`edge.http1.request_head`), and the
key takes the authority from ``Host`` alone, so a client cannot make one URL's
entry hold what the origin answered for another (cache poisoning).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edge.cache.config import CacheKeyConfig

__all__ = ["CacheKey", "KeyMaker", "normalise_url"]

Fields = Sequence[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class CacheKey:
    key: str
    """The primary key: the URL, then each added field or cookie on a line."""
    url: str
    """The normalised URL alone (purge by URL and by prefix)."""


def _query(query: str, config: CacheKeyConfig) -> str:
    if not query or not (config.ignore_query_params or config.sort_query):
        return query
    exact = {n for n in config.ignore_query_params if not n.endswith("*")}
    prefixes = tuple(n[:-1] for n in config.ignore_query_params if n.endswith("*"))
    params = []
    for param in query.split("&"):
        name = param.partition("=")[0]
        if name in exact or (prefixes and name.startswith(prefixes)):
            continue
        params.append(param)
    if config.sort_query:
        params.sort()
    return "&".join(params)


def normalise_url(url: str, config: CacheKeyConfig) -> str:
    """A URL as keys name it: scheme and authority lowercased, the query as
    configured (what an operator's purge by URL is compared with)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    path, _mark, query = (slash + path).partition("?")
    query = _query(query, config)
    return f"{scheme.lower()}://{authority.lower()}{path or '/'}{'?' + query if query else ''}"


class KeyMaker:
    """Makes the key of each request, by one configuration."""

    __slots__ = ("_config", "_cookies", "_headers")

    def __init__(self, config: CacheKeyConfig) -> None:
        self._config = config
        self._headers = tuple(name.lower().encode("ascii") for name in config.headers)
        self._cookies = tuple(config.cookies)

    @property
    def header_names(self) -> tuple[bytes, ...]:
        """The request fields the key reads (lowercase)."""
        return self._headers

    def make(self, scheme: str, host: str | None, target: str, fields: Fields) -> CacheKey:
        path, _mark, query = target.partition("?")
        query = _query(query, self._config)
        authority = (host or "").lower()
        url = f"{scheme}://{authority}{path}{'?' + query if query else ''}"
        if not self._headers and not self._cookies:
            return CacheKey(url, url)
        extra = [url]
        for name in self._headers:
            values = [v for n, v in fields if n == name]
            extra.append(f"{name.decode()}: {b', '.join(values).decode('latin-1')}")
        if self._cookies:
            jar = _cookies(fields)
            for cookie in self._cookies:
                extra.append(f"cookie {cookie}={jar.get(cookie, '')}")
        return CacheKey("\n".join(extra), url)


def _cookies(fields: Fields) -> dict[str, str]:
    jar: dict[str, str] = {}
    for name, value in fields:
        if name != b"cookie":
            continue
        for pair in value.decode("latin-1").split(";"):
            cookie, _, cookie_value = pair.strip().partition("=")
            jar.setdefault(cookie, cookie_value)
    return jar
