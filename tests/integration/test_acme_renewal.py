"""ACME certificates change under live traffic, and reach a new edge at once
(tests/acme_fleet_env.py has the layout: Pebble, one origin, real edges).

- A forced renewal (``geoedge acme renew --force --id``, which calls the
  origin's ``POST /acme/renew?id=``) while keep-alive clients and clients making a new TLS
  connection per request go through both edges to a Node.js backend: not
  one request fails, every keep-alive connection carries on across it, and
  every handshake begun after the renewal returned presents the new chain.
- An edge started after issuance, with an empty store, serves the issued
  chain within 1 s of its first tunnel connection coming up. Here the bound
  *is* the property: the issue asks for the certificate "at once", and a
  regression that delivered it at the next renewal, or on a periodic sync,
  would still pass a test that only waited for it. The bound is scaled
  (``GEOEDGE_TEST_TIMEOUT_SCALE``) like every wait in the suite; the figure
  is printed.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509

from tests.acme_fleet_env import (
    EDGES,
    WEB,
    WEB_CERTIFICATE,
    AcmeFleet,
    acme_fleet,
    handshake_serial,
    wait_until,
)
from tests.conftest import PkiFiles, scaled
from tests.edge_env import node_available

pytestmark = pytest.mark.skipif(not node_available(), reason="deploy/node-app not installed")

#: Each load client's bounds: requests, and seconds (scaled).
MAX_REQUESTS = 20_000
MAX_LOAD_S = 120.0


@dataclass
class Client:
    """One load client's record: what it sent, what failed, which serials it saw."""

    edge: str
    keep_alive: bool
    done: int = 0
    failures: list[str] = field(default_factory=list)
    #: (handshake start, handshake end, serial), one per connection.
    handshakes: list[tuple[float, float, int]] = field(default_factory=list)
    #: When each request completed.
    completed: list[float] = field(default_factory=list)


def load(fleet: AcmeFleet, client: Client, root: str, stop: threading.Event) -> None:
    """GET /health through ``client.edge`` until ``stop`` (or the bounds): one
    keep-alive connection for every request, or a new TLS connection each."""
    context = ssl.create_default_context(cadata=root)
    deadline = time.monotonic() + scaled(MAX_LOAD_S)
    address = fleet.address(client.edge)
    conn: http.client.HTTPConnection | None = None
    while not stop.is_set() and client.done < MAX_REQUESTS and time.monotonic() < deadline:
        try:
            if conn is None:
                conn = http.client.HTTPConnection(address, fleet.https, timeout=10)
                started = time.time()
                raw = socket.create_connection((address, fleet.https), timeout=10)
                try:
                    tls = context.wrap_socket(raw, server_hostname=WEB)  # SNI: the issued name
                except BaseException:
                    raw.close()
                    raise
                conn.sock = tls
                der = tls.getpeercert(binary_form=True)
                assert der is not None
                serial = x509.load_der_x509_certificate(der).serial_number
                client.handshakes.append((started, time.time(), serial))
            conn.request("GET", "/health", headers={"Host": WEB})
            response = conn.getresponse()
            body = response.read()
            if response.status != 200 or body != b"ok":
                client.failures.append(f"HTTP {response.status} {body[:60]!r}")
        except (OSError, http.client.HTTPException) as exc:
            client.failures.append(f"{type(exc).__name__}: {exc}")
            if conn is not None:
                conn.close()
            conn = None
            continue
        client.done += 1
        client.completed.append(time.time())
        if not client.keep_alive:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()


def test_a_forced_renewal_under_load_fails_no_request(test_pki: PkiFiles, tmp_path: Path) -> None:
    with acme_fleet(test_pki, tmp_path, node=True) as fleet:
        fleet.ca.point(WEB, "127.0.0.2")  # the CA validates through edge A
        for name in EDGES:
            fleet.start_edge(name)
        fleet.start_origin(WEB_CERTIFICATE)
        old_serial = fleet.wait_applied("web", ("a", "b"), 120)
        root = fleet.ca.root_pem()

        clients = [Client(edge, keep_alive) for edge in EDGES for keep_alive in (True, True, False)]
        stop = threading.Event()
        threads = [
            threading.Thread(target=load, args=(fleet, c, root, stop), daemon=True) for c in clients
        ]
        for thread in threads:
            thread.start()
        try:
            # Every client under way before the renewal begins.
            wait_until(lambda: all(c.done >= 20 for c in clients), 30, "load under way")
            renew_started = time.time()
            code, output = fleet.geoedge_acme(
                "renew", "--force", "--id", "web", "--json", "--admin", fleet.admin_address
            )
            renew_done = time.time()

            # Each client goes on after it: new connections see the new chain.
            def after_renewal() -> bool:
                return all(
                    sum(t > renew_done for t in c.completed) >= 20
                    and (c.keep_alive or sum(h[0] > renew_done for h in c.handshakes) >= 20)
                    for c in clients
                )

            wait_until(after_renewal, 60, "load after the renewal")
        finally:
            stop.set()
            for thread in threads:
                thread.join(scaled(20))

        total = sum(c.done for c in clients)
        failures = [f"{c.edge}: {f}" for c in clients for f in c.failures]
        print(
            f"\nrenewal took {renew_done - renew_started:.2f} s under load;"
            f" {total} requests through both edges, {len(failures)} failed"
        )
        assert failures == []
        assert code == 0, output
        outcome = json.loads(output)
        assert outcome["ok"], outcome
        new_serial = int(outcome["renewed"][0]["serial"], 16)
        assert new_serial != old_serial
        assert outcome["renewed"][0]["edges"] == {"edge-1": "applied", "edge-2": "applied"}
        for c in clients:
            during = [t for t in c.completed if renew_started <= t <= renew_done]
            if c.keep_alive:
                # One connection from before the renewal to after it, never dropped.
                assert len(c.handshakes) == 1, c.handshakes
                assert c.handshakes[0][2] == old_serial
                assert c.completed[0] < renew_started and c.completed[-1] > renew_done
            else:
                serials = {serial for started, _, serial in c.handshakes}
                assert serials <= {old_serial, new_serial}
                assert old_serial in serials and new_serial in serials
                # Every handshake begun once the renewal returned (every edge had
                # ACKed it) got the new certificate.
                late = [serial for started, _, serial in c.handshakes if started > renew_done]
                assert late and set(late) == {new_serial}, c.edge
            assert during, f"{c.edge}: no request completed during the renewal"
        for edge in EDGES:
            assert handshake_serial(fleet.address(edge), fleet.https, WEB, root) == new_serial


def test_an_edge_started_after_issuance_serves_the_certificate_within_a_second(
    test_pki: PkiFiles, tmp_path: Path
) -> None:
    with acme_fleet(test_pki, tmp_path) as fleet:
        fleet.ca.point(WEB, "127.0.0.2")
        fleet.start_edge("a")
        fleet.start_origin(WEB_CERTIFICATE)
        serial = fleet.wait_applied("web", ("a",), 120)
        root = fleet.ca.root_pem()

        # Edge B: a first start, an empty store. A client handshakes with it
        # from before it listens until it has presented the issued chain many
        # times in a row.
        results: list[tuple[float, bool]] = []  # (handshake end, presented the chain)
        stop = threading.Event()

        def handshakes() -> None:
            deadline = time.monotonic() + scaled(60)
            while not stop.is_set() and time.monotonic() < deadline and len(results) < 50_000:
                try:
                    ok = handshake_serial(fleet.address("b"), fleet.https, WEB, root, 2) == serial
                except (OSError, ssl.SSLError):
                    ok = False
                results.append((time.time(), ok))
                if not ok:
                    time.sleep(0.002)  # refused or no certificate yet: a short pause
                elif len(results) >= 30 and all(good for _, good in results[-30:]):
                    return

        client = threading.Thread(target=handshakes, daemon=True)
        client.start()
        fleet.start_edge("b")
        client.join(scaled(90))
        stop.set()
        assert results and results[-1][1], "edge B never presented the issued chain"
        assert fleet.certificate("web")["serial"] == f"{serial:x}"  # no renewal meanwhile

        up = fleet.tunnel_up_times("b")
        assert up, "edge B logged no tunnel connection coming up"
        tunnel_up = min(up)
        # From the last handshake that did not present the chain: from then on
        # every handshake did (with two workers, each must have it).
        last_bad = max((t for t, good in results if not good), default=tunnel_up)
        first_good = min(t for t, good in results if good)
        served_after = max(last_bad, first_good) - tunnel_up
        print(
            f"\nedge B: first tunnel up, then the issued chain served by every handshake"
            f" {served_after * 1000:.0f} ms later (first good handshake"
            f" {(first_good - tunnel_up) * 1000:.0f} ms; {len(results)} handshakes)"
        )
        assert served_after <= scaled(1.0)
