"""What an exchange does when its stream fails, and how a stream ends: pure decisions.

An exchange is one request and its tunnel stream (:mod:`edge.exchange`). When
the stream breaks, the honest answer depends only on a few facts, so the
choice is a function of them (STYLE.md §11), tested without sockets:

=====================================  ==================  ==================
fault                                  nothing sent yet    response started
=====================================  ==================  ==================
RESET REFUSED_STREAM (never processed)  resend, else 502   (n/a)
RESET NO_BACKEND (origin: no backend)  503 ``no_backend``  close
RESET TIMEOUT (origin's deadline)      504                 close
other RESET (origin or tunnel died)    replay, else 502    close
backend closed before any byte         replay, else 502    (n/a)
backend closed mid-response            (n/a)               close
invalid response, bad 101              502                 close
edge's response deadline               504                 close
no tunnel within ``tunnel_wait_s``     503 ``no_tunnel``   (n/a)
=====================================  ==================  ==================

"Resend" means: the origin refused the stream unprocessed (its GOAWAY, a
reload or stop: PROTOCOL.md §6.6), so a bodiless request goes again on another
connection, or waits for one as a new request does, without using up its
replay, up to :data:`MAX_RESENDS` times. "Replay" means: the request is
bodiless and idempotent (RFC 9110 §9.2.2),
was not replayed before, and the fault says the origin failed rather than
decided (NO_BACKEND and TIMEOUT are decisions: replaying a request to a hung
backend would hang a second one). "Close" means the client sees a cut it can
tell from an end (HTTP/1.1: the connection is closed without close_notify;
HTTP/2: RST_STREAM). The outcome names go to the access log.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tunnel.mux import ErrorCode


class Fault(enum.Enum):
    RESET = "upstream_reset"
    BACKEND_CLOSED = "upstream_closed"
    INVALID = "upstream_invalid"
    TIMEOUT = "upstream_timeout"
    NO_TUNNEL = "no_tunnel"


#: How often one request is sent again after a refusal (PROTOCOL.md §6.6).
MAX_RESENDS = 3


class Step(enum.Enum):
    RESEND = "resend"
    """The stream was refused unprocessed: the same request on another connection."""
    REPLAY = "replay"
    ANSWER = "answer"
    """Write an error response with ``status`` (nothing of a response went out)."""
    CLOSE = "close"
    """Cut the response short where the client can tell."""


@dataclass(frozen=True, slots=True)
class Action:
    step: Step
    status: int
    outcome: str


def on_fault(
    fault: Fault,
    *,
    code: int | None = None,
    answered: bool,
    replayable: bool,
    resendable: bool = False,
) -> Action:
    """The action for ``fault`` (``code``: the RESET's error code).

    ``answered``: some of the response already went to the client.
    ``replayable``: bodiless, idempotent, not replayed before.
    ``resendable``: bodiless, not resent :data:`MAX_RESENDS` times yet."""
    outcome = fault.value
    status = 502
    if fault is Fault.RESET and code == ErrorCode.REFUSED_STREAM and resendable and not answered:
        return Action(Step.RESEND, status, outcome)
    if fault is Fault.RESET and code == ErrorCode.NO_BACKEND:
        outcome, status = "no_backend", 503
    elif (fault is Fault.RESET and code == ErrorCode.TIMEOUT) or fault is Fault.TIMEOUT:
        outcome, status = Fault.TIMEOUT.value, 504
    elif fault is Fault.NO_TUNNEL:
        status = 503
    if answered:
        return Action(Step.CLOSE, status, outcome)
    decided = outcome in ("no_backend", Fault.TIMEOUT.value, Fault.INVALID.value, "no_tunnel")
    if replayable and not decided:
        return Action(Step.REPLAY, status, outcome)
    return Action(Step.ANSWER, status, outcome)


# Not read off the class per request (``EnumType.__getattr__``'s slot, tunnel.mux.stream).
_IDLE = ErrorCode.IDLE
_CANCEL = ErrorCode.CANCEL


def end_code(*, request_whole: bool, at_boundary: bool, queued_up: int) -> int:
    """How a finished request stream ends (PROTOCOL.md §6.5.1, §6.7): IDLE when
    the backend connection can serve another request — the request went up
    whole and nothing of it is still queued, the response was complete and
    kept the connection alive, no further byte arrived — else CANCEL."""
    if request_whole and at_boundary and queued_up == 0:
        return _IDLE
    return _CANCEL
