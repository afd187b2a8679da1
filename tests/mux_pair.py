"""An in-memory pair of sessions wired back to back, with a manual clock.

The first layer of STYLE.md §12: the whole protocol runs without sockets, and
the test decides how bytes are split on the way (``chunk`` octets at a time).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tunnel.mux import (
    ConnectionTerminated,
    DataReceived,
    Event,
    Session,
    SessionConfig,
    StreamEnded,
    StreamOpened,
    StreamReset,
)


@dataclass
class Side:
    session: Session
    events: list[Event] = field(default_factory=list)
    received: dict[int, bytearray] = field(default_factory=lambda: defaultdict(bytearray))
    ended: set[int] = field(default_factory=set)
    opened: dict[int, object] = field(default_factory=dict)
    resets: dict[int, int] = field(default_factory=dict)
    auto_ack: bool = True

    def take(self, events: list[Event], now: float) -> None:
        for event in events:
            self.events.append(event)
            if isinstance(event, DataReceived):
                self.received[event.stream_id] += event.data
                if self.auto_ack:
                    self.session.acknowledge_received_data(event.stream_id, len(event.data), now)
            elif isinstance(event, StreamEnded):
                self.ended.add(event.stream_id)
            elif isinstance(event, StreamOpened):
                self.opened[event.stream_id] = event.metadata
            elif isinstance(event, StreamReset):
                self.resets[event.stream_id] = event.error_code

    @property
    def terminated(self) -> ConnectionTerminated | None:
        for event in self.events:
            if isinstance(event, ConnectionTerminated):
                return event
        return None


class SessionPair:
    def __init__(
        self,
        client_config: SessionConfig | None = None,
        server_config: SessionConfig | None = None,
        *,
        chunk: int | None = None,
        max_data_bytes: int = 256 * 1024,
    ) -> None:
        self.now = 1000.0
        self.chunk = chunk
        self.max_data_bytes = max_data_bytes
        self.client = Side(Session(client_config or SessionConfig(), client=True, now=self.now))
        self.server = Side(Session(server_config or SessionConfig(), client=False, now=self.now))
        self.wire_bytes = {"c2s": 0, "s2c": 0}

    def _deliver(self, src: Side, dst: Side, key: str) -> bool:
        out = src.session.data_to_send(self.max_data_bytes)
        data = b"".join(bytes(chunk) for chunk in out)
        if not data:
            return False
        self.wire_bytes[key] += len(data)
        step = self.chunk or len(data)
        for i in range(0, len(data), step):
            dst.take(dst.session.receive_data(data[i : i + step], self.now), self.now)
        return True

    def pump(self, max_rounds: int = 10000) -> None:
        """Move bytes both ways until nothing is left to send."""
        for _ in range(max_rounds):
            moved = self._deliver(self.client, self.server, "c2s")
            moved |= self._deliver(self.server, self.client, "s2c")
            if not moved:
                return
        raise AssertionError("pump did not settle")

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for side in (self.client, self.server):
            side.take(side.session.handle_timer(self.now), self.now)

    def establish(self) -> SessionPair:
        self.pump()
        assert self.client.session.established and self.server.session.established
        return self
