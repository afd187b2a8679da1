"""Warming a new tunnel connection's congestion window with PADDING (PROTOCOL.md §5.13).

A fresh TCP connection starts with a congestion window of ten segments
(14.5 KB) and doubles it each round trip while it has data to send. Across a
265 ms tunnel, the first 768 KB response after an edge starts took about
1.9 s (six round trips of slow start) and later ones 0.5 s. Padding sent as
soon as the session is up does that growing before the first request needs
it: each side pads its own sending direction (the origin's is the one
responses take).

The rules, so padding never delays a real frame by more than a few
kilobytes and never costs a short link anything:

- the target is the connection's bandwidth-delay estimate, ``TCP RTT x
  SessionConfig.initial_rate_bytes_per_s`` (the same rate new stream windows
  assume), capped by ``SessionConfig.warm_up_max_bytes``; on loopback that is
  well under the ten initial segments, so nothing is sent;
- padding stops once the kernel's congestion window (``TCP_INFO``) covers the
  target, after twice the target was sent, or after :data:`LIMIT_S` (a path
  that does not grow); and, under a loss-based congestion control (CUBIC,
  Reno), at the first retransmission: each loss cuts such a window by 30%
  and it then grows only while the connection is busy, so padding on through
  loss only causes more cuts (measured on the emulated WAN at 0.1% loss: both
  connections' warm-up gave up after 2.5 and 5 s at windows of 947 and 120
  KiB, and the second stayed at 30-90 segments for the whole run, IMPLEMENTATION.md
  §N12). BBR does not take random loss as congestion, so it pads on. (Padding
  BBR on to twice the target, since its window is twice its bandwidth-delay
  estimate, was tried: every connection gave up at 5 s with 1.0-3.4 MiB
  windows, and the 768 KB p50 at no loss went from 433 to 523 ms);
- a PADDING frame is written only while the session has nothing queued and
  the transport buffer is empty, and only while the socket holds less than a
  quarter of the current window unsent (``SIOCOUTQNSD``; at least one frame's
  worth): a real frame queues behind at most a quarter of a round trip of
  padding. Refilled every eighth of a round trip, that keeps the connection
  window-limited, which is what makes Linux grow the window (an
  application-limited sender's window does not grow: a fixed 32 KiB refilled
  every RTT/8 left it at ~310 KiB after 5 s across 265 ms).

No library does this (TCP offers no socket option to raise a window; route
``initcwnd`` is a host setting the daemons should not change).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct

from tunnel.aio.connection_writer import ConnectionWriter
from tunnel.aio.tcp_info import congestion_control, read_tcp_info
from tunnel.mux import SessionConfig
from tunnel.mux.constants import SettingId
from tunnel.mux.frames import encode_padding

__all__ = ["UNSENT_LIMIT_BYTES", "CongestionWarmUp", "warm_up_target"]

log = logging.getLogger("geoedge.tunnel")

#: The smallest unsent allowance (a quarter of ten segments is 3.6 KiB).
UNSENT_LIMIT_BYTES = 4 * 1024
#: One PADDING frame's payload, or the peer's MAX_FRAME_BYTES if smaller.
FRAME_BYTES = 16 * 1024
#: How often the socket is looked at while warming: every RTT / 8, at least this.
TICK_S = 0.002
#: Padding stops this long after it started, whatever the window (a path
#: whose window does not grow must not keep a connection "warming").
LIMIT_S = 5.0

_SIOCOUTQNSD = 0x894B


def tcp_facts(sock: socket.socket) -> tuple[int, float, int] | None:
    """(snd_mss, RTT in seconds, snd_cwnd in segments) from TCP_INFO, or None."""
    info = read_tcp_info(sock)
    if info is None:
        return None
    return info.snd_mss, info.rtt_us / 1e6, info.snd_cwnd


def loss_based(algorithm: str | None) -> bool:
    """Whether ``algorithm`` takes a loss as congestion (all but the BBR family)."""
    return not (algorithm or "").startswith("bbr")


def unsent_bytes(fd: int) -> int:
    """Octets the socket holds that were not sent yet (SIOCOUTQNSD)."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, _SIOCOUTQNSD, b"\0\0\0\0"))[0])
    except OSError:
        return 1 << 30  # unknown: never pad blind


def warm_up_target(rtt_s: float, rate_bytes_per_s: int, cap_bytes: int) -> int:
    """The window worth warming to: the bandwidth-delay estimate, capped."""
    return min(cap_bytes, int(rtt_s * rate_bytes_per_s))


class CongestionWarmUp:
    """Pads one connection's sending direction until its window covers the target.

    Owns the padding: its target, the octets sent and the tick (every RTT/8)
    that looks at the socket and writes. Padding goes straight to the
    transport of the connection's :class:`ConnectionWriter`, and only while
    that writer is idle: attached, writing not paused, nothing queued in the
    session, the session not closing and the transport buffer empty.

    Invariants: ``active`` exactly while a tick is scheduled; none is after
    :meth:`stop`, which the connection calls when its transport is lost. It
    holds the writer, never the connection.
    """

    __slots__ = (
        "_deadline", "_fd", "_frame", "_loop", "_retrans", "_sock", "_started", "_stop_at_loss",
        "_timer", "_writer", "sent", "target",
    )  # fmt: skip

    @classmethod
    def start(cls, writer: ConnectionWriter, config: SessionConfig) -> CongestionWarmUp | None:
        """Warm the direction ``writer`` sends, once its session is established
        (the peer's MAX_FRAME_BYTES is known); None unless it runs over TCP."""
        transport = writer.transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        return cls(
            writer,
            sock,
            peer_max_frame_bytes=writer.session.peer_settings[SettingId.MAX_FRAME_BYTES],
            rate_bytes_per_s=config.initial_rate_bytes_per_s,
            cap_bytes=config.warm_up_max_bytes,
        )

    def __init__(
        self,
        writer: ConnectionWriter,
        sock: socket.socket,
        *,
        peer_max_frame_bytes: int,
        rate_bytes_per_s: int,
        cap_bytes: int,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._writer = writer
        self._sock = sock
        self._fd = sock.fileno()
        self._frame = min(FRAME_BYTES, peer_max_frame_bytes)
        self._timer: asyncio.TimerHandle | None = None
        self._started = self._loop.time()
        self._deadline = self._started + LIMIT_S
        self.sent = 0
        self.target = 0
        self._stop_at_loss = loss_based(congestion_control(sock))
        info = read_tcp_info(sock)
        self._retrans = 0 if info is None else info.total_retrans
        if info is None or cap_bytes <= 0:
            return
        self.target = warm_up_target(info.rtt_us / 1e6, rate_bytes_per_s, cap_bytes)
        if info.cwnd_bytes < self.target:
            self._timer = self._loop.call_soon(self._tick)  # type: ignore[assignment]

    @property
    def active(self) -> bool:
        """Still padding: the connection is up but its window is not grown yet."""
        return self._timer is not None

    def _done(self, how: str, window: int) -> None:
        log.info(
            "tunnel warm-up: %s: window %d KiB (target %d KiB), %d KiB padding in %.2f s",
            how, window // 1024, self.target // 1024, self.sent // 1024,
            self._loop.time() - self._started,
        )  # fmt: skip

    def stop(self) -> None:
        """Stop padding: the connection's transport is gone."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle(self) -> bool:
        """Padding may go out now without delaying a real frame."""
        writer = self._writer
        transport = writer.transport
        session = writer.session
        return (
            transport is not None
            and not writer.writing_paused
            and not session.wants_to_send
            and not session.closing
            and transport.get_write_buffer_size() == 0
        )

    def _write_padding(self, frame_bytes: int) -> None:
        transport = self._writer.transport
        if transport is not None:
            transport.write(encode_padding(frame_bytes))

    def _tick(self) -> None:
        self._timer = None
        info = read_tcp_info(self._sock)
        if info is None:
            return
        mss, rtt_s, cwnd = info.snd_mss, info.rtt_us / 1e6, info.snd_cwnd
        if cwnd * mss >= self.target:
            self._done("window covers the target", cwnd * mss)
            return
        if self._stop_at_loss and info.total_retrans > self._retrans:
            self._done("stopped at the first loss", cwnd * mss)
            return
        if self.sent >= 2 * self.target or self._loop.time() > self._deadline:
            self._done("gave up", cwnd * mss)
            return
        if self._idle():
            allowance = max(UNSENT_LIMIT_BYTES, cwnd * mss // 4)
            frame = min(self._frame, allowance)
            room = allowance - unsent_bytes(self._fd)
            while room >= frame and self.sent < 2 * self.target:
                self._write_padding(frame)
                self.sent += frame
                room -= frame + 10
        self._timer = self._loop.call_later(max(TICK_S, rtt_s / 8), self._tick)
