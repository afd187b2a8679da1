"""What the access log says of one request: the record a front end and its exchange fill in.

A front end (:mod:`edge.front_h1`, :mod:`edge.front_h2`) starts one per
request, its exchange (:mod:`edge.exchange`) adds what the stream and the
response tell, the output ledger (:mod:`edge.ledger`) what reached the
client, and the worker writes it as one access-log line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge.http1 import RequestHeadReceived

__all__ = ["RequestRecord", "is_readiness_check", "own_record", "user_agent_of"]


@dataclass(slots=True)
class RequestRecord:
    """What the access log says of one request (and what a replay needs)."""

    method: str
    path: str
    host: str | None
    request_id: str
    started: float
    protocol: str = "h1"
    """``h1``, ``h2``; ``ws`` once a WebSocket was accepted."""
    replay: bytes | None = None
    """The request's whole bytes when it may be sent again (bodiless, idempotent)."""
    keep_alive: bool = True
    announce_keep_alive: bool = False
    """An HTTP/1.0 client asked to keep its connection: a response that keeps
    it says ``Connection: keep-alive`` (RFC 9112 §9.3; HTTP/1.1 needs no field)."""
    bytes_in: int = 0
    status: int = 0
    bytes_out: int = 0
    """Octets of its response written to the client transport (queued)."""
    out_start: int = -1
    """Offset of its first response octet in the connection's output
    (:mod:`edge.ledger`); -1 while nothing of a response went out for it."""
    out_end: int = -1
    first_byte: float = 0.0
    retried: bool = False
    resent: int = 0
    """Times it went again after an origin refused its stream unprocessed."""
    outcome: str = "ok"
    reason: str = ""
    """Why the edge answered, refused or cut it (logs only, never the wire)."""
    origin: str | None = None
    user_agent: str | None = None
    trace_id: str | None = None
    finished_at: float = 0.0
    ws_close_code: int | None = None
    """A WebSocket's: the status code of the first Close frame (1005: none)."""
    ws_closed_by: str | None = None
    """Who sent that Close first: ``client``, ``backend`` or ``edge`` (a drain)."""
    cache: str = ""
    """What the edge's cache did (edge.cache): hit, stale, miss, revalidated,
    stale-error, collapsed, pass, bypass; empty when it was not asked."""

    @property
    def answered(self) -> bool:
        """Some of its response went to the client: an error can only be a cut."""
        return self.out_start >= 0


def own_record(
    status: int,
    reason: str,
    outcome: str,
    head: RequestHeadReceived | None = None,
    *,
    protocol: str = "h1",
) -> RequestRecord:
    """The record of something the edge answers itself (nothing goes up)."""
    return RequestRecord(
        method=head.method.decode("latin-1") if head is not None else "",
        path=head.target.decode("latin-1") if head is not None else "",
        host=head.host if head is not None else None,
        request_id=head.request_id if head is not None else "",
        started=time.monotonic(),
        protocol=protocol,
        user_agent=user_agent_of(head) if head is not None else None,
        trace_id=head.trace_id if head is not None else None,
        status=status,
        outcome=outcome,
        reason=reason,
    )


def user_agent_of(head: RequestHeadReceived) -> str | None:
    """The request's ``User-Agent``, at most 256 characters, for the log."""
    for name, value in head.client_fields:
        if name == b"user-agent":
            return value[:256].decode("latin-1")
    return None


def is_readiness_check(method: str, path: str, readiness_path: str) -> bool:
    """A ``GET``/``HEAD`` of the edge's own ``[http] readiness_path`` (with or
    without a query), which the edge answers itself; ``""`` switches it off."""
    if not readiness_path or method not in ("GET", "HEAD") or not path.startswith(readiness_path):
        return False
    rest = path[len(readiness_path) :]
    return not rest or rest[0] == "?"
