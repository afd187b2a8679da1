"""Which deadline a client connection has missed, if any: a pure decision.

The worker's sweep (once a second) asks :func:`expired` about every open
connection and acts on the answer; the connection keeps only timestamps. The
deadlines, after HAProxy's ``timeout http-request / client / server /
tunnel`` and nginx's ``client_header_timeout / client_body_timeout /
proxy_read_timeout / keepalive_timeout``:

========================  ===================================================  =======
phase                     deadline                                             answer
========================  ===================================================  =======
``head``                  the whole head within ``header_timeout_s`` of its     408
                          first octet (absolute: a trickle does not extend it)
``idle``                  the next request within ``keepalive_timeout_s``       close
``sending``               the request body progresses at least every            408
                          ``body_timeout_s``
``waiting``               the response starts within ``first_byte_timeout_s``   504
                          of the request's last octet, then progresses at
                          least every ``between_bytes_timeout_s``
                          (``long_poll_prefixes``: both are
                          ``websocket_idle_timeout_s``), unless the client's
                          own slowness paused it (the transport's send timeout
                          covers that)
``tunnel``                some traffic either way within                        close
                          ``websocket_idle_timeout_s``
========================  ===================================================  =======

The two ``waiting`` deadlines are the origin's (``[[pools]]
first_byte_timeout_s``, ``between_bytes_timeout_s``: :mod:`origin.deadlines`)
at the other hop, under the same names. A 408 or 504 is written only if
nothing of a response went out yet; otherwise
the connection is closed without close_notify (the client can tell the cut).
The sweep's one-second period is the precision of every deadline.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class Phase(enum.Enum):
    IDLE = "idle"
    """Between requests, nothing of the next one received."""
    HEAD = "head"
    """Part of a request head received."""
    SENDING = "sending"
    """A request head went up; its body is still arriving from the client."""
    WAITING = "waiting"
    """Requests went up whole; their responses are awaited or arriving."""
    TUNNEL = "tunnel"
    """An upgraded connection (WebSocket)."""


class Missed(enum.Enum):
    """A missed deadline: what the sweep does about it (see the table above)."""

    HEADER = "header timeout"
    KEEPALIVE = "keep-alive timeout"
    BODY = "request body timeout"
    RESPONSE = "response timeout"
    TUNNEL_IDLE = "websocket idle timeout"


@dataclass(frozen=True, slots=True)
class Deadlines:
    header_s: float
    keepalive_s: float
    body_s: float
    first_byte_s: float
    between_bytes_s: float
    tunnel_idle_s: float
    long_poll_prefixes: tuple[str, ...] = ()

    def is_long_poll(self, path: str) -> bool:
        """``path`` is a long poll: the origin hears so (LONG_POLL, PROTOCOL.md
        §6.2) and waits for it as the edge does."""
        prefixes = self.long_poll_prefixes
        return bool(prefixes) and path.startswith(prefixes)


class Clock(Protocol):
    """What :func:`expired` reads of a connection (all times ``time.monotonic``)."""

    @property
    def phase(self) -> Phase: ...
    @property
    def phase_since(self) -> float: ...
    @property
    def client_active_at(self) -> float: ...
    @property
    def upstream_active_at(self) -> float: ...
    @property
    def response_started(self) -> bool: ...
    @property
    def response_paused(self) -> bool: ...
    @property
    def awaited_path(self) -> str: ...


def expired(clock: Clock, deadlines: Deadlines, now: float) -> Missed | None:
    """The deadline ``clock``'s connection has missed at ``now``, or None."""
    phase = clock.phase
    if phase is Phase.HEAD:
        return Missed.HEADER if now - clock.phase_since > deadlines.header_s else None
    if phase is Phase.IDLE:
        return Missed.KEEPALIVE if now - clock.phase_since > deadlines.keepalive_s else None
    if phase is Phase.SENDING:
        return Missed.BODY if now - clock.client_active_at > deadlines.body_s else None
    if phase is Phase.WAITING:
        if clock.response_paused:
            return None
        limit = response_limit(deadlines, clock.response_started, clock.awaited_path)
        return Missed.RESPONSE if now - clock.upstream_active_at > limit else None
    active = max(clock.client_active_at, clock.upstream_active_at)
    return Missed.TUNNEL_IDLE if now - active > deadlines.tunnel_idle_s else None


def response_limit(deadlines: Deadlines, started: bool, path: str) -> float:
    """Seconds the origin may be silent while a response is awaited: before
    its first octet, after it, or for a long poll (HTTP/1.1 and HTTP/2 alike)."""
    if deadlines.is_long_poll(path):
        return deadlines.tunnel_idle_s
    return deadlines.between_bytes_s if started else deadlines.first_byte_s
