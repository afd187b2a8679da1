"""What the access log says of one request: the record a front end and its exchange fill in.

A front end (:mod:`edge.front_h1`, :mod:`edge.front_h2`) starts one per
request, its exchange (:mod:`edge.exchange`) adds what the stream and the
response tell, the output ledger (:mod:`edge.ledger`) what reached the
client, and the worker writes it as one access-log line.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestRecord"]


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

    @property
    def answered(self) -> bool:
        """Some of its response went to the client: an error can only be a cut."""
        return self.out_start >= 0
