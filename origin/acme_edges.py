"""An origin worker's part in ACME: an edge that connects gets the current
certificates at once, on that connection, without waiting for the next
renewal (the parent's :class:`origin.acme.manager.AcmeManager` publishes
the set to every worker whenever it changes, and a worker forked later
starts with the set the parent held at its fork)."""

from __future__ import annotations

import asyncio
import logging

from tunnel.aio.connection import TunnelConnection
from tunnel.aio.errors import ControlLost, ControlSendError, ControlTimeout
from tunnel.mux import ControlStatus

__all__ = ["NEW_EDGE_ACK_TIMEOUT_S", "NewEdgeCertificates"]

log = logging.getLogger("geoedge.origin.acme")

#: How long a newly connected edge may take to confirm each certificate.
NEW_EDGE_ACK_TIMEOUT_S = 10.0


class NewEdgeCertificates:
    """The current ACME certificates as CONTROL messages ``(kind, body)``."""

    def __init__(self, messages: list[tuple[int, bytes]] | None = None) -> None:
        self.messages = list(messages or ())
        self._tasks: set[asyncio.Task[None]] = set()

    def replace(self, messages: list[tuple[int, bytes]]) -> None:
        self.messages = list(messages)

    def on_edge(self, connection: TunnelConnection) -> None:
        if not self.messages:
            return
        task = asyncio.get_running_loop().create_task(self._send(connection, self.messages))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _send(connection: TunnelConnection, messages: list[tuple[int, bytes]]) -> None:
        edge = connection.info.peer_identity
        for kind, body in messages:
            try:
                reply = await connection.send_control(kind, body, NEW_EDGE_ACK_TIMEOUT_S)
            except (ControlTimeout, ControlLost, ControlSendError) as exc:
                log.warning("ACME certificate not confirmed by %s: %s", edge, type(exc).__name__)
                return
            if reply.status != ControlStatus.APPLIED:
                log.warning(
                    "ACME certificate not applied by %s: %s %s",
                    edge,
                    reply.status.name.lower(),
                    reply.reason,
                )
