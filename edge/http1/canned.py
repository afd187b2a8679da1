"""Responses the edge writes itself: errors (400, 431, 502, 503, 504...), the
plain-HTTP → HTTPS redirect and the answer to an ACME HTTP-01 challenge.

Small, complete and unambiguous: a status line with the standard reason
phrase, ``Content-Type``, ``Content-Length``, ``Connection: close`` (unless
told otherwise) and ``X-Request-Id`` when one is known. The body is generic
text: a rejection's internal reason is for logs, never for the wire.
"""

from __future__ import annotations

from http import HTTPStatus

from edge.http1.syntax import REQUEST_ID_RE

_LOCATION_FORBIDDEN = frozenset(range(0x21)) | {0x7F}


def error_response(
    status: int,
    *,
    close: bool = True,
    body: str | None = None,
    request_id: str | None = None,
) -> bytes:
    """An HTTP/1.1 error response for ``status`` (4xx or 5xx), as bytes to write.

    ``body`` defaults to ``"<status> <reason phrase>\\n"``. Raises ``ValueError``
    for a status outside 400-599 or a request id that could not be a field value.
    """
    if type(status) is not int or not 400 <= status <= 599:
        raise ValueError(f"error_response needs a 4xx or 5xx status, got {status!r}")
    phrase = _phrase(status)
    payload = (body if body is not None else f"{status} {phrase}\n").encode("utf-8")
    lines = [
        f"HTTP/1.1 {status} {phrase}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(payload)}",
        "Cache-Control: no-store",
    ]
    if close:
        lines.append("Connection: close")
    if request_id is not None:
        if not request_id.isascii() or REQUEST_ID_RE.fullmatch(request_id.encode()) is None:
            raise ValueError(f"request_id is not a valid field value: {request_id!r}")
        lines.append(f"X-Request-Id: {request_id}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + payload


def https_location(host: str | None, target: str, https_port: int) -> str | None:
    """Where a plain-HTTP request for ``target`` on ``host`` (its Host field,
    already validated) moves to: the same name on ``https_port``, the same
    target. None when there is nothing to redirect to (no Host, a target that
    is not origin-form). An IPv6 literal keeps its brackets (RFC 3986 §3.2.2)
    and loses only the port after them."""
    if not host or not target.startswith("/"):
        return None
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return None
        name = host[: end + 1]
    else:
        name = host.partition(":")[0]
    if name in ("", "[]"):
        return None
    authority = name if https_port == 443 else f"{name}:{https_port}"
    return f"https://{authority}{target}"


def redirect_response(location: str) -> bytes:
    """A ``301 Moved Permanently`` to ``location`` that closes the connection.

    ``location`` must be an ASCII URI without spaces or control characters
    (the caller percent-encodes); anything else raises ``ValueError`` rather
    than risk a header injection.
    """
    if (
        not location
        or not location.isascii()
        or any(ord(char) in _LOCATION_FORBIDDEN for char in location)
    ):
        raise ValueError(f"redirect location is not a valid URI reference: {location!r}")
    payload = b"301 Moved Permanently\n"
    head = (
        "HTTP/1.1 301 Moved Permanently\r\n"
        f"Location: {location}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Connection: close\r\n"
        "\r\n"
    )
    return head.encode("ascii") + payload


def text_response(body: str) -> bytes:
    """A ``200 OK`` with ``body`` (ASCII text, e.g. an ACME key authorization,
    RFC 8555 §8.3) that closes the connection and is never cached."""
    payload = body.encode("ascii")
    head = (
        "HTTP/1.1 200 OK\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n"
        "\r\n"
    )
    return head.encode("ascii") + payload


def readiness_response(ready: bool, *, head_only: bool = False) -> bytes:
    """The edge's answer to its ``readiness_path``: ``200`` and ``ready``, or
    ``503`` and ``not ready``; never cached, and the connection closes (health
    checkers open one per check). ``head_only``: the same head, no body (HEAD)."""
    status = 200 if ready else 503
    payload = b"ready\n" if ready else b"not ready\n"
    head = (
        f"HTTP/1.1 {status} {_phrase(status)}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n"
        "\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else payload)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Client Error" if status < 500 else "Server Error"
