"""The PINGs a session has in flight, and the RTT their PONGs measure
(PROTOCOL.md §5.9, §5.10, §10)."""

from __future__ import annotations

import itertools

from tunnel.mux import frames
from tunnel.mux.errors import ProtocolError
from tunnel.mux.outbound import Outbound
from tunnel.mux.window import RttEstimator

#: More are skipped, not queued (PROTOCOL.md §10).
MAX_OUTSTANDING_PINGS = 8


class Pings:
    """Owns the outstanding PINGs (opaque payload → when it was sent) and the
    counter their payloads come from; feeds ``rtt`` with each PONG.

    Invariants: at most :data:`MAX_OUTSTANDING_PINGS` are outstanding (another
    :meth:`send` is a no-op); every payload is unique to this session, so a
    PONG matches at most one PING, and a PONG that matches none is a protocol
    error.
    """

    __slots__ = ("_counter", "_out", "_rtt", "outstanding")

    def __init__(self, out: Outbound, rtt: RttEstimator) -> None:
        self._out = out
        self._rtt = rtt
        self._counter = itertools.count(1)
        self.outstanding: dict[bytes, float] = {}

    def send(self, now: float) -> None:
        """Queue a PING, unless too many are in flight."""
        if len(self.outstanding) >= MAX_OUTSTANDING_PINGS:
            return
        opaque = next(self._counter).to_bytes(8, "big")
        self.outstanding[opaque] = now
        self._out.control.append(frames.encode_ping(opaque))

    def acknowledge(self, opaque: bytes, now: float) -> float:
        """The PONG for ``opaque`` arrived: its round-trip time, now in ``rtt``."""
        sent_at = self.outstanding.pop(opaque, None)
        if sent_at is None:
            raise ProtocolError("PONG for a PING we did not send")
        sample = now - sent_at
        self._rtt.add_sample(sample)
        return sample
