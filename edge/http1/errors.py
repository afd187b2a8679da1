"""Typed errors of the HTTP/1.1 layer.

:class:`MessageRejected` is internal: the parsing helpers raise it and the two
readers turn it into an event (``RequestRejected`` / ``ResponseInvalid``) at
their boundary, so ``feed`` never raises on bad input (as in h11, where only
one exception type may escape the receive path; here none may).

:class:`Http1UsageError` is raised to the *caller* for local misuse (calling
``upgrade_accepted`` with no upgrade pending): a bug in the adapter, not in
the peer's bytes.
"""

from __future__ import annotations


class Http1Error(Exception):
    """Base of every error the HTTP/1.1 layer raises."""


class MessageRejected(Http1Error):
    """The peer's bytes broke HTTP/1.1; ``status`` is the answer to send the client."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class Http1UsageError(Http1Error):
    """A reader method was called in a state where it makes no sense."""
