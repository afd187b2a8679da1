"""Session configuration: typed, frozen, one docstring per field (aioquic style).

Units are in the names. Defaults live here and nowhere else; the daemons' TOML
``[tunnel]`` table maps onto these fields one to one.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunnel.mux.constants import (
    MAX_FRAME_BYTES_LIMIT,
    MAX_WINDOW,
    MIN_FRAME_BYTES,
    SETTING_DEFAULTS,
    SettingId,
)

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True, slots=True)
class SessionConfig:
    max_frame_bytes: int = SETTING_DEFAULTS[SettingId.MAX_FRAME_BYTES]
    """Largest DATA payload we accept; announced as MAX_FRAME_BYTES. The sender
    also never sends frames larger than this, so a small response waits behind at
    most one frame of a bulk transfer (PROTOCOL.md §7.4)."""

    max_concurrent_streams: int = SETTING_DEFAULTS[SettingId.MAX_CONCURRENT_STREAMS]
    """Streams the peer may have open towards us at once; more are refused."""

    initial_stream_window_bytes: int = SETTING_DEFAULTS[SettingId.INITIAL_STREAM_WINDOW]
    """Receive window of streams opened before the connection has measured its
    RTT (announced in HELLO). Afterwards new streams start from the connection's
    bandwidth-delay estimate (:meth:`Session.stream_window_estimate`)."""

    initial_rate_bytes_per_s: int = 8 * MiB
    """The path rate assumed before streams have shown a faster one: new streams
    start at ``min_rtt * initial_rate_bytes_per_s``. At 265 ms that is 2.1 MiB,
    so a 768 KB response crosses a long link in one round trip; on loopback it
    is tiny, so a bulk transfer cannot queue milliseconds of data ahead of a
    small response. Auto-tuning takes it from there (see :mod:`.window`)."""

    warm_up_max_bytes: int = 4 * MiB
    """Cap of the PADDING a new connection sends to grow its congestion window
    (PROTOCOL.md §5.13, IMPLEMENTATION.md §N10; :mod:`tunnel.aio.warmup`). It sends up to its
    bandwidth-delay estimate (TCP RTT x ``initial_rate_bytes_per_s``, 2.1 MiB
    at 265 ms, nothing on a LAN), stopping once the window covers it; 0: never."""

    congestion_control: str = "bbr"
    """TCP congestion control for each tunnel socket (``TCP_CONGESTION``, set by
    the asyncio adapter, :func:`tunnel.aio.connection.tune_socket`); empty:
    whatever the route or the host's sysctl chooses. Each side sets its own
    sending direction's (the origin's carries the responses). BBR, because a
    long path's random loss is not congestion: at 0.1% loss CUBIC's window
    on a tunnel connection fell to 30-90 segments and a 768 KB response took
    2.1 s (p50) where BBR's stayed at 1,000-2,200 and took 0.62 s
    (IMPLEMENTATION.md §N12). A name the kernel lacks is logged once and the
    sockets keep the host's default."""

    min_stream_window_bytes: int = 64 * KiB
    """Smallest window a new stream starts with."""

    max_stream_window_bytes: int = 16 * MiB
    """Cap of a stream's auto-tuned receive window: the most one stream can
    make us buffer. 16 MiB fills ~500 Mbit/s at 265 ms."""

    initial_connection_window_bytes: int = SETTING_DEFAULTS[SettingId.INITIAL_CONNECTION_WINDOW]
    """Starting receive window of the whole connection, across its streams."""

    max_connection_window_bytes: int = 64 * MiB
    """Cap of the connection's auto-tuned receive window: the most all streams
    of one tunnel connection together can make us buffer."""

    max_metadata_bytes: int = SETTING_DEFAULTS[SettingId.MAX_METADATA_BYTES]
    """Largest OPEN metadata block we accept."""

    ping_interval_s: float = 2.0
    """How often we PING to measure RTT and prove the peer alive."""

    ping_timeout_s: float = 10.0
    """With nothing received for this long, the peer is declared dead. 10 s
    fits the long links the tunnel is for: at 265 ms TCP's retransmission
    timeout is ~0.5 s and doubles on each consecutive loss, so a shorter
    deadline can kill a connection TCP was about to recover from a burst of
    loss; four back-to-back timeouts fit in 10 s."""

    stall_timeout_s: float = 60.0
    """A stream with data to send and no send window for this long is reset
    (STALLED): a peer cannot pin our buffers by never granting credit."""

    error_budget: float = 1000.0
    """Points of suspicious peer behaviour tolerated at once (IMPLEMENTATION.md §N8.1)."""

    error_budget_refill_per_s: float = 100.0
    """Points the budget regains per second."""

    max_pending_control_frames: int = 10000
    """Control frames (PONG, WINDOW_UPDATE, RESET) we queue for a peer that does
    not read them before giving up on it with ENHANCE_YOUR_CALM."""

    def __post_init__(self) -> None:
        problems = []
        if not MIN_FRAME_BYTES <= self.max_frame_bytes <= MAX_FRAME_BYTES_LIMIT:
            problems.append(
                f"max_frame_bytes must be in [{MIN_FRAME_BYTES}, {MAX_FRAME_BYTES_LIMIT}]"
            )
        if not (
            1
            <= self.min_stream_window_bytes
            <= self.initial_stream_window_bytes
            <= self.max_stream_window_bytes
            <= MAX_WINDOW
        ):
            problems.append(
                "need 1 <= min_stream_window_bytes <= initial_stream_window_bytes"
                " <= max_stream_window_bytes <= 2^31-1"
            )
        if not (
            1
            <= self.initial_connection_window_bytes
            <= self.max_connection_window_bytes
            <= MAX_WINDOW
        ):
            problems.append(
                "need 1 <= initial_connection_window_bytes <= max_connection_window_bytes <= 2^31-1"
            )
        if self.initial_rate_bytes_per_s < 1:
            problems.append("initial_rate_bytes_per_s must be positive")
        if self.congestion_control and not (
            self.congestion_control.isascii()
            and self.congestion_control.replace("_", "").isalnum()
            and len(self.congestion_control) < 16
        ):
            problems.append("congestion_control must be a kernel module name such as 'bbr'")
        if self.warm_up_max_bytes < 0:
            problems.append("warm_up_max_bytes must be 0 (off) or more")
        if self.max_concurrent_streams < 1:
            problems.append("max_concurrent_streams must be at least 1")
        if not 0 < self.ping_interval_s < self.ping_timeout_s:
            problems.append("need 0 < ping_interval_s < ping_timeout_s")
        if self.max_metadata_bytes < 64 or self.max_metadata_bytes > 65535:
            problems.append("max_metadata_bytes must be in [64, 65535]")
        if problems:
            raise ValueError("; ".join(problems))

    def announced_settings(self) -> dict[int, int]:
        """What we put in HELLO (PROTOCOL.md §5.1)."""
        return {
            SettingId.MAX_FRAME_BYTES: self.max_frame_bytes,
            SettingId.MAX_CONCURRENT_STREAMS: self.max_concurrent_streams,
            SettingId.INITIAL_STREAM_WINDOW: self.initial_stream_window_bytes,
            SettingId.INITIAL_CONNECTION_WINDOW: self.initial_connection_window_bytes,
            SettingId.MAX_METADATA_BYTES: self.max_metadata_bytes,
        }
