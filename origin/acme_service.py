"""The origin daemon's ACME service: the :class:`origin.acme.manager.AcmeManager`
in the parent process, wired to the edges (:meth:`OriginDaemon.broadcast_control`
through the workers), to the workers (the current certificates, for edges
that connect later), to the metrics and to the admin API:

- ``GET /acme``: the account and each certificate's state (``geoedge acme status``);
- ``POST /acme/renew`` (``?id=<certificate>``): renew now (``geoedge acme
  renew --force``), answered with the outcome of the attempt.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from geoedge.acme_wire import encode
from geoedge.cert_expiry import expiry_cells, utc
from geoedge.status_page import Cell, Row, Table
from origin.acme.broadcast import EdgeReply
from origin.acme.config import AcmeConfig
from origin.acme.manager import AcmeManager
from origin.edge_control import ControlBroadcast
from origin.metrics import ControlMetrics

__all__ = ["AcmeService"]

log = logging.getLogger("geoedge.origin.acme")

#: Failed attempts in a row from which GeoedgeAcmeRenewalFailing fires (after an
#: hour) and the status page shows the error as bad (deploy/monitoring/alerts.yml).
ALERT_FAILURES = 3

Messages = list[tuple[int, bytes]]


class AcmeService:
    def __init__(
        self,
        config: AcmeConfig,
        broadcast_control: Callable[[int, bytes, float], Awaitable[ControlBroadcast]],
        publish: Callable[[Messages], None],
        metrics: ControlMetrics,
    ) -> None:
        self._broadcast_control = broadcast_control
        self._publish = publish
        self._metrics = metrics
        #: The current certificates as CONTROL messages (workers forked later start with them).
        self.messages: Messages = []
        self.manager = AcmeManager(
            config,
            self._broadcast,
            on_certificates=self._on_certificates,
            on_change=self._on_change,
        )

    async def start(self) -> None:
        await self.manager.start()

    async def close(self) -> None:
        await self.manager.close()

    async def _broadcast(self, kind: int, body: bytes, timeout_s: float) -> list[EdgeReply]:
        result = await self._broadcast_control(kind, body, timeout_s)
        return [EdgeReply(o.edge_id, o.connection, o.status, o.reason) for o in result.outcomes]

    def _on_certificates(self, certificates: list[Any]) -> None:
        self.messages = [encode(message) for message in certificates]
        self._publish(self.messages)

    def _on_change(self, manager: AcmeManager) -> None:
        m = self._metrics
        for state in manager.states.values():
            cid = state.spec.id
            m.acme_failures.labels(cid).set(state.failures)
            if state.issued is not None:
                for name in state.issued.names:
                    m.acme_expiry.labels(cid, name).set(state.issued.not_after)
            if state.renew_at is not None:
                m.acme_renew_at.labels(cid).set(state.renew_at)
            counts: dict[str, int] = {}
            for status in state.edges.values():
                counts[status] = counts.get(status, 0) + 1
            for status in ("applied", "refused", "unknown_kind", "timeout", "lost", "not_sent"):
                m.acme_edges.labels(cid, status).set(counts.get(status, 0))

    # -- status page -------------------------------------------------------------------

    def table(self, now: float | None = None) -> Table:
        """The origin's status page rows: each configured certificate, when it
        expires, when it is due, what the edges said, and the last error."""
        now = time.time() if now is None else now
        rows = []
        for state in self.manager.states.values():
            issued = state.issued
            if issued is None:
                expires, left = Cell("not issued yet", "warn"), Cell("-")
            else:
                expires, left = expiry_cells(issued.not_after, now)
            edges = state.edges
            applied = sum(status == "applied" for status in edges.values())
            if state.last_error:
                error = Cell(
                    f"{state.failures} failed; next try {utc(state.next_try)}: {state.last_error}",
                    "bad" if state.failures >= ALERT_FAILURES else "warn",
                )
            else:
                error = Cell("")
            rows.append(
                Row(
                    [
                        Cell(state.spec.id),
                        Cell(", ".join(state.spec.domains)),
                        expires,
                        left,
                        Cell("now" if state.renew_at is None else utc(state.renew_at)),
                        Cell(
                            f"{applied}/{len(edges)}" if edges else "-",
                            "" if applied == len(edges) else "warn",
                        ),
                        Cell(state.ocsp_note or "-", "ok" if state.ocsp is not None else ""),
                        error,
                    ]
                )
            )
        return Table(
            "ACME certificates",
            [
                "id",
                "names",
                "expires",
                "left",
                "renewal due",
                "edges applied",
                "OCSP staple",
                "last error",
            ],
            rows,
            note=f"CA: {self.manager.config.directory}. Edges applied: of the edges connected"
            " when the certificate was last sent (an edge that connects later gets it at once)."
            " geoedge acme renew --force renews now.",
        )

    # -- admin ---------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/acme", self._status), web.post("/acme/renew", self._renew)]

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self.manager.status())

    async def _renew(self, request: web.Request) -> web.Response:
        certificate = request.query.get("id") or None
        try:
            outcome = await self.manager.renew(certificate)
        except KeyError:
            return web.json_response({"error": f"no certificate {certificate!r}"}, status=404)
        ok = all(not state["failures"] for state in outcome)
        return web.json_response({"renewed": outcome, "ok": ok}, status=200 if ok else 502)


def encode_for_pipe(messages: Messages) -> list[list[object]]:
    """The control pipe carries JSON: bodies in base64."""
    return [[kind, base64.b64encode(body).decode()] for kind, body in messages]
