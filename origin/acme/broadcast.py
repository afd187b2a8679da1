"""How the ACME manager reaches the edges: one message to every tunnel
connection of every connected edge, and their answers (the tunnel's CONTROL
frame and its ACK, ``tunnel/PROTOCOL.md`` §5.14). The origin daemon provides
the implementation (through its workers, which hold the tunnels); the
manager sees only this interface.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

__all__ = ["Broadcaster", "EdgeReply", "by_edge", "confirmed_edges", "summary"]


@dataclass(frozen=True, slots=True)
class EdgeReply:
    """One connection's answer to one message."""

    edge: str
    """The edge's identity (its tunnel certificate's)."""
    connection: str
    """Which of its connections (its peer address and a worker of ours)."""
    status: str
    """``applied``, ``refused``, ``unknown_kind`` (the edge's ACK), ``timeout``,
    ``lost`` or ``not_sent`` (:class:`origin.edge_control.ControlOutcome`)."""
    reason: str = ""


#: ``broadcast(kind, body, timeout_s)``: send a CONTROL message on every
#: connection of every connected edge; each connection's answer, once all
#: answered or ``timeout_s`` passed.
Broadcaster = Callable[[int, bytes, float], Awaitable[list[EdgeReply]]]


def confirmed_edges(replies: Iterable[EdgeReply]) -> set[str]:
    """Edges every one of whose connections applied the message."""
    replies = list(replies)
    edges = {reply.edge for reply in replies}
    failed = {reply.edge for reply in replies if reply.status != "applied"}
    return edges - failed


def summary(replies: Iterable[EdgeReply]) -> str:
    """``edge: status (reason)`` for every edge that did not apply a message."""
    problems = sorted(
        {
            f"{reply.edge}: {reply.status}" + (f" ({reply.reason})" if reply.reason else "")
            for reply in replies
            if reply.status != "applied"
        }
    )
    return "; ".join(problems)


def by_edge(replies: Iterable[EdgeReply]) -> dict[str, str]:
    """Each edge's worst answer (one connection that failed makes it fail)."""
    edges: dict[str, str] = {}
    for reply in replies:
        if edges.get(reply.edge, "applied") == "applied":
            edges[reply.edge] = reply.status
    return edges
