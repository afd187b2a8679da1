"""What ``make wan`` measures, over which path, and the physical floor of each (pure: no I/O).

Three scenarios put the same Node.js app behind the same certificate and the
same TLS settings (TLS 1.2-1.3, Mozilla intermediate ciphers, ALPN http/1.1),
seen from the ``user`` namespace of :mod:`loadtests.wan.emulator`:

* ``direct``: HAProxy terminates TLS at the origin site and proxies to the app
  -- what a team runs without geoedge. The user's TCP and TLS handshakes cross
  the long link (user <-> origin).
* ``edge``: the geoedge edge terminates TLS near the user and carries the
  connection as one stream of its already-open tunnel to the origin balancer,
  which hands it to the app. Handshakes cross the short link (user <-> edge);
  each request crosses the long link (edge <-> origin) once.
* ``nginx``: the peer to beat: stock nginx on the edge host terminates TLS
  near the user and proxies each request over a pool of keep-alive TLS
  connections to HAProxy at the origin site (:mod:`loadtests.wan.nginx`).
  The same paths as ``edge``, so the same floors.

A scenario is one entry of :data:`SCENARIOS`; the runner, the report and the
chart take every entry, so adding one is adding an entry (and its process in
:mod:`loadtests.wan.stack`).

The floor
---------
A measurement's *physical floor* is the time the configured propagation delays
alone impose: no CPU, no queueing, no loss, windows assumed large enough.
Writing ``C`` for the round trip between the user and the TLS terminator,
``U`` for the terminator to the origin site (0 when they are the same host)
and ``B`` for the origin to the app, a request and its response cost
``R = C + U + B`` (the tunnel is already open, and a stream's first data
follows its OPEN frame without waiting: PROTOCOL.md, "open is 0-RTT"). Then:

* new connection + GET = TCP (``C``) + TLS (``C`` for 1.3, ``2 C`` for 1.2,
  no resumption) + ``R``;
* GET on an open keep-alive connection = ``R``;
* WebSocket open (connect start to the 101) = TCP + TLS + ``R`` (the upgrade
  request is one request); first echo on an open WebSocket = ``R``;
* the 768 KB response adds nothing: with unlimited link rate its
  transmission time is zero, and the floor assumes congestion and receive
  windows already allow it (a cold TCP connection's slow start does not,
  which is the point of the measurement);
* bursts, the first burst after a start and the 1 %-loss run have the floor
  of one new-connection GET: concurrency and loss add queueing and
  retransmissions, never propagation.

With the defaults (one-way user-edge 5 ms, edge-origin and user-origin 132.5
ms, origin-app 0.25 ms): direct TLS 1.3 new GET = 3 x 265 + 0.5 = 795.5 ms;
through the edge = 10 + 10 + (10 + 265 + 0.5) = 295.5 ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "MEASUREMENTS",
    "SCENARIOS",
    "Measurement",
    "PathRtts",
    "Scenario",
    "floor_ms",
    "handshake_round_trips",
    "path_rtts",
    "percentile",
    "summarize",
]

TlsVersion = Literal["1.2", "1.3"]
#: How a sample is taken (see :mod:`loadtests.wan.measure`).
Kind = Literal["new", "keepalive", "ws_open", "ws_echo", "page"]
#: One-way delays in ms per directed (source, destination) host pair.
OneWayDelays = Mapping[tuple[str, str], float]


@dataclass(frozen=True, slots=True)
class Scenario:
    """One way of reaching the app from the user."""

    name: str
    terminator: str
    """The emulator host that terminates the user's TLS."""
    upstream: str | None
    """The host the terminator forwards to across the WAN (None: the app is local)."""
    description: str
    port: int = 443
    """The HTTPS port the terminator listens on (the ``nginx`` edge shares the
    edge host with geoedge's)."""


SCENARIOS: dict[str, Scenario] = {
    "direct": Scenario(
        "direct", "origin", None, "HAProxy 2.6 terminates TLS at the origin site, no edge"
    ),
    "edge": Scenario(
        "edge", "edge", "origin", "geoedge edge near the user, tunnel to the origin balancer"
    ),
    "nginx": Scenario(
        "nginx",
        "edge",
        "origin",
        "nginx near the user, keep-alive TLS pool to HAProxy at the origin",
        port=8443,
    ),
}


@dataclass(frozen=True, slots=True)
class Measurement:
    """One row of the results: what is timed, and how its floor is counted."""

    key: str
    """The key in ``wan.json``."""
    title: str
    kind: Kind
    tls: TlsVersion
    """The version the client forces for the connection(s) it opens."""
    path: str
    """The app endpoint requested (``/`` small page, ``/large`` 768 KB)."""
    alpn: str = "http/1.1"
    """What the client offers first (``h2``: ``h2,http/1.1``, as a browser)."""
    rounds: int = 1
    """Request round trips one after the other in a sample (a page over six
    HTTP/1.1 connections: 30 / 6 = 5)."""
    slow_start_rounds: int = 0
    """Client-link round trips the response bodies add by TCP slow start: a page's
    30 responses of ~1 KB (the sample app's ``/``) are ~30 KB on one h2
    connection, over the ten-segment (14.6 KB) initial window: one more round."""
    cached: bool = False
    """Its responses are stored at the edge already (``Cache-Control: public``,
    loaded once before): through the edge a request costs the user's round
    trip alone. HAProxy at the origin site caches nothing: there the floor is
    the usual one."""

    @property
    def new_connection(self) -> bool:
        """Whether the timed interval includes TCP and TLS handshakes."""
        return self.kind in ("new", "ws_open", "page")


MEASUREMENTS: dict[str, Measurement] = {
    m.key: m
    for m in (
        Measurement("new_small_tls13", "new conn GET / (TLS 1.3)", "new", "1.3", "/"),
        Measurement("new_small_tls12", "new conn GET / (TLS 1.2)", "new", "1.2", "/"),
        Measurement("new_large_tls13", "new conn GET 768 KB (TLS 1.3)", "new", "1.3", "/large"),
        Measurement(
            "close_large_tls13", "768 KB, Connection: close (TLS 1.3)", "new", "1.3", "/large"
        ),
        Measurement(
            "close_large_tls12", "768 KB, Connection: close (TLS 1.2)", "new", "1.2", "/large"
        ),
        Measurement(
            "idle30_large_tls13", "768 KB after 30 s idle (TLS 1.3)", "new", "1.3", "/large"
        ),
        Measurement("keepalive_small", "GET / on keep-alive conn", "keepalive", "1.3", "/"),
        Measurement("ws_open_tls13", "WebSocket open to 101 (TLS 1.3)", "ws_open", "1.3", "/ws"),
        Measurement("ws_echo_tls13", "WebSocket first echo", "ws_echo", "1.3", "/ws"),
        Measurement("burst20_small_tls13", "20 new conns at once (TLS 1.3)", "new", "1.3", "/"),
        Measurement(
            "first_burst20_small_tls13", "first burst of 20 after start", "new", "1.3", "/"
        ),
        Measurement("loss1_small_tls13", "new conn GET / with 1% loss", "new", "1.3", "/"),
        Measurement(
            "first_large_tls13", "first 768 KB after start (TLS 1.3)", "new", "1.3", "/large"
        ),
        Measurement(
            "page30_tls13",
            "page of 30 GETs, h2 offered (TLS 1.3)",
            "page",
            "1.3",
            "/",
            "h2",
            slow_start_rounds=1,
        ),
        Measurement(
            "page30_h1_tls13",
            "page of 30 GETs, 6 HTTP/1.1 conns",
            "page",
            "1.3",
            "/",
            "http/1.1",
            rounds=5,
        ),
        # The edge's cache (issue 30): a second user's first view of a page
        # another user loaded, and the same page stale under stale-while-revalidate.
        Measurement(
            "page30_cached_tls13",
            "page of 30 cacheable GETs, 2nd user",
            "page",
            "1.3",
            "/?max_age=60",
            "h2",
            slow_start_rounds=1,
            cached=True,
        ),
        Measurement(
            "page30_swr_tls13",
            "page of 30 stale GETs (SWR)",
            "page",
            "1.3",
            "/?max_age=1&swr=600",
            "h2",
            slow_start_rounds=1,
            cached=True,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class PathRtts:
    """The round trips (ms) a request crosses in one scenario."""

    client_ms: float
    """User <-> the TLS terminator: every handshake round trip pays this."""
    upstream_ms: float
    """Terminator <-> origin site (the tunnel); 0 when the terminator is there."""
    backend_ms: float
    """Origin site <-> the app."""

    @property
    def request_ms(self) -> float:
        """One request and its response, end to end."""
        return self.client_ms + self.upstream_ms + self.backend_ms


def _rtt(delays: OneWayDelays, a: str, b: str) -> float:
    try:
        return float(delays[(a, b)]) + float(delays[(b, a)])
    except KeyError as exc:
        raise ValueError(f"no one-way delay configured for {exc.args[0]}") from None


def path_rtts(scenario: Scenario, delays: OneWayDelays) -> PathRtts:
    """The scenario's round trips from the emulator's configured one-way delays."""
    upstream = 0.0 if scenario.upstream is None else _rtt(delays, scenario.terminator, "origin")
    return PathRtts(
        client_ms=_rtt(delays, "user", scenario.terminator),
        upstream_ms=upstream,
        backend_ms=_rtt(delays, "origin", "app"),
    )


def handshake_round_trips(tls: TlsVersion) -> int:
    """Full TLS handshake round trips before the client may send a request."""
    if tls == "1.3":
        return 1
    if tls == "1.2":
        return 2
    raise ValueError(f"unknown TLS version {tls!r}")


def floor_ms(measurement: Measurement, rtts: PathRtts) -> float:
    """The physical floor of one sample (see the module docstring for the formulas)."""
    if not measurement.new_connection:
        return rtts.request_ms
    handshakes = 1 + handshake_round_trips(measurement.tls)  # TCP, then TLS
    client_rounds = handshakes + measurement.slow_start_rounds
    request = rtts.request_ms
    if measurement.cached and rtts.upstream_ms > 0:  # served by the edge's cache
        request = rtts.client_ms
    return client_rounds * rtts.client_ms + measurement.rounds * request


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between order
    statistics (numpy's default), so p50 of an even count is the midpoint."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples: Sequence[float], floor: float) -> dict[str, float | int | None]:
    """The ``wan.json`` object of one measurement (percentiles None without samples)."""

    def pick(q: float) -> float | None:
        return round(percentile(samples, q), 2) if samples else None

    return {
        "p50_ms": pick(50),
        "p90_ms": pick(90),
        "p99_ms": pick(99),
        "floor_ms": round(floor, 2),
        "n": len(samples),
    }


# --------------------------------------------------------------------------- set-up


@dataclass(frozen=True, slots=True)
class StackFiles:
    """Certificates and log locations the daemons' configurations point at."""

    ca: str
    server_cert: str
    """The certificate users see, served by both HAProxy and the edge."""
    server_key: str
    server_pem: str
    """Certificate and key concatenated, as HAProxy's ``crt`` wants them."""
    edge_cert: str
    edge_key: str
    origin_cert: str
    origin_key: str
    edge_access_log: str


#: The app's port in the ``app`` namespace; HTTPS on 443; tunnel and admin ports
#: are the daemons' documented defaults.
APP_PORT = 3000
HTTPS_PORT = 443
TUNNEL_PORT = 7443
EDGE_ADMIN = "127.0.0.1:9100"
ORIGIN_ADMIN = "127.0.0.1:9901"
EDGE_IDENTITY = "edge-wan"
ORIGIN_IDENTITY = "origin-wan"


def edge_toml(files: StackFiles, addresses: Mapping[str, str], *, workers: int = 0) -> str:
    """The edge's configuration: TLS 1.2-1.3 with the shared certificate, one tunnel pool
    to the origin balancer. Everything else is left at the shipped defaults."""
    origin = addresses["origin"]
    return f"""\
[edge]
id = "{EDGE_IDENTITY}"
workers = {workers}
drain_timeout_s = 1.0
access_log = "{files.edge_access_log}"

[[listeners]]
address = "{addresses["edge"]}:{HTTPS_PORT}"

[tls]
min_version = "TLSv1.2"
max_version = "TLSv1.3"
[[tls.certificates]]
cert = "{files.server_cert}"
key = "{files.server_key}"

[admin]
address = "{EDGE_ADMIN}"

[[origins]]
name = "origin"
[origins.tunnel]
address = "{origin}:{TUNNEL_PORT}"
server_name = "{origin}"
cert = "{files.edge_cert}"
key = "{files.edge_key}"
ca = "{files.ca}"

[cache]
enabled = true
shared_dir = "{Path(files.edge_access_log).parent / "cache-shared"}"
"""


def origin_toml(files: StackFiles, addresses: Mapping[str, str], *, workers: int = 0) -> str:
    """The origin balancer's configuration: the tunnel listener admitting our edge and
    one default pool holding the app."""
    return f"""\
[origin]
id = "{ORIGIN_IDENTITY}"
workers = {workers}
drain_timeout_s = 1.0
log_json = false

[tunnel_listener]
address = "{addresses["origin"]}:{TUNNEL_PORT}"
cert = "{files.origin_cert}"
key = "{files.origin_key}"
ca = "{files.ca}"
allowed_identities = ["{EDGE_IDENTITY}"]

[admin]
address = "{ORIGIN_ADMIN}"

[[pools]]
name = "app"
default = true
[pools.health]
path = "/health"
[[pools.backends]]
address = "{addresses["app"]}:{APP_PORT}"
"""


def haproxy_cfg(files: StackFiles, addresses: Mapping[str, str], ciphers: str) -> str:
    """HAProxy at the origin site: the direct scenario's TLS terminator.

    Same certificate, TLS 1.2-1.3, the edge's TLS 1.2 cipher list (TLS 1.3 suites
    are OpenSSL's defaults on both), ALPN http/1.1 only, session tickets on (the
    edge's default; the client never resumes anyway). No ``daemon``: it runs in
    the foreground (``-db``) so that it is stopped by its PID.
    """
    return f"""\
global
    ssl-default-bind-ciphers {ciphers}
    ssl-default-bind-options ssl-min-ver TLSv1.2 ssl-max-ver TLSv1.3
    maxconn 8000

defaults
    mode http
    option forwardfor
    timeout connect 5s
    timeout client 75s
    timeout server 75s
    timeout tunnel 1h

frontend https
    bind {addresses["origin"]}:{HTTPS_PORT} ssl crt {files.server_pem} alpn h2,http/1.1
    default_backend app

backend app
    server app1 {addresses["app"]}:{APP_PORT}
"""
