"""``POST /cache/purge`` on the origin's admin API: one purge, every edge.

The body is the purge an edge's own admin API takes (:mod:`geoedge.cache_purge`:
``url``, ``prefix``, ``tag`` or ``all``); the origin sends it as a
CACHE_PURGE CONTROL message (PROTOCOL.md §5.14) on every tunnel connection
of every connected edge (:meth:`origin.daemon.OriginDaemon.broadcast_control`)
and answers, per edge, how many of its connections confirmed it. An edge
worker receives the message once on each of its connections and purges each
time (a purge is idempotent), so every worker of every edge has purged once
any one of its connections confirmed; an edge too old to know CONTROL never
answers and is reported ``unconfirmed`` after ``timeout_s``.

Answer (200)::

    {"purge": {"tag": ["product-42"]}, "complete": true,
     "edges": {"tokyo-1": {"connections": 4, "applied": 4, "other": {}}},
     "unconfirmed": [], "outcomes": [...]}
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from geoedge.cache_purge import PURGE_KIND, PurgeError, parse_purge
from geoedge.worker_requests import TooManyRequests
from origin.edge_control import MAX_TIMEOUT_S, ControlBroadcast

__all__ = ["PURGE_TIMEOUT_S", "routes", "summarize"]

PURGE_TIMEOUT_S = 5.0
"""How long each edge connection has to confirm, unless ``?timeout_s=`` says otherwise."""

Broadcast = Callable[[int, bytes, float], Awaitable[ControlBroadcast]]


def summarize(result: ControlBroadcast) -> dict[str, Any]:
    """Per edge: its connections, how many applied the purge, the other outcomes."""
    edges: dict[str, dict[str, Any]] = {}
    for outcome in result.outcomes:
        edge = edges.setdefault(outcome.edge_id, {"connections": 0, "applied": 0, "other": {}})
        edge["connections"] += 1
        if outcome.applied:
            edge["applied"] += 1
        else:
            edge["other"][outcome.status] = edge["other"].get(outcome.status, 0) + 1
    unconfirmed = sorted(name for name, edge in edges.items() if edge["applied"] == 0)
    return {
        "complete": bool(edges) and all(e["applied"] == e["connections"] for e in edges.values()),
        "edges": edges,
        "unconfirmed": unconfirmed,
    }


def routes(broadcast: Broadcast) -> list[web.RouteDef]:
    async def purge(request: web.Request) -> web.Response:
        try:
            wanted = parse_purge(await request.read())
            timeout_s = float(request.query.get("timeout_s", PURGE_TIMEOUT_S))
        except (PurgeError, ValueError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if not 0 < timeout_s <= MAX_TIMEOUT_S:
            return web.json_response(
                {"error": f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}]"}, status=400
            )
        try:
            result = await broadcast(PURGE_KIND, wanted.encode(), timeout_s)
        except TooManyRequests as exc:
            return web.json_response({"error": str(exc)}, status=503)
        report = {"purge": wanted.as_json(), **summarize(result)}
        report["outcomes"] = result.to_json()["outcomes"]
        return web.json_response(report)

    return [web.post("/cache/purge", purge)]
