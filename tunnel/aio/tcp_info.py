"""The kernel's view of one tunnel connection: Linux ``TCP_INFO``, read and named.

``getsockopt(IPPROTO_TCP, TCP_INFO)`` returns ``struct tcp_info``
(``include/uapi/linux/tcp.h``); the layout below is that struct up to
``tcpi_snd_wnd`` (Linux 5.4+, 232 octets). An older kernel returns fewer
octets: the fields it lacks read as 0. Units are the kernel's (microseconds,
segments, octets, octets a second) and are named in each field.

No library reads it: ``ss`` prints it for a whole namespace from outside (the
text is not meant for parsing), and psutil does not expose it. The warm-up
(:mod:`tunnel.aio.warmup`), the pool's choice of a connection
(:mod:`tunnel.aio.pool`) and the daemons' status pages read it here. One read
is one system call (about 1 us); nothing reads it per frame.
"""

from __future__ import annotations

import socket
import struct
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "TCP_INFO_BYTES",
    "RetransmitTally",
    "Sent",
    "TcpInfo",
    "congestion_control",
    "read_tcp_info",
]

# u8 x8 (state, ca_state, retransmits, probes, backoff, options, wscale, flags),
# u32 x24 (rto .. total_retrans), u64 x4 (pacing_rate .. bytes_received),
# u32 x6 (segs_out .. data_segs_out), u64 x4 (delivery_rate, busy_time,
# rwnd_limited, sndbuf_limited), u32 x2 (delivered, delivered_ce), u64 x2
# (bytes_sent, bytes_retrans), u32 x4 (dsack_dups, reord_seen, rcv_ooopack, snd_wnd).
_LAYOUT = struct.Struct("=8B24I4Q6I4Q2I2Q4I")
TCP_INFO_BYTES = _LAYOUT.size  # 232
_APP_LIMITED = 0x1  # tcpi_delivery_rate_app_limited, the low bit of octet 7
#: tcpi_ca_state values (include/net/tcp.h, enum tcp_ca_state).
CA_STATES = ("open", "disorder", "cwr", "recovery", "loss")


@dataclass(frozen=True, slots=True)
class TcpInfo:
    """One snapshot of a socket's ``tcp_info`` (the fields geoedge uses)."""

    ca_state: int
    """0 open, 1 disorder, 2 cwr, 3 recovery (fast retransmit), 4 loss (timeout)."""
    snd_mss: int
    rto_us: int
    unacked: int
    """Segments in flight."""
    lost: int
    """Segments currently marked lost."""
    rtt_us: int
    """Smoothed RTT."""
    rttvar_us: int
    snd_ssthresh: int
    """Segments; 2^31-1 (infinite) until the first congestion event."""
    snd_cwnd: int
    """Congestion window, in segments."""
    total_retrans: int
    """Segments retransmitted over the connection's life."""
    pacing_rate: int
    """Octets a second (BBR's pacing; for CUBIC about 2 x cwnd / RTT)."""
    bytes_acked: int
    bytes_received: int
    notsent_bytes: int
    min_rtt_us: int
    data_segs_out: int
    delivery_rate: int
    """Octets a second delivered, measured over the last round trip."""
    delivery_rate_app_limited: bool
    """The last delivery-rate sample was limited by the sender having nothing to send."""
    busy_time_us: int
    """Time with data in flight."""
    rwnd_limited_us: int
    """Of that, time stopped by the peer's receive window."""
    sndbuf_limited_us: int
    """Of that, time stopped by our send buffer."""
    delivered: int
    """Segments delivered (acknowledged), retransmissions included."""
    bytes_sent: int
    """Octets sent, retransmissions included."""
    bytes_retrans: int
    snd_wnd: int
    """The peer's advertised receive window, in octets."""

    @property
    def cwnd_bytes(self) -> int:
        return self.snd_cwnd * self.snd_mss

    @property
    def ssthresh_bytes(self) -> int | None:
        """None while the connection has met no congestion event (infinite)."""
        return None if self.snd_ssthresh >= 0x7FFFFFFF else self.snd_ssthresh * self.snd_mss

    @property
    def ca_state_name(self) -> str:
        return CA_STATES[self.ca_state] if self.ca_state < len(CA_STATES) else str(self.ca_state)

    @property
    def retransmit_ratio(self) -> float:
        """Octets retransmitted over octets sent, 0 before any were sent."""
        return self.bytes_retrans / self.bytes_sent if self.bytes_sent else 0.0

    def to_json(self) -> dict[str, int | float | str | bool | None]:
        return {
            "ca_state": self.ca_state_name,
            "cwnd": self.snd_cwnd,
            "cwnd_bytes": self.cwnd_bytes,
            "ssthresh": None if self.ssthresh_bytes is None else self.snd_ssthresh,
            "rtt_ms": self.rtt_us / 1000,
            "min_rtt_ms": self.min_rtt_us / 1000,
            "rto_ms": self.rto_us / 1000,
            "unacked": self.unacked,
            "lost": self.lost,
            "total_retrans": self.total_retrans,
            "bytes_sent": self.bytes_sent,
            "bytes_retrans": self.bytes_retrans,
            "bytes_received": self.bytes_received,
            "delivery_rate": self.delivery_rate,
            "app_limited": self.delivery_rate_app_limited,
            "pacing_rate": self.pacing_rate,
            "busy_ms": self.busy_time_us / 1000,
            "rwnd_limited_ms": self.rwnd_limited_us / 1000,
            "sndbuf_limited_ms": self.sndbuf_limited_us / 1000,
            "notsent_bytes": self.notsent_bytes,
            "snd_wnd": self.snd_wnd,
        }


def read_tcp_info(sock: socket.socket | None) -> TcpInfo | None:
    """``sock``'s tcp_info now, or None (not a TCP socket, closed, not Linux)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    except (OSError, AttributeError):
        return None
    if len(raw) < 104:  # not even tcpi_total_retrans: nothing worth reading
        return None
    (
        _state, ca_state, _retransmits, _probes, _backoff, _options, _wscale, flags,
        rto, _ato, snd_mss, _rcv_mss, unacked, _sacked, lost, _retrans, _fackets,
        _last_data_sent, _last_ack_sent, _last_data_recv, _last_ack_recv,
        _pmtu, _rcv_ssthresh, rtt, rttvar, snd_ssthresh, snd_cwnd, _advmss, _reordering,
        _rcv_rtt, _rcv_space, total_retrans,
        pacing_rate, _max_pacing_rate, bytes_acked, bytes_received,
        _segs_out, _segs_in, notsent_bytes, min_rtt, _data_segs_in, data_segs_out,
        delivery_rate, busy_time, rwnd_limited, sndbuf_limited,
        delivered, _delivered_ce, bytes_sent, bytes_retrans,
        _dsack_dups, _reord_seen, _rcv_ooopack, snd_wnd,
    ) = _LAYOUT.unpack(raw.ljust(TCP_INFO_BYTES, b"\0"))  # fmt: skip
    return TcpInfo(
        ca_state=ca_state, snd_mss=snd_mss, rto_us=rto, unacked=unacked, lost=lost,
        rtt_us=rtt, rttvar_us=rttvar, snd_ssthresh=snd_ssthresh, snd_cwnd=snd_cwnd,
        total_retrans=total_retrans, pacing_rate=pacing_rate, bytes_acked=bytes_acked,
        bytes_received=bytes_received, notsent_bytes=notsent_bytes, min_rtt_us=min_rtt,
        data_segs_out=data_segs_out, delivery_rate=delivery_rate,
        delivery_rate_app_limited=bool(flags & _APP_LIMITED), busy_time_us=busy_time,
        rwnd_limited_us=rwnd_limited, sndbuf_limited_us=sndbuf_limited, delivered=delivered,
        bytes_sent=bytes_sent, bytes_retrans=bytes_retrans, snd_wnd=snd_wnd,
    )  # fmt: skip


def congestion_control(sock: socket.socket | None) -> str | None:
    """The congestion control ``sock`` runs (``TCP_CONGESTION``), or None."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    except (OSError, AttributeError):
        return None
    return raw.split(b"\0", 1)[0].decode("ascii", "replace") or None


class RetransmitTally:
    """Octets each group of tunnel connections sent, and retransmitted, since the
    last :meth:`take`: what the status pages turn into a retransmit ratio.

    Keeps the last figures seen per connection (weakly: a closed connection
    drops out; what it sent after the last take is not counted).
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: weakref.WeakKeyDictionary[object, tuple[int, int]] = weakref.WeakKeyDictionary()

    def take(self, connections: Iterable[tuple[str, object, TcpInfo | None]]) -> dict[str, Sent]:
        """``connections``: (group, connection, its tcp_info now) for each live one."""
        out: dict[str, Sent] = {}
        for group, connection, info in connections:
            if info is None:
                continue
            sent, retrans = self._last.get(connection, (0, 0))
            self._last[connection] = (info.bytes_sent, info.bytes_retrans)
            before = out.get(group, Sent(0, 0))
            out[group] = Sent(
                before.bytes + max(0, info.bytes_sent - sent),
                before.retransmitted + max(0, info.bytes_retrans - retrans),
            )
        return out


@dataclass(frozen=True, slots=True)
class Sent:
    """Octets sent (retransmissions included) and, of them, retransmitted."""

    bytes: int
    retransmitted: int
