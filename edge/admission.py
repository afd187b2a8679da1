"""Who gets in: connection caps and per-client request rates (pure, no I/O).

Per worker, as nginx's ``worker_connections`` and ``limit_conn`` zones are
per worker process: every worker owns its connections, and nothing is
coordinated per connection (DESIGN principle 9). With N workers an edge
holds at most N times each cap.

- :class:`ConnectionAdmission`: a global cap and a cap per client address. A
  refused connection is closed right after ``accept()``, before its TLS
  handshake (what a refusal must not cost is the handshake), and counted.
- :class:`RequestRate`: an optional token bucket per client address
  (``rate`` requests a second, bursts of ``burst``) → 429. The table of
  buckets is bounded: the least recently seen address is forgotten first.
"""

from __future__ import annotations

import enum
from collections import OrderedDict


class Refusal(enum.Enum):
    MAX_CONNECTIONS = "max_connections"
    MAX_CONNECTIONS_PER_CLIENT = "max_connections_per_client_ip"


class ConnectionAdmission:
    __slots__ = ("_per_client", "_per_client_limit", "_total", "_total_limit")

    def __init__(self, max_connections: int, max_per_client: int) -> None:
        self._total_limit = max_connections
        self._per_client_limit = max_per_client
        self._total = 0
        self._per_client: dict[str, int] = {}

    def admit(self, client_ip: str) -> Refusal | None:
        """Count a new connection from ``client_ip``, or say why not (nothing counted)."""
        if self._total >= self._total_limit:
            return Refusal.MAX_CONNECTIONS
        held = self._per_client.get(client_ip, 0)
        if held >= self._per_client_limit:
            return Refusal.MAX_CONNECTIONS_PER_CLIENT
        self._per_client[client_ip] = held + 1
        self._total += 1
        return None

    def release(self, client_ip: str) -> None:
        """An admitted connection from ``client_ip`` closed."""
        held = self._per_client.get(client_ip, 0)
        if held <= 1:
            self._per_client.pop(client_ip, None)
        else:
            self._per_client[client_ip] = held - 1
        self._total = max(0, self._total - 1)

    @property
    def open_connections(self) -> int:
        return self._total

    def held_by(self, client_ip: str) -> int:
        return self._per_client.get(client_ip, 0)


class RequestRate:
    """Token buckets per client address; ``rate`` 0 lets everything through."""

    __slots__ = ("_buckets", "_burst", "_max_clients", "_rate")

    def __init__(self, rate: float, burst: int, max_clients: int = 100_000) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def allow(self, client_ip: str, now: float) -> bool:
        """Take one token for a request from ``client_ip`` at ``now`` (seconds)."""
        if self._rate <= 0:
            return True
        buckets = self._buckets
        tokens, at = buckets.pop(client_ip, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        allowed = tokens >= 1.0
        buckets[client_ip] = (tokens - 1.0 if allowed else tokens, now)
        if len(buckets) > self._max_clients:
            buckets.popitem(last=False)
        return allowed
