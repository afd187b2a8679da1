"""The pure decisions of an exchange (edge.exchange_rules) and HTTP/2 translation."""

from __future__ import annotations

import pytest

from edge.exchange_rules import Action, Fault, Step, end_code, on_fault
from edge.h2_translate import response_fields, translate_request
from tunnel.mux import ErrorCode

R = ErrorCode


@pytest.mark.parametrize(
    ("fault", "code", "answered", "replayable", "action"),
    [
        (Fault.RESET, R.UPSTREAM_RESET, False, True, Action(Step.REPLAY, 502, "upstream_reset")),
        (Fault.RESET, R.UPSTREAM_RESET, False, False, Action(Step.ANSWER, 502, "upstream_reset")),
        (Fault.RESET, R.CANCEL, True, True, Action(Step.CLOSE, 502, "upstream_reset")),
        (Fault.RESET, R.NO_BACKEND, False, True, Action(Step.ANSWER, 503, "no_backend")),
        (Fault.RESET, R.TIMEOUT, False, True, Action(Step.ANSWER, 504, "upstream_timeout")),
        (Fault.BACKEND_CLOSED, None, False, True, Action(Step.REPLAY, 502, "upstream_closed")),
        (Fault.BACKEND_CLOSED, None, True, False, Action(Step.CLOSE, 502, "upstream_closed")),
        (Fault.INVALID, None, False, True, Action(Step.ANSWER, 502, "upstream_invalid")),
        (Fault.TIMEOUT, None, False, True, Action(Step.ANSWER, 504, "upstream_timeout")),
        (Fault.TIMEOUT, None, True, True, Action(Step.CLOSE, 504, "upstream_timeout")),
        (Fault.NO_TUNNEL, None, False, True, Action(Step.ANSWER, 503, "no_tunnel")),
    ],
)
def test_on_fault(fault: Fault, code: int | None, answered: bool, replayable: bool,
                  action: Action) -> None:  # fmt: skip
    assert on_fault(fault, code=code, answered=answered, replayable=replayable) == action


@pytest.mark.parametrize("replayable", [True, False])
def test_a_refused_stream_is_resent_whatever_the_replay_budget(replayable: bool) -> None:
    """REFUSED_STREAM: never processed (PROTOCOL.md §6.6, an origin going away),
    so the request goes again without spending its one replay."""
    resend = on_fault(
        Fault.RESET, code=R.REFUSED_STREAM, answered=False, replayable=replayable, resendable=True
    )
    assert resend == Action(Step.RESEND, 502, "upstream_reset")
    spent = on_fault(
        Fault.RESET, code=R.REFUSED_STREAM, answered=False, replayable=replayable, resendable=False
    )
    assert spent.step is (Step.REPLAY if replayable else Step.ANSWER)
    # Other resets are not refusals: the replay rules hold.
    other = on_fault(Fault.RESET, code=R.CANCEL, answered=False, replayable=False, resendable=True)
    assert other.step is Step.ANSWER


@pytest.mark.parametrize(
    ("whole", "boundary", "queued", "code"),
    [
        (True, True, 0, R.IDLE),
        (False, True, 0, R.CANCEL),
        (True, False, 0, R.CANCEL),
        (True, True, 5, R.CANCEL),
    ],
)
def test_end_code(whole: bool, boundary: bool, queued: int, code: int) -> None:
    assert end_code(request_whole=whole, at_boundary=boundary, queued_up=queued) == code


def test_an_h2_request_becomes_http11_with_host_cookies_and_framing() -> None:
    fields = [
        (b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"app.test"),
        (b":path", b"/p?q=1"), (b"cookie", b"a=1"), (b"cookie", b"b=2"), (b"host", b"other"),
        (b"te", b"trailers"), (b"x-a", b"1"),
    ]  # fmt: skip
    request = translate_request(fields, ends_stream=False)
    assert request.head == (
        b"POST /p?q=1 HTTP/1.1\r\nhost: app.test\r\ncookie: a=1; b=2\r\nx-a: 1\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    assert request.chunked and not request.websocket
    with_length = translate_request([*fields, (b"content-length", b"3")], ends_stream=False)
    assert not with_length.chunked and b"transfer-encoding" not in with_length.head
    bodiless = translate_request(fields, ends_stream=True)
    assert not bodiless.chunked


def test_a_host_field_without_authority_is_the_requests_host() -> None:
    fields = [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/"), (b"host", b"a.test")]
    assert translate_request(fields, ends_stream=True).head == (
        b"GET / HTTP/1.1\r\nhost: a.test\r\n\r\n"
    )


def test_an_extended_connect_becomes_a_websocket_handshake() -> None:
    fields = [
        (b":method", b"CONNECT"), (b":protocol", b"websocket"), (b":scheme", b"https"),
        (b":authority", b"app.test"), (b":path", b"/ws"), (b"sec-websocket-version", b"13"),
    ]  # fmt: skip
    request = translate_request(fields, ends_stream=False, key=b"dGhlIHNhbXBsZSBub25jZQ==")
    assert request.websocket and not request.chunked
    assert request.head.startswith(b"GET /ws HTTP/1.1\r\nhost: app.test\r\n")
    assert b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n" in request.head
    assert request.head.count(b"sec-websocket-version") == 1


def test_response_fields_drop_what_http2_forbids() -> None:
    headers = ((b"connection", b"keep-alive"), (b"keep-alive", b"timeout=5"),
               (b"transfer-encoding", b"chunked"), (b"content-type", b"text/plain"))  # fmt: skip
    assert response_fields(200, headers, extra=b"Strict-Transport-Security: max-age=60") == [
        (b":status", b"200"),
        (b"strict-transport-security", b"max-age=60"),
        (b"content-type", b"text/plain"),
    ]
    ws = response_fields(101, ((b"sec-websocket-accept", b"x"), (b"upgrade", b"websocket")),
                         websocket=True)  # fmt: skip
    assert ws == [(b":status", b"200")]
