"""The pure decisions behind the edge's deadlines and admission."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from edge.admission import ConnectionAdmission, Refusal, RequestRate
from edge.deadlines import Deadlines, Missed, Phase, expired

DEADLINES = Deadlines(
    header_s=10, keepalive_s=75, body_s=30, first_byte_s=60, between_bytes_s=20,
    tunnel_idle_s=3600, long_poll_prefixes=("/poll",),
)  # fmt: skip


@dataclass
class Clock:
    phase: Phase
    phase_since: float = 0.0
    client_active_at: float = 0.0
    upstream_active_at: float = 0.0
    response_started: bool = False
    response_paused: bool = False
    awaited_path: str = "/"


@pytest.mark.parametrize(
    ("clock", "now", "missed"),
    [
        (Clock(Phase.HEAD, phase_since=0, client_active_at=9.5), 9.5, None),
        (Clock(Phase.HEAD, phase_since=0, client_active_at=10.9), 10.9 + 0.2, Missed.HEADER),
        (Clock(Phase.IDLE), 75.1, Missed.KEEPALIVE),
        (Clock(Phase.IDLE), 74.9, None),
        (Clock(Phase.SENDING, phase_since=0, client_active_at=50), 79, None),
        (Clock(Phase.SENDING, client_active_at=50), 80.1, Missed.BODY),
        (Clock(Phase.WAITING, upstream_active_at=100), 159.9, None),
        (Clock(Phase.WAITING, upstream_active_at=100), 160.1, Missed.RESPONSE),
        # Once the response has started, the silence allowed between its octets.
        (Clock(Phase.WAITING, upstream_active_at=100, response_started=True), 119.9, None),
        (
            Clock(Phase.WAITING, upstream_active_at=100, response_started=True),
            120.1,
            Missed.RESPONSE,
        ),
        (Clock(Phase.WAITING, upstream_active_at=100, response_paused=True), 900, None),
        (Clock(Phase.WAITING, awaited_path="/poll?x"), 3000, None),
        (Clock(Phase.WAITING, awaited_path="/poll?x"), 3600.1, Missed.RESPONSE),
        (Clock(Phase.WAITING, awaited_path="/poll?x", response_started=True), 3000, None),
        (Clock(Phase.TUNNEL, client_active_at=5, upstream_active_at=3000), 3700, None),
        (Clock(Phase.TUNNEL, client_active_at=5, upstream_active_at=6), 3606.1, Missed.TUNNEL_IDLE),
    ],
)
def test_expired(clock: Clock, now: float, missed: Missed | None) -> None:
    assert expired(clock, DEADLINES, now) is missed


def test_the_header_deadline_is_absolute_however_often_bytes_arrive() -> None:
    clock = Clock(Phase.HEAD, phase_since=0.0)
    for second in range(1, 12):
        clock.client_active_at = float(second)  # a byte every second
        missed = expired(clock, DEADLINES, float(second))
        assert missed is (Missed.HEADER if second > 10 else None)


def test_admission_caps_per_client_and_in_all() -> None:
    admission = ConnectionAdmission(max_connections=4, max_per_client=2)
    assert admission.admit("a") is None and admission.admit("a") is None
    assert admission.admit("a") is Refusal.MAX_CONNECTIONS_PER_CLIENT
    assert admission.admit("b") is None and admission.admit("b") is None
    assert admission.admit("c") is Refusal.MAX_CONNECTIONS
    assert admission.open_connections == 4
    admission.release("a")
    assert admission.held_by("a") == 1 and admission.admit("c") is None
    for ip in ("a", "b", "b", "c"):
        admission.release(ip)
    assert admission.open_connections == 0 and admission.held_by("b") == 0


def test_request_rate_is_a_token_bucket_per_client() -> None:
    rate = RequestRate(rate=2.0, burst=3)
    assert [rate.allow("a", 0.0) for _ in range(4)] == [True, True, True, False]
    assert rate.allow("b", 0.0)  # its own bucket
    assert rate.allow("a", 0.5) and not rate.allow("a", 0.5)  # one token per 0.5 s
    assert RequestRate(rate=0.0, burst=1).allow("a", 0.0)  # off


def test_request_rate_forgets_the_least_recent_client_first() -> None:
    rate = RequestRate(rate=1.0, burst=1, max_clients=2)
    assert rate.allow("a", 0.0) and rate.allow("b", 0.0) and rate.allow("c", 0.0)
    assert rate.allow("a", 0.0)  # "a" was forgotten: a full bucket again
    assert not rate.allow("c", 0.0)
