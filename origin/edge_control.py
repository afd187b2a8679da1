"""Telling every connected edge something over the tunnels, and learning which
edges applied it (PROTOCOL.md §5.14, IMPLEMENTATION.md §N11).

The origin's tunnel connections live in its workers; its admin API runs in the
parent. So a broadcast goes in two hops:

1. the parent (:class:`EdgeControl`) asks every worker through its control
   pipe (:meth:`geoedge.workers.Supervisor.request`, a ``tunnel_control``
   request) and waits up to the ACK timeout plus :data:`PIPE_SLACK_S`;
2. each worker (:func:`answer_request`) sends the message on each of its edge
   connections (:meth:`origin.edges.EdgeConnections.broadcast_control`) and
   answers with one :class:`ControlOutcome` per connection.

In process (``OriginDaemon(in_process=True)``) the first hop is a call.

The extension point: a feature that tells the edges something calls
``await daemon.broadcast_control(kind, body, timeout_s)``
(:meth:`origin.daemon.OriginDaemon.broadcast_control`, which is
:meth:`EdgeControl.broadcast`) from its own admin route or task, and reads the
:class:`ControlBroadcast`; the edges answer with the handlers their workers
registered (:mod:`tunnel.aio.control`). ``POST /tunnel/echo`` is such a route:
an ECHO to every edge connection, and who confirmed it.

A message is sent once per connection: an edge worker holds several
connections to the origin, so it receives (and must tolerate) the same message
once on each; every worker of every edge receives it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from geoedge.logs import log_event
from geoedge.worker_requests import TooManyRequests, WorkerAnswer
from tunnel.aio.connection import TunnelConnection
from tunnel.aio.errors import ControlLost, ControlSendError, ControlTimeout
from tunnel.mux import ControlKind, ControlStatus
from tunnel.mux.constants import MAX_CONTROL_REASON_BYTES

__all__ = [
    "ECHO_TIMEOUT_S",
    "MAX_TIMEOUT_S",
    "PIPE_SLACK_S",
    "ControlBroadcast",
    "ControlOutcome",
    "EdgeControl",
    "WorkerOutcomes",
    "answer_request",
    "send_to_edge",
]

log = logging.getLogger("geoedge.origin")

#: How long the admin process waits for its workers beyond the ACK timeout.
PIPE_SLACK_S = 2.0
#: The ACK timeout of ``POST /tunnel/echo`` unless ``timeout_s`` says otherwise.
ECHO_TIMEOUT_S = 5.0
#: The longest ACK timeout a broadcast may ask for.
MAX_TIMEOUT_S = 60.0
#: What a worker is asked to do (the ``op`` of its request).
OP = "tunnel_control"

_STATUS_NAMES = {status: status.name.lower() for status in ControlStatus}


@dataclass(frozen=True, slots=True)
class ControlOutcome:
    """What became of a message on one edge connection: ``status`` is
    ``applied``, ``refused`` or ``unknown_kind`` (the edge's ACK), ``timeout``
    (no ACK in time: an edge that predates CONTROL never answers), ``lost``
    (the connection ended first) or ``not_sent`` (too large for this edge)."""

    edge_id: str
    """The edge's identity, from its certificate (PROTOCOL.md §12)."""
    connection: str
    """The connection's peer address, ``host:port``."""
    status: str
    reason: str = ""

    @property
    def applied(self) -> bool:
        return self.status == "applied"

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ControlOutcome:
        return cls(
            str(data["edge_id"]), str(data["connection"]), str(data["status"]), str(data["reason"])
        )


async def send_to_edge(
    connection: TunnelConnection, kind: int, body: bytes, timeout_s: float
) -> ControlOutcome:
    """Send one message on ``connection`` and wait for its outcome; never raises
    for what the edge or the connection did."""
    peer = connection.info.peer_address
    label = f"{peer[0]}:{peer[1]}" if peer else "?"
    edge_id = connection.info.peer_identity
    try:
        reply = await connection.send_control(kind, body, timeout_s)
    except ControlTimeout:
        return ControlOutcome(edge_id, label, "timeout", f"no ACK within {timeout_s:g}s")
    except ControlLost as exc:
        return ControlOutcome(edge_id, label, "lost", str(exc))
    except ControlSendError as exc:
        return ControlOutcome(edge_id, label, "not_sent", str(exc))
    return ControlOutcome(edge_id, label, _STATUS_NAMES[reply.status], reply.reason)


# -- the worker's side of the pipe -------------------------------------------------------


def control_request(kind: int, body: bytes, timeout_s: float) -> dict[str, Any]:
    return {
        "op": OP,
        "kind": kind,
        "body": base64.b64encode(body).decode("ascii"),
        "timeout_s": timeout_s,
    }


BroadcastOnConnections = Callable[[int, bytes, float], Awaitable[list[ControlOutcome]]]


async def answer_request(
    message: Mapping[str, Any], broadcast: BroadcastOnConnections
) -> dict[str, Any]:
    """A worker's answer to the parent's ``tunnel_control`` request: the
    outcome on each of its edge connections. Raises ``ValueError`` for a
    request it does not understand (answered with the class name)."""
    if message.get("op") != OP:
        raise ValueError(f"unknown request {message.get('op')!r}")
    kind, timeout_s = message["kind"], message["timeout_s"]
    if not isinstance(kind, int) or not isinstance(timeout_s, int | float):
        raise ValueError("malformed tunnel_control request")
    try:
        body = base64.b64decode(message["body"], validate=True)
    except (binascii.Error, TypeError) as exc:
        raise ValueError("malformed tunnel_control body") from exc
    outcomes = await broadcast(kind, body, float(timeout_s))
    return {"outcomes": [outcome.to_json() for outcome in outcomes]}


# -- the parent's side -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerOutcomes:
    """One origin worker's part of a broadcast: an outcome per edge connection
    it holds, or ``error`` (``timeout``, ``exited``, ...) when it did not answer."""

    index: int
    pid: int
    outcomes: tuple[ControlOutcome, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ControlBroadcast:
    """Everything a broadcast learned: per origin worker, per edge connection."""

    kind: int
    timeout_s: float
    workers: tuple[WorkerOutcomes, ...]

    @property
    def outcomes(self) -> list[ControlOutcome]:
        return [outcome for worker in self.workers for outcome in worker.outcomes]

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.outcomes:
            counts[outcome.status] = counts.get(outcome.status, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": f"{self.kind:#06x}",
            "timeout_s": self.timeout_s,
            "counts": self.counts(),
            "outcomes": [
                {**outcome.to_json(), "origin_worker": worker.index}
                for worker in self.workers
                for outcome in worker.outcomes
            ],
            "origin_workers": [
                {
                    "index": worker.index,
                    "pid": worker.pid,
                    "answered": worker.error is None,
                    "error": worker.error,
                    "connections": len(worker.outcomes),
                }
                for worker in self.workers
            ],
        }


AskWorkers = Callable[[Mapping[str, Any], float], Awaitable[list[WorkerAnswer]]]


class EdgeControl:
    """The parent's broadcasts to the edges: through the workers
    (``ask_workers``, :meth:`geoedge.workers.Supervisor.request`), or straight
    to the connections of the one in-process worker (``local``)."""

    def __init__(
        self,
        *,
        ask_workers: AskWorkers | None = None,
        local: BroadcastOnConnections | None = None,
    ) -> None:
        self._ask_workers = ask_workers
        self._local = local

    async def broadcast(self, kind: int, body: bytes, timeout_s: float) -> ControlBroadcast:
        """Send a CONTROL message on every edge connection of every worker and
        gather the outcomes; ``timeout_s`` bounds the wait for each ACK. Raises
        ``TooManyRequests`` when too many broadcasts wait already."""
        if not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}]")
        workers: tuple[WorkerOutcomes, ...]
        if self._local is not None:
            outcomes = await self._local(kind, body, timeout_s)
            workers = (WorkerOutcomes(0, os.getpid(), tuple(outcomes)),)
        else:
            assert self._ask_workers is not None
            answers = await self._ask_workers(
                control_request(kind, body, timeout_s), timeout_s + PIPE_SLACK_S
            )
            workers = tuple(_worker_outcomes(answer) for answer in answers)
        result = ControlBroadcast(kind, timeout_s, workers)
        log_event(
            log,
            "info",
            "control message broadcast to the edges",
            kind=f"{kind:#06x}",
            counts=result.counts(),
            workers_unanswered=sum(1 for w in workers if w.error is not None),
        )
        return result

    # -- the admin API --------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/tunnel/echo", self._echo)]

    async def _echo(self, request: web.Request) -> web.Response:
        """``POST /tunnel/echo[?text=...&timeout_s=...]``: an ECHO to every edge
        connection; each outcome says whether that connection echoed the text."""
        text = request.query.get("text") or f"echo {os.urandom(6).hex()}"
        try:
            timeout_s = float(request.query.get("timeout_s", ECHO_TIMEOUT_S))
        except ValueError:
            return _bad_request("timeout_s must be a number")
        if not 0 < timeout_s <= MAX_TIMEOUT_S:
            return _bad_request(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}]")
        if len(text.encode()) > MAX_CONTROL_REASON_BYTES:
            return _bad_request(f"text must be at most {MAX_CONTROL_REASON_BYTES} octets")
        try:
            result = await self.broadcast(ControlKind.ECHO, text.encode(), timeout_s)
        except TooManyRequests as exc:
            return web.json_response({"error": str(exc)}, status=503)
        report = result.to_json()
        for outcome in report["outcomes"]:
            outcome["confirmed"] = outcome["status"] == "applied" and outcome["reason"] == text
        report["text"] = text
        report["confirmed"] = sum(1 for outcome in report["outcomes"] if outcome["confirmed"])
        return web.json_response(report)


def _worker_outcomes(answer: WorkerAnswer) -> WorkerOutcomes:
    if answer.result is None:
        return WorkerOutcomes(answer.index, answer.pid, error=answer.error)
    try:
        outcomes = tuple(ControlOutcome.from_json(o) for o in answer.result["outcomes"])
    except (KeyError, TypeError):
        return WorkerOutcomes(answer.index, answer.pid, error="malformed answer")
    return WorkerOutcomes(answer.index, answer.pid, outcomes)


def _bad_request(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


async def broadcast_on(
    connections: list[TunnelConnection], kind: int, body: bytes, timeout_s: float
) -> list[ControlOutcome]:
    """The outcome of one message on each of ``connections``, concurrently."""
    sends = (send_to_edge(c, kind, body, timeout_s) for c in connections)
    return list(await asyncio.gather(*sends))
