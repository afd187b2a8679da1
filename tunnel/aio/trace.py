"""A diagnostic trace of tunnel connections: the kernel's and the mux's view, sampled.

With ``GEOEDGE_TUNNEL_TRACE_S`` set to an interval in seconds (e.g. ``0.1``),
every tunnel connection of the process logs one line at that interval while it
moves data (and one when it stops): ``tunnel trace {json}`` on the
``geoedge.tunnel.trace`` logger, with the connection's ``TCP_INFO``
(:mod:`tunnel.aio.tcp_info`: cwnd, ssthresh, RTT, retransmits, delivery rate,
time limited by the receive window, the send buffer or the application) and
the session's statistics (windows, credit granted, time streams waited for
credit). ``loadtests/wan/diagnose.py`` sets it in the emulated WAN and reads
the lines back. Off (the default), nothing is armed.

It is a diagnostic, not a metric: the status pages show the figures an
operator needs (loss and retransmits) without it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any, Protocol

from tunnel.aio.tcp_info import congestion_control, read_tcp_info
from tunnel.mux import Session

__all__ = ["ENV", "ConnectionTrace", "trace_interval_s"]

ENV = "GEOEDGE_TUNNEL_TRACE_S"
log = logging.getLogger("geoedge.tunnel.trace")


class Traced(Protocol):
    """What the trace reads of a connection (a :class:`~tunnel.aio.connection.TunnelConnection`)."""

    @property
    def session(self) -> Session: ...

    @property
    def warming(self) -> bool: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


def trace_interval_s() -> float | None:
    """The interval asked for in the environment, or None (off, or not a number > 0)."""
    try:
        value = float(os.environ.get(ENV, ""))
    except ValueError:
        return None
    return value if value > 0 else None


class ConnectionTrace:
    """Samples one connection every ``interval_s`` until :meth:`stop`.

    Logs only samples in which octets moved, plus the first quiet one after,
    so an idle connection costs a timer tick and no output."""

    __slots__ = ("_connection", "_interval", "_last", "_loop", "_quiet", "_timer")

    def __init__(self, connection: Traced, interval_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._connection = connection
        self._interval = interval_s
        self._last = (-1, -1)
        self._quiet = True
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(interval_s, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = self._loop.call_later(self._interval, self._tick)
        connection = self._connection
        stats = connection.session.statistics()
        moved = (stats.bytes_sent, stats.bytes_received)
        if moved == self._last and self._quiet:
            return
        self._quiet = moved == self._last
        self._last = moved
        sock = connection.get_extra_info("socket")
        info = read_tcp_info(sock)
        sockname = connection.get_extra_info("sockname")
        peername = connection.get_extra_info("peername")
        record = {
            "t": round(time.time(), 4),
            "pid": os.getpid(),
            "side": "client" if connection.session.client else "server",
            "local_port": sockname[1] if sockname else None,
            "peer_port": peername[1] if peername else None,
            "cc": congestion_control(sock),
            "streams": stats.streams_open,
            "tcp": None if info is None else info.to_json(),
            "mux": {
                "bytes_sent": stats.bytes_sent,
                "bytes_received": stats.bytes_received,
                "min_rtt_ms": None if stats.min_rtt_s is None else stats.min_rtt_s * 1000,
                "srtt_ms": None if stats.srtt_s is None else stats.srtt_s * 1000,
                "stream_window_estimate": stats.stream_window_estimate,
                "learned_stream_window": stats.learned_stream_window,
                "connection_send_window": stats.connection_send_window,
                "receive_unconsumed": stats.connection_receive_unconsumed,
                "send_buffered": stats.send_buffered,
                "stream_credit_stalls": stats.stream_credit_stalls,
                "stream_credit_wait_s": round(stats.stream_credit_wait_s, 4),
                "connection_window_wait_s": round(stats.connection_window_wait_s, 4),
                "connection_credit_sent": stats.connection_credit_sent,
                "stream_credit_sent": stats.stream_credit_sent,
                "warming": connection.warming,
            },
        }
        log.info("tunnel trace %s", json.dumps(record, separators=(",", ":")))
