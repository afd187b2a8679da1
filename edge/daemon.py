"""The edge daemon's parent process: listening sockets, workers, admin, systemd.

Start-up, in this order (the order is the point):

1. multiprocess metrics on (a fresh ``PROMETHEUS_MULTIPROC_DIR``), before any
   metric exists or a worker forks;
2. take the listening sockets systemd passed (socket activation) and bind the
   rest, so every worker forked later shares them, as it shares the TLS
   contexts :func:`edge.__main__.preflight` built;
3. the admin listener; 4. fork the workers (:mod:`edge.worker`).

Admin health, two questions (:mod:`geoedge.admin`): ``/livez`` is 200 while a
worker runs and the listening sockets are open, whatever the origins do (only
this replaces a host); ``/readyz`` (and ``/healthz``) is 200 while some worker
has a usable tunnel and no drain has begun (this sends users). The traffic
listeners answer ``[http] readiness_path`` themselves, per worker, for load
balancers that can reach only them (edge/front_h1_requests.py).

Signals: SIGTERM/SIGINT drain (``/readyz`` answers 503 from then on; stop
accepting, finish in-flight requests up to ``drain_timeout_s``, GOAWAY the
tunnels) and exit; SIGHUP (or ``--reload PID``, the unit's ``ExecReload=``)
reloads in place: config, certificates and code (:mod:`geoedge.reload`: a
checked config, a re-exec, new workers that take over once their tunnels are
warm); SIGUSR1 reopens the access log (logrotate's postrotate); SIGUSR2 makes
every worker log a memory report (:mod:`geoedge.memory`).

Readiness: a worker is ready once a tunnel to some origin is up and warm
(:meth:`edge.worker.EdgeWorker.wait_warm`). At a start, ``/readyz`` and
systemd's READY=1 wait for every worker to be ready (a burst of clients right
after then finds every worker warm, not one still padding its tunnel), or for
:data:`READY_TIMEOUT_S`: an edge whose origin is down still starts. A worker
that takes over from others (a reload, a restart while siblings serve)
accepts no client before it is ready.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import socket

import uvloop
from aiohttp import web

from edge.acme_status import HeldCertificates
from edge.config import EdgeConfig, ListenerConfig
from edge.h2_engine import engine_description, resolve_engine
from edge.status import EdgeStatus
from edge.tls import CertificateStore
from edge.worker import EdgeWorker
from geoedge.admin import AdminServer, HealthReport
from geoedge.cache_purge import PurgeError, parse_purge
from geoedge.cert_expiry import CertificateWatch, WatchedFile, tunnel_files
from geoedge.listening import Listening, take_listeners
from geoedge.memory import MemoryKeeper, tune_gc
from geoedge.metrics import (
    cleanup_multiprocess,
    merged_families,
    merged_registry,
    process_exited,
)
from geoedge.preflight import ListenError
from geoedge.reexec import Inheritance
from geoedge.reload import (
    Reloader,
    handover_record,
    held_sockets,
    inherited_admin_and_reload,
    start_metrics,
)
from geoedge.status_window import MetricsWindow
from geoedge.systemd import ServiceNotifier
from geoedge.version import running_version, version_line
from geoedge.worker_requests import TooManyRequests
from geoedge.workers import Supervisor, WorkerContext, listen_control, report_ready

__all__ = ["READY_TIMEOUT_S", "EdgeDaemon", "Sockets", "bind_sockets"]

log = logging.getLogger("geoedge.edge")

#: At a start, READY=1 (and /healthz) once every worker is ready, or after this
#: long (the edge serves anyway: requests wait tunnel_wait_s, then 503), so that
#: a start does not fail, or a restart hang, while an origin is down. A reload
#: whose new workers are not ready after this long is reported as failed (the
#: old workers serve on until they are).
READY_TIMEOUT_S = 30.0
#: Grace after the drain deadline before the parent SIGKILLs a worker.
KILL_GRACE_S = 5.0

#: Each listening socket with its listener (``None``: the HTTP-to-HTTPS redirect).
Sockets = list[tuple[ListenerConfig | None, socket.socket]]


def bind_sockets(
    config: EdgeConfig, inheritance: Inheritance | None = None
) -> tuple[Sockets, Listening]:
    """The listening sockets: those the supervisor's previous image held (a
    reload), or those systemd passed, matched to the listeners by address; the
    rest bound here."""
    wanted: list[tuple[ListenerConfig | None, str, str]] = [
        (listener, "[[listeners]] address", listener.address) for listener in config.listeners
    ]
    if config.redirect is not None:
        wanted.append((None, "[redirect] address", config.redirect.address))
    listening = take_listeners([(setting, address) for _, setting, address in wanted], inheritance)
    sockets = [
        (listener, sock) for (listener, _, _), sock in zip(wanted, listening.sockets, strict=True)
    ]
    return sockets, listening


#: How long ``POST /cache/purge`` waits for every worker's answer.
PURGE_WAIT_S = 5.0


class EdgeDaemon:
    """The parent: it binds, forks and supervises the workers, answers the admin
    listener and speaks to systemd; it serves no client itself."""

    def __init__(
        self,
        config: EdgeConfig,
        certificates: CertificateStore,
        *,
        notifier: ServiceNotifier | None = None,
        inheritance: Inheritance | None = None,
    ) -> None:
        """``inheritance``: what the supervisor's previous image passed on (this
        process is the exec of a reload, :mod:`geoedge.reexec`)."""
        self.config = config
        self.certificates = certificates
        # Takes NOTIFY_SOCKET now, before any fork: the workers do not speak to systemd.
        self.notifier = notifier if notifier is not None else ServiceNotifier()
        self.inheritance = inheritance
        self.sockets: Sockets = []
        self._listening = Listening([], [])
        self.supervisor: Supervisor | None = None
        self.admin: AdminServer | None = None
        self.reloader = Reloader(
            notifier=self.notifier,
            handover=self._handover,
            takeover_timeout_s=READY_TIMEOUT_S,
            inheritance=inheritance,
            describe=self._describe,
            held=lambda: held_sockets(self._listening, self.admin),
            admin=lambda: self.admin,
        )
        self._metrics_dir: str | None = None
        #: Clients may be sent here: a reload's older workers serve, or every
        #: worker was ready once, or READY_TIMEOUT_S passed since the start.
        self._serving = inheritance is not None

    # -- parent ------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until stopped (SIGTERM/SIGINT, or :meth:`stop`); the exit status.
        Raises :class:`ListenError` when an address cannot be bound."""
        metrics_dir = start_metrics(self.inheritance)
        self._metrics_dir = str(metrics_dir)
        try:
            await self._run()
        finally:
            cleanup_multiprocess(metrics_dir)
        return 0

    async def _run(self) -> None:
        config = self.config
        inherited = self.inheritance
        if any("h2" in listener.alpn for listener in config.listeners):
            # Imported here, before any fork, not at a worker's first h2 client:
            # a worker must run the code its supervisor loaded, even after a
            # pip install that the next reload has yet to take in.
            importlib.import_module("edge.front_h2")
        self.sockets, self._listening = bind_sockets(config, inherited)
        supervisor = self.supervisor = Supervisor(
            self._worker_main,
            workers=config.edge.workers,
            stop_timeout_s=config.edge.drain_timeout_s + KILL_GRACE_S,
            on_reload=self.reloader.request,
            on_worker_exit=lambda pid, status: process_exited(pid),
            parent_fds=self._parent_fds,
            on_stopping=self._stopping,
            on_generation_ready=self._generation_ready,
            adopted=inherited.workers if inherited is not None else (),
        )
        acme = self.certificates.acme
        held = None if acme is None else HeldCertificates(acme.store.directory)
        certificates = edge_certificates(config, held)
        self.admin = AdminServer(
            config.admin.address,
            health=self.health,
            liveness=self.liveness,
            status=EdgeStatus(
                config,
                MetricsWindow(merged_families),
                supervisor.statistics,
                certificates,
                acme=held,
            ),
            collectors=[certificates],
            routes=[web.post("/cache/purge", self._purge)],
        )
        try:
            admin_sock, control_sock = inherited_admin_and_reload(inherited)
            try:
                await self.admin.start(admin_sock)
            except OSError as exc:
                raise ListenError("[admin] address", config.admin.address, exc) from None
            self.reloader.start(control_sock)
            log.info(
                "edge %s %s %s with %d worker(s), HTTP/2 on %s, geoedge %s",
                config.edge.id,
                "reloaded: serving" if inherited is not None else "serving",
                ", ".join(x.address for x in config.listeners),
                supervisor.target,
                engine_description(resolve_engine(config.http.h2_engine)),
                version_line(),
            )
            loop = asyncio.get_running_loop()
            if not self._serving:
                loop.call_later(READY_TIMEOUT_S, self._serve_anyway)
            systemd = loop.create_task(
                self.notifier.run(
                    self._service_state,
                    ready_timeout_s=READY_TIMEOUT_S,
                    alive=lambda: supervisor.statistics().running > 0,
                )
            )
            try:
                await supervisor.run()
            finally:
                systemd.cancel()
                self.reloader.close()
                self.notifier.close()
        finally:
            await self.admin.close()
            self._listening.close()

    def stop(self) -> None:
        """Begin the graceful stop (what SIGTERM does)."""
        if self.supervisor is not None:
            self.supervisor.stop()

    def request_reload(self) -> bool:
        """What SIGHUP does: reload in place (:mod:`geoedge.reload`)."""
        return self.reloader.request()

    def _stopping(self) -> None:
        assert self.supervisor is not None
        self.notifier.stopping(f"draining {self.supervisor.running} worker(s)")
        self.reloader.close()

    def _generation_ready(self) -> None:
        if not self._serving:
            log.info("every worker has a warm tunnel: serving")
        self._serving = True
        self.reloader.generation_ready()

    def _serve_anyway(self) -> None:
        if not self._serving:
            log.warning(
                "not every worker has a warm tunnel after %g s: serving anyway", READY_TIMEOUT_S
            )
            self._serving = True

    def _describe(self) -> str:
        assert self.supervisor is not None
        engine = engine_description(resolve_engine(self.config.http.h2_engine))
        return (
            f"version {running_version()}, HTTP/2 on {engine}, "
            f"{self.supervisor.target} new worker(s) serving"
        )

    def _handover(self, replies: list[int], requested_at: float) -> Inheritance:
        return handover_record(
            listening=self._listening,
            admin=self.admin,
            reloader=self.reloader,
            supervisor=self.supervisor,
            metrics_dir=self._metrics_dir,
            replies=replies,
            requested_at=requested_at,
        )

    def _parent_fds(self) -> list[int]:
        fd = self.admin.fileno() if self.admin is not None else None
        return ([fd] if fd is not None else []) + self.reloader.fds()

    def _service_state(self) -> tuple[bool, bool, str]:
        """(ready, stopping, STATUS=) for systemd: ready once every worker is
        (:meth:`_generation_ready`)."""
        assert self.supervisor is not None
        stats = self.supervisor.statistics()
        up = [name for name, count in tunnels_up().items() if count > 0]
        down = sorted({origin.name for origin in self.config.origins} - set(up))
        if stats.stopping:
            return bool(up), True, f"draining {stats.running} worker(s)"
        text = (
            f"{stats.running}/{stats.target} workers ({stats.ready} ready); "
            f"tunnels up: {', '.join(up) or 'none'}"
        )
        if down:
            text += f"; waiting for {', '.join(down)}"
        if stats.previous or stats.retiring:
            text += (
                f"; previous workers: {len(stats.previous)} serving, {len(stats.retiring)} draining"
            )
        return self.supervisor.generation_ready and bool(up), False, text

    # -- admin -------------------------------------------------------------------------

    def health(self) -> HealthReport:
        """Healthy while some worker has a usable tunnel and the edge is not
        draining: a load balancer must stop sending new clients from the
        moment a drain starts."""
        draining = self.supervisor is not None and self.supervisor.statistics().stopping
        up = tunnels_up()
        healthy = not draining and self._serving and any(v > 0 for v in up.values())
        return healthy, {
            "draining": draining,
            "starting": not self._serving,
            "tunnels_up": up,
        }

    async def _purge(self, request: web.Request) -> web.Response:
        """``POST /cache/purge`` (geoedge.cache_purge): every worker drops what it
        names and says how many entries it held; a worker that did not answer
        within ``PURGE_WAIT_S`` is listed with its error."""
        try:
            purge = parse_purge(await request.read())
        except PurgeError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if not self.config.cache.enabled:
            return web.json_response({"error": "the cache is off ([cache] enabled)"}, status=409)
        assert self.supervisor is not None
        try:
            answers = await self.supervisor.request(
                {"op": "cache_purge", "purge": purge.as_json()}, PURGE_WAIT_S
            )
        except TooManyRequests as exc:
            return web.json_response({"error": str(exc)}, status=503)
        workers = [
            {"pid": a.pid, "purged": (a.result or {}).get("purged"), "error": a.error}
            for a in answers
        ]
        complete = bool(workers) and all(w["error"] is None for w in workers)
        return web.json_response(
            {"purge": purge.as_json(), "complete": complete, "workers": workers}
        )

    def liveness(self) -> HealthReport:
        """Live while a worker runs (or the supervisor is starting them) and every
        listening socket is open: not ready is not dead, so an origin outage or a
        refused tunnel never fails it, nor does a drain."""
        stats = self.supervisor.statistics() if self.supervisor is not None else None
        workers_ok = stats is not None and (stats.running > 0 or stats.stopping)
        closed = [
            listener.address if listener is not None else "[redirect]"
            for listener, sock in self.sockets
            if sock.fileno() < 0
        ]
        detail: dict[str, object] = {
            "workers_running": stats.running if stats is not None else 0,
            "workers_target": stats.target if stats is not None else 0,
            "listeners": len(self.sockets) - len(closed),
        }
        if closed:
            detail["closed_listeners"] = closed
        return workers_ok and bool(self.sockets) and not closed, detail

    # -- worker process ----------------------------------------------------------------

    def _worker_main(self, context: WorkerContext) -> int:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(self._worker_process(context))

    async def _worker_process(self, context: WorkerContext) -> int:
        """One worker: serve until SIGTERM, then drain; SIGHUP reloads
        certificates, SIGUSR1 reopens the access log, SIGUSR2 logs a memory report.
        Ready (to the supervisor) once a tunnel is warm; one that takes over
        from others accepts no client before that."""
        worker = EdgeWorker(self.config, self.certificates, self.sockets)
        await worker.start(accept=not context.takeover)
        ready = asyncio.get_running_loop().create_task(self._when_warm(worker, context))
        tune_gc()
        memory = MemoryKeeper("geoedge_edge", ("edge", "tunnel"))
        memory.start()
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        loop.add_signal_handler(signal.SIGHUP, worker.reload_certificates)
        loop.add_signal_handler(signal.SIGUSR1, worker.reopen_logs)
        pipe = await listen_control(context, worker.on_control, lambda: None, worker.on_request)
        await stopping.wait()
        ready.cancel()
        pipe.close()
        await worker.drain()
        memory.close()
        return 0

    @staticmethod
    async def _when_warm(worker: EdgeWorker, context: WorkerContext) -> None:
        await worker.wait_warm()
        worker.accept()
        report_ready(context)


def edge_certificates(config: EdgeConfig, acme: HeldCertificates | None = None) -> CertificateWatch:
    """The certificates users see (files, and ACME's), the tunnel certificates
    and the CAs they trust."""
    files = [WatchedFile("served", c.cert) for c in config.tls.certificates]
    for origin in config.origins:
        files += tunnel_files(origin.tunnel.cert, origin.tunnel.ca)
    return CertificateWatch(files, None if acme is None else acme.expiries)


def tunnels_up() -> dict[str, float]:
    """Usable tunnel connections per origin, summed over the workers (each
    exports ``geoedge_edge_tunnels_up``; read from the multiprocess files)."""
    return {
        sample.labels.get("origin", "?"): sample.value
        for metric in merged_registry().collect()
        if metric.name == "geoedge_edge_tunnels_up"
        for sample in metric.samples
    }
