"""Sustained load from a distant region, for locust (run by ``make wan`` in the ``user`` namespace).

::

    GEOEDGE_WAN_CA=ca.pem locust -f loadtests/locustfile.py --headless -u 20 -r 10 -t 60s \\
        --csv loadtests/results/locust_edge --host https://198.18.2.2

Two kinds of user:

* :class:`FirstVisitUser` behaves like a browser on a first visit: a new TCP
  connection and a full TLS handshake (nothing to resume), the page, one
  subresource on the same connection, then the connection is dropped, so the
  next visit starts from scratch again. Its requests are named ``visit /``
  (connect + TLS + request) and ``visit /ip`` (keep-alive).
* :class:`WebSocketUser` connects to ``/ws`` (``WS open``: connect start to the
  101), exchanges ``MESSAGES`` messages a second apart (``WS echo``: one round
  trip each), holds the idle connection for ``HOLD_S`` and closes it.

``GEOEDGE_WAN_CA`` names the CA file that issued the server certificate (the
run makes a private one); without it the system's CAs are used. Proxy settings
in the environment are ignored: the targets are the emulator's own addresses.

The WebSocket client is ``websocket-client`` (what locust's own socket.io user
builds on; gevent makes its blocking socket cooperative).
"""

from __future__ import annotations

import os
import ssl
import time
from typing import Any

import websocket
from locust import HttpUser, User, between, task

CA = os.environ.get("GEOEDGE_WAN_CA") or None
MESSAGES = 5
HOLD_S = 5.0
MESSAGE = "geoedge locust echo"


class FirstVisitUser(HttpUser):
    """A browser's first visit: new connection, page plus a subresource, connection gone."""

    weight = 3
    wait_time = between(0.5, 1.5)

    def on_start(self) -> None:
        self.client.verify = CA or True
        self.client.trust_env = False

    @task
    def first_visit(self) -> None:
        self.client.get("/", name="visit /")
        self.client.get("/ip", name="visit /ip")
        self.client.close()  # drops the pooled connection: the next visit opens a new one


class WebSocketUser(User):
    """Connect, exchange a few messages, hold the connection idle, close."""

    weight = 1
    wait_time = between(0.5, 1.5)

    def _fire(self, name: str, start: float, length: int, exc: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type="WS",
            name=name,
            response_time=(time.perf_counter() - start) * 1000.0,
            response_length=length,
            exception=exc,
            context={},
        )

    def _connect(self) -> Any:
        url = (self.host or "").replace("https://", "wss://", 1).rstrip("/") + "/ws"
        sslopt: dict[str, Any] = {"cert_reqs": ssl.CERT_REQUIRED}
        if CA:
            sslopt["ca_certs"] = CA
        return websocket.create_connection(url, sslopt=sslopt, timeout=30, http_no_proxy=["*"])

    @task
    def session(self) -> None:
        start = time.perf_counter()
        try:
            ws = self._connect()
        except Exception as exc:
            self._fire("open", start, 0, exc)
            return
        self._fire("open", start, 0, None)
        try:
            for _ in range(MESSAGES):
                start = time.perf_counter()
                try:
                    ws.send(MESSAGE)
                    reply = ws.recv()
                    error = None if reply == MESSAGE else ValueError(f"echo returned {reply!r}")
                except Exception as exc:
                    self._fire("echo", start, 0, exc)
                    return
                self._fire("echo", start, len(MESSAGE), error)
                time.sleep(1.0)
            time.sleep(HOLD_S)
        finally:
            ws.close()
