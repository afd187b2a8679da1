"""The credit this end grants the peer at connection scope, and the window new
streams start from (PROTOCOL.md §7.2, §7.5; IMPLEMENTATION.md §N7.4).

The connection window is a memory bound, not a rate control: it is not tuned
like a stream's (:mod:`tunnel.mux.window`) but sized from the stream estimate,
so that it can carry two streams of the window the path needs.
"""

from __future__ import annotations

from tunnel.mux import frames
from tunnel.mux.constants import SettingId
from tunnel.mux.outbound import Outbound
from tunnel.mux.settings import SessionConfig
from tunnel.mux.window import ReceiveWindow, RttEstimator


class ReceiveCredit:
    """Owns ``window`` (the connection receive window), ``announced_stream_window``
    (the INITIAL_STREAM_WINDOW streams the peer opens start from) and
    ``learned_window`` (the largest window a stream of ours has tuned to).

    Invariants: ``announced_stream_window`` only grows (§5.2); once an estimate
    is announced the connection window is at least twice it; ``window.limit``
    grows only here, and every increment is queued on ``out`` as a WINDOW_UPDATE
    on stream 0; ``learned_window`` never exceeds ``max_stream_window_bytes``.
    The inbound DATA handler counts each frame against ``window`` (its
    :meth:`~tunnel.mux.window.ReceiveWindow.receive` raises FLOW_CONTROL_ERROR
    beyond the limit).
    """

    __slots__ = (
        "_config",
        "_out",
        "_rtt",
        "announced_stream_window",
        "credit_sent",
        "learned_window",
        "window",
    )

    def __init__(
        self,
        config: SessionConfig,
        rtt: RttEstimator,
        out: Outbound,
        now: float,
        learned_window_hint: int = 0,
    ) -> None:
        self._config = config
        self._rtt = rtt
        self._out = out
        self.window = ReceiveWindow(
            config.initial_connection_window_bytes, config.max_connection_window_bytes, now
        )
        self.announced_stream_window = config.initial_stream_window_bytes
        self.learned_window = min(learned_window_hint, config.max_stream_window_bytes)
        #: Connection credit granted by WINDOW_UPDATE so far (octets; only grows).
        self.credit_sent = 0

    def stream_window_estimate(self) -> int:
        """The receive window a new stream starts with (IMPLEMENTATION.md §N7.4): the
        connection's bandwidth-delay estimate, i.e. the larger of the measured
        minimum RTT times ``initial_rate_bytes_per_s`` and the largest window a
        stream has auto-tuned to; before any RTT sample, the configured
        ``initial_stream_window_bytes``. Clamped to the configured bounds."""
        config = self._config
        rtt = self._rtt.min
        if rtt is None:
            estimate = config.initial_stream_window_bytes
        else:
            estimate = int(rtt * config.initial_rate_bytes_per_s)
        estimate = max(estimate, self.learned_window, config.min_stream_window_bytes)
        return min(estimate, config.max_stream_window_bytes)

    def announce_stream_window(self) -> None:
        """Streams the peer opens start from our announced INITIAL_STREAM_WINDOW;
        raise it (it may only grow, §5.2) when the estimate has doubled, and make
        sure the connection window can carry such streams."""
        target = self.stream_window_estimate()
        control = self._out.control
        if target >= 2 * self.announced_stream_window:
            self.announced_stream_window = target
            control.append(frames.encode_settings({SettingId.INITIAL_STREAM_WINDOW: target}))
        increment = self.window.raise_size(2 * target)
        if increment:
            self.credit_sent += increment
            control.append(frames.encode_window_update(0, increment))

    def learn(self, size: int) -> None:
        """A stream proved the path needs a window of ``size``: seed new streams with it."""
        self.learned_window = size
        self.announce_stream_window()

    def return_credit(self, n: int, now: float) -> None:
        """``n`` octets left our buffers, consumed by the application or dropped
        with their stream: credit them back to the peer once due (§7.2, §7.3)."""
        if n:
            increment = self.window.consume(n, now)
            if increment:
                self.credit_sent += increment
                self._out.control.append(frames.encode_window_update(0, increment))
