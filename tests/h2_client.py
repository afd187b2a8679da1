"""A small blocking HTTP/2 client for tests, on the ``h2`` library.

It does what an attacker or a browser would: many streams at once, its own
SETTINGS and windows, resets, raw frames. Responses are gathered per stream.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings

from tests.conftest import scaled


@dataclass
class H2Response:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    ended: bool = False
    reset: int | None = None

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n == name), None)


class H2Client:
    def __init__(
        self,
        port: int,
        ca: Path,
        *,
        settings: dict[int, int] | None = None,
        auto_window: bool = True,
        timeout: float | None = None,
    ) -> None:
        """``timeout``: of socket operations (default 10 s, scaled)."""
        timeout = scaled(10.0) if timeout is None else timeout
        context = ssl.create_default_context(cafile=str(ca))
        context.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock = context.wrap_socket(raw, server_hostname="localhost")
        assert self.sock.selected_alpn_protocol() == "h2"
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=config)
        if settings:
            self.conn.local_settings = h2.settings.Settings(client=True, initial_values=settings)
        self.conn.initiate_connection()
        self.auto_window = auto_window
        self.responses: dict[int, H2Response] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = False
        self.remote_settings: dict[int, int] = {}
        self.settings_received = False
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def request(
        self,
        path: str,
        method: str = "GET",
        headers: list[tuple[str, str]] | None = None,
        body: bytes | None = None,
        authority: str = "localhost",
        end: bool = True,
    ) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        fields = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
        ]
        fields += [(n.encode(), v.encode()) for n, v in headers or []]
        self.conn.send_headers(stream_id, fields, end_stream=end and body is None)
        self.responses[stream_id] = H2Response()
        if body is not None:
            self.send_body(stream_id, body, end=end)
        self.flush()
        return stream_id

    def send_body(self, stream_id: int, body: bytes, end: bool = True) -> None:
        offset = 0
        while offset < len(body):
            window = self.conn.local_flow_control_window(stream_id)
            size = min(window, self.conn.max_outbound_frame_size, len(body) - offset)
            if size <= 0:
                self.flush()
                self.receive(0.5)
                continue
            self.conn.send_data(stream_id, body[offset : offset + size])
            offset += size
        if end:
            self.conn.end_stream(stream_id)
        self.flush()

    def receive(self, timeout: float = 1.0) -> bool:
        """Read once (up to ``timeout``); False when the connection is closed."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        except (ssl.SSLError, OSError):
            data = b""
        if not data:
            self.closed = True
            return False
        for event in self.conn.receive_data(data):
            self._on_event(event)
        try:
            self.flush()
        except (ssl.SSLError, OSError):  # the server stopped reading: it is closing
            self.closed = True
            return False
        return True

    def _on_event(self, event: object) -> None:
        if isinstance(event, h2.events.ResponseReceived | h2.events.InformationalResponseReceived):
            response = self.responses.setdefault(event.stream_id, H2Response())
            response.headers = list(event.headers)
            response.status = int(dict(event.headers)[b":status"])
        elif isinstance(event, h2.events.DataReceived):
            response = self.responses.setdefault(event.stream_id, H2Response())
            response.data += event.data
            if self.auto_window:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            self.responses.setdefault(event.stream_id, H2Response()).trailers = list(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            self.responses.setdefault(event.stream_id, H2Response()).ended = True
        elif isinstance(event, h2.events.StreamReset):
            self.responses.setdefault(event.stream_id, H2Response()).reset = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self.remote_settings.update({k: v.new_value for k, v in event.changed_settings.items()})
            self.settings_received = True

    def wait(self, stream_ids: list[int], timeout: float | None = None) -> list[H2Response]:
        """Until every stream ended or was reset (or the connection closed), or
        ``timeout`` (default 10 s, scaled) passed."""
        deadline = time.monotonic() + (scaled(10.0) if timeout is None else timeout)
        while time.monotonic() < deadline and not self.closed:
            if all(
                self.responses[s].ended or self.responses[s].reset is not None for s in stream_ids
            ):
                break
            self.receive(0.2)
        return [self.responses[s] for s in stream_ids]

    def wait_settings(self, timeout: float | None = None) -> dict[int, int]:
        """The server's SETTINGS, once its first SETTINGS frame arrived (fails
        after ``timeout``, default 10 s, scaled)."""
        deadline = time.monotonic() + (scaled(10.0) if timeout is None else timeout)
        while not self.settings_received and not self.closed and time.monotonic() < deadline:
            self.receive(0.2)
        assert self.settings_received, "no SETTINGS from the server"
        return self.remote_settings

    def wait_goaway(self, timeout: float | None = None) -> h2.events.ConnectionTerminated | None:
        """The GOAWAY received, or None once the connection closed without one
        or ``timeout`` (default 5 s, scaled) passed."""
        deadline = time.monotonic() + (scaled(5.0) if timeout is None else timeout)
        while self.goaway is None and not self.closed and time.monotonic() < deadline:
            self.receive(0.2)
        return self.goaway

    def close(self) -> None:
        self.sock.close()
