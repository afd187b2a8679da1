"""What the HTTP/1.1 readers are configured with: size limits and the client's facts.

Frozen typed data (DESIGN principle 10): a bad value fails at construction with
a message naming the field, never later on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

KiB = 1024


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Size limits of one HTTP/1.1 connection, in bytes unless the name says otherwise.

    Every buffer the readers keep is bounded by one of these fields, so a
    peer can make a reader hold at most about ``max_header_bytes +
    max_held_upgrade_bytes`` bytes (``buffered_bytes`` on each reader reports it).
    """

    max_request_line_bytes: int = 8 * KiB
    """Longest request line (and, on the response side, status line), *excluding*
    its CRLF. Longer → 414 URI Too Long."""

    max_header_bytes: int = 16 * KiB
    """Longest whole head: request line *included*, every header line with its
    CRLF, the empty line that ends the head, and any empty lines ignored before
    the request line (RFC 9112 §2.2). Longer → 431. The same bound applies to a
    chunked body's trailer section."""

    max_headers: int = 100
    """Most header fields in one head. More → 431."""

    max_chunk_size_digits: int = 16
    """Most hex digits in a chunk-size (leading zeros count). More → 400."""

    max_chunk_extension_bytes: int = 256
    """Longest chunk extension, from its first ``;`` to the CRLF. Longer → 400."""

    max_body_bytes: int = 100 * KiB * KiB
    """Largest request body (Cloudflare's default). A larger ``Content-Length``
    → 413 before anything goes up; a chunked body that grows past it → 413 and
    the request's stream is reset."""

    max_held_upgrade_bytes: int = 64 * KiB
    """Most client bytes held while a WebSocket upgrade awaits the backend's answer
    (RFC 6455 §4.1: a client must not send before the 101). More → 400."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if type(value) is not int or value < 1:
                raise ValueError(f"HttpLimits.{field.name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True)
class ClientContext:
    """What the edge knows about the client of one connection."""

    client_ip: str
    """Real client address (after PROXY protocol), e.g. ``203.0.113.9`` or ``2001:db8::1``."""

    client_port: int
    """Real client port (after PROXY protocol); for logs, not sent to the backend."""

    trusted_proxy: bool
    """The peer is a configured trusted proxy: keep its forwarding headers and
    append to them. Otherwise they are stripped (DESIGN principle 8)."""

    scheme: str = "https"
    """Scheme the client used to reach the edge: ``https`` or ``http``."""

    server_port: int = 443
    """Port the client connected to (sent as ``X-Forwarded-Port``)."""

    def __post_init__(self) -> None:
        ip = self.client_ip
        if not ip or not ip.isascii() or not ip.isprintable() or " " in ip:
            raise ValueError(f"ClientContext.client_ip must be a printable address, got {ip!r}")
        if self.scheme not in ("http", "https"):
            raise ValueError(f"ClientContext.scheme must be 'http' or 'https', got {self.scheme!r}")
        for name in ("client_port", "server_port"):
            port = getattr(self, name)
            if type(port) is not int or not 0 <= port <= 65535:
                raise ValueError(f"ClientContext.{name} must be an int in 0..65535, got {port!r}")
