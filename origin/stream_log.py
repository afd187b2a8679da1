"""A finished stream's access-log line at the origin.

One line per stream, written when the stream ends; it joins the edge's line
for the same request by ``request_id`` (the edge's ``edge_id`` is in both).
Times are milliseconds from the stream's OPEN; ``outcome`` is
:func:`stream_outcome`.
"""

from __future__ import annotations

import time

from geoedge.logs import AccessLog
from origin.balancer import Backend
from origin.forward import Splice
from tunnel.mux import ErrorCode

__all__ = ["log_stream", "stream_outcome"]

_monotonic = time.monotonic


def stream_outcome(code: int | None, backend_ended: bool = False) -> str:
    """The access log's ``outcome`` for a stream that ended with ``code``
    (None: a graceful end). IDLE is the edge ending the stream after a whole
    exchange, so the backend connection can be reused: a success; so is a
    CANCEL after the backend ended its response by closing (the connection
    could not be reused, nothing was cut)."""
    if code is None or code == ErrorCode.IDLE:
        return "ok"
    if code == ErrorCode.CANCEL and backend_ended:
        return "ok"
    return ErrorCode.name_of(code).lower()


def log_stream(access_log: AccessLog, origin_id: str, splice: Splice, code: int | None) -> None:
    """Write ``splice``'s line, its stream having ended with ``code``."""
    stream = splice.stream
    metadata = stream.metadata if stream is not None else None
    backend: Backend | None = splice.tag
    opened = splice.opened_at
    client = metadata.client_address if metadata is not None else None
    access_log.log(
        client_ip=client[0] if client else None,
        method=metadata.method if metadata is not None else None,
        host=metadata.host if metadata is not None else None,
        path=metadata.target if metadata is not None else None,
        status=splice.status,
        bytes_in=splice.bytes_up,
        bytes_out=splice.bytes_down,
        duration_ms=(_monotonic() - opened) * 1000,
        upstream_ms=(splice.first_byte_at - opened) * 1000 if splice.first_byte_at else None,
        edge_id=metadata.edge_id if metadata is not None else None,
        origin=origin_id,
        request_id=metadata.request_id if metadata is not None else None,
        pool=splice.pool,
        backend=backend.address if backend is not None else None,
        reused=splice.reused,
        connect_ms=(
            round((splice.connected_at - opened) * 1000, 3) if splice.connected_at else None
        ),
        queue_ms=round(splice.queued_s * 1000, 3) if splice.queued_s else None,
        outcome=stream_outcome(code, splice.backend_eof),
    )
