"""The origin daemon's parent process: sockets, workers, control plane, admin.

Start-up, in this order (the order is the point):

1. multiprocess metrics on (a fresh ``PROMETHEUS_MULTIPROC_DIR``);
2. bind the tunnel listener and build its TLS context (with the handshake
   audit), so every worker forked later shares both;
3. the control plane resolves DNS pools once and starts health checks;
4. the admin listener; 5. fork the workers, each starting from the latest snapshot.

Parent <-> workers: the parent publishes pool snapshots (membership, health,
drains, pool settings) on each worker's control pipe
(:meth:`~geoedge.workers.Supervisor.broadcast`, JSON lines), and asks the
workers to send CONTROL messages to the edges and gathers their outcomes
(:meth:`OriginDaemon.broadcast_control`, :mod:`origin.edge_control`; the
admin's ``POST /tunnel/echo``). Drains go
this way too: ``POST /backends/<pool>/<host:port>/drain`` on the admin changes
the control state, which publishes a new snapshot; a worker forked later gets
the drain in its starting snapshot.

Signals: SIGTERM/SIGINT: stop (workers send GOAWAY, drain for up to
``drain_timeout_s``, reset the rest, exit; the parent waits for them, SIGKILLs
stragglers 5 s after the drain deadline, and exits 0). SIGHUP (or ``--reload
PID``, the unit's ``ExecReload=``): reload in place, code and every setting
(:mod:`geoedge.reload`): a checked config, a re-exec that keeps the tunnel
listener, the drains and the backends found down, new workers listening, then
the old ones send GOAWAY: the edges open new streams on tunnels to the new
workers while the open ones finish on the old. An invalid file is refused and
everything stays as it was.

Admin health, two questions (:mod:`geoedge.admin`): ``/readyz`` (and
``/healthz``) is 200 when every worker is running, at least one backend of
some pool is healthy and not drained, and no stop has begun: from SIGTERM on
it answers 503 (``"draining": true``) while the drain runs. ``/livez`` is 200
while a worker runs and the tunnel listener is open, whatever the backends do:
a Node.js outage makes the origin not ready, never dead.

``in_process=True`` runs one worker inside the parent's event loop, with no
fork and no multiprocess metrics: the same wiring, for tests that need to
reach into the worker.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvloop

from geoedge.admin import AdminServer, HealthReport
from geoedge.cert_expiry import CertificateWatch, tunnel_files
from geoedge.config import ConfigError
from geoedge.listening import Listening, take_listeners
from geoedge.logs import AccessLog
from geoedge.memory import MemoryKeeper, tune_gc
from geoedge.metrics import (
    cleanup_multiprocess,
    merged_families,
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
from geoedge.workers import Supervisor, WorkerContext, listen_control, report_ready
from origin import cache_purge
from origin.acme_service import AcmeService, encode_for_pipe
from origin.admin_routes import backend_routes, current_backends_only
from origin.admission import TlsAudit
from origin.config import OriginConfig, load_origin_config
from origin.control import ControlPlane
from origin.edge_control import ControlBroadcast, EdgeControl
from origin.metrics import ControlMetrics, WorkerMetrics
from origin.snapshot import PoolSnapshot, encode_snapshots
from origin.status import OriginStatus
from origin.worker import OriginWorker
from tunnel.aio.transport import listener_ssl_context

__all__ = ["OriginDaemon", "open_access_log"]

log = logging.getLogger("geoedge.origin")

#: Grace after the drain deadline before the parent SIGKILLs a worker.
KILL_GRACE_S = 5.0
#: A reload whose new workers do not all listen within this long is reported failed.
TAKEOVER_TIMEOUT_S = 10.0


def open_access_log(config: OriginConfig) -> AccessLog | None:
    target = config.origin.access_log
    if not target:
        return None
    return AccessLog(sys.stdout if target == "-" else target, edge_id=None)


class OriginDaemon:
    def __init__(
        self,
        config: OriginConfig,
        *,
        config_path: str | Path | None = None,
        in_process: bool = False,
        inheritance: Inheritance | None = None,
    ) -> None:
        """``inheritance``: what the supervisor's previous image passed on (this
        process is the exec of a reload, :mod:`geoedge.reexec`)."""
        self.config = config
        self.config_path = config_path
        self.in_process = in_process
        self.inheritance = inheritance
        self._metrics_dir: Path | None = None
        self._sock: socket.socket | None = None
        self._listening = Listening([], [])
        self._ssl: ssl.SSLContext | None = None
        self._audit = TlsAudit()
        self.control: ControlPlane | None = None
        self.supervisor: Supervisor | None = None
        self.worker: OriginWorker | None = None
        self.admin: AdminServer | None = None
        self.edge_control: EdgeControl | None = None
        self.acme: AcmeService | None = None
        # Made anew by each run(): a stop() before it does not stop the next run.
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        # Under systemd only (not in process: tests' origins share the test's env).
        self.notifier = ServiceNotifier({} if in_process else None)
        self.reloader: Reloader | None = None
        if not in_process:
            self.reloader = Reloader(
                notifier=self.notifier,
                handover=self._handover,
                takeover_timeout_s=TAKEOVER_TIMEOUT_S,
                inheritance=inheritance,
                describe=lambda: f"version {running_version()}, new workers listening",
                on_result=self._reloaded,
                held=lambda: held_sockets(self._listening, self.admin),
                admin=lambda: self.admin,
            )

    # -- parent ------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until stopped (SIGTERM/SIGINT, or :meth:`stop`); the exit status."""
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        if not self.in_process:
            self._metrics_dir = start_metrics(self.inheritance)
        try:
            await self._run()
        finally:
            if self._metrics_dir is not None:
                cleanup_multiprocess(self._metrics_dir)
        return 0

    async def _run(self) -> None:
        config = self.config
        listener = config.tunnel_listener
        self._sock = self._activated_or_bound(listener.address)
        context = listener_ssl_context(listener)
        self._ssl = self._audit.install(context) if context is not None else None
        control_metrics = ControlMetrics()
        self.control = control = ControlPlane(config, self._publish, metrics=control_metrics)
        registries = [control_metrics.registry]
        if self.in_process:
            worker_metrics = WorkerMetrics()
            registries.append(worker_metrics.registry)
            self.worker = OriginWorker(
                config,
                self.control.snapshots,
                metrics=worker_metrics,
                access_log=open_access_log(config),
            )
        else:
            self.supervisor = Supervisor(
                self._worker_main,
                workers=config.origin.workers,
                stop_timeout_s=config.origin.drain_timeout_s + KILL_GRACE_S,
                on_reload=self.request_reload,
                on_worker_exit=self._on_worker_exit,
                parent_fds=self._parent_fds,
                on_stopping=self._stopping,
                on_generation_ready=self._generation_ready,
                adopted=self.inheritance.workers if self.inheritance is not None else (),
            )
        self.edge_control = (
            EdgeControl(local=self.worker.edges.broadcast_control)
            if self.worker is not None
            else EdgeControl(ask_workers=self.supervisor.request if self.supervisor else None)
        )
        self.acme = (
            None
            if config.acme is None
            else AcmeService(
                config.acme, self.broadcast_control, self._publish_acme, control_metrics
            )
        )
        certificates = CertificateWatch(tunnel_files(listener.cert, listener.ca))
        status = OriginStatus(
            config.origin.id,
            MetricsWindow(lambda: merged_families(registries)),
            self.control,
            self._worker_counts,
            certificates,
            acme=self.acme.table if self.acme is not None else None,
        )
        self.admin = AdminServer(
            config.admin.address,
            health=self.health,
            liveness=self.liveness,
            registries=registries,
            routes=[
                *backend_routes(control),
                *(self.edge_control.routes() if self.edge_control is not None else ()),
                *cache_purge.routes(self.broadcast_control),
                *(self.acme.routes() if self.acme is not None else ()),
            ],
            status=status,
            keep_metrics=lambda families: current_backends_only(control, families),
            collectors=[certificates],
        )
        try:
            await self.control.start()
            if self.inheritance is not None:
                self.control.restore(self.inheritance.state)
            admin_sock, control_sock = inherited_admin_and_reload(self.inheritance)
            try:
                await self.admin.start(admin_sock)
            except OSError as exc:
                raise ListenError("[admin] address", config.admin.address, exc) from None
            if self.reloader is not None:
                self.reloader.start(control_sock)
            log.info(
                "origin %s serving %s with %d worker(s), geoedge %s",
                config.origin.id,
                config.tunnel_listener.address,
                self.supervisor.target if self.supervisor is not None else 1,
                version_line(),
            )
            if self.acme is not None:
                await self.acme.start()
            if self.worker is not None:
                await self.worker.start(
                    sock=self._sock, ssl_context=self._ssl, tls_audit=self._audit
                )
                self.ready.set()
                await self._stop.wait()
                await self.worker.drain()
            else:
                assert self.supervisor is not None
                loop = asyncio.get_running_loop()
                counter = loop.create_task(self._count_workers())
                systemd = loop.create_task(
                    self.notifier.run(
                        self._service_state,
                        ready_timeout_s=10.0,  # listening already; ready once a worker runs
                        alive=lambda: self.supervisor is not None and self.supervisor.running > 0,
                    )
                )
                self.ready.set()
                try:
                    await self.supervisor.run()
                finally:
                    if self.reloader is not None:
                        self.reloader.close()
                    counter.cancel()
                    systemd.cancel()
                    self.notifier.close()
        finally:
            if self.acme is not None:
                await self.acme.close()
            await self.admin.close()
            await self.control.close()
            self._listening.close()

    def _activated_or_bound(self, address: str) -> socket.socket:
        """The tunnel listener: the one the supervisor's previous image held (a
        reload), or the one systemd passed for ``address`` (socket activation),
        else a new one."""
        self._listening = take_listeners(
            [("[tunnel_listener] address", address)],
            self.inheritance,
            activation=not self.in_process,
        )
        return self._listening.sockets[0]

    def _service_state(self) -> tuple[bool, bool, str]:
        """(ready, stopping, STATUS=) for systemd."""
        assert self.supervisor is not None and self.control is not None
        stats = self.supervisor.statistics()
        usable = self.control.state.usable_backends()
        if stats.stopping:
            return True, True, f"draining {stats.running} worker(s)"
        text = f"{stats.running}/{stats.target} workers; {usable} usable backend(s)"
        return stats.running > 0, False, text

    def stop(self) -> None:
        """Begin the graceful stop (what SIGTERM does)."""
        if self.supervisor is not None:
            self.supervisor.stop()
        self._stop.set()

    def request_reload(self) -> bool:
        """SIGHUP: reload in place (:mod:`geoedge.reload`); in process, the pools only."""
        if self.reloader is not None:
            return self.reloader.request()
        asyncio.get_running_loop().create_task(self.reload())
        return False

    def _stopping(self) -> None:
        self.notifier.stopping("draining")
        if self.reloader is not None:
            self.reloader.close()

    def _generation_ready(self) -> None:
        if self.reloader is not None:
            self.reloader.generation_ready()

    def _reloaded(self, result: str) -> None:
        if self.control is not None:
            self.control.metrics.reloads.labels("ok" if result == "ok" else "error").inc()

    def _handover(self, replies: list[int], requested_at: float) -> Inheritance:
        assert self.reloader is not None and self.control is not None
        return handover_record(
            listening=self._listening,
            admin=self.admin,
            reloader=self.reloader,
            supervisor=self.supervisor,
            metrics_dir=str(self._metrics_dir) if self._metrics_dir is not None else None,
            replies=replies,
            requested_at=requested_at,
            state=self.control.state.carried(),
        )

    async def reload(self, config: OriginConfig | None = None) -> bool:
        """In process (tests): adopt the pools of ``config`` (or of the config
        file); False if invalid. The daemon's own reload replaces its workers."""
        assert self.control is not None
        metrics = self.control.metrics
        if config is None:
            if self.config_path is None:
                log.error("reload: no config file to read")
                return False
            try:
                config = load_origin_config(self.config_path)
            except ConfigError as exc:
                log.error("reload rejected, keeping the running pools:\n%s", exc)
                metrics.reloads.labels("error").inc()
                return False
        unchanged = replace(config, pools=self.config.pools)
        if unchanged != self.config:
            log.warning("reload: only [[pools]] change without a restart; other changes ignored")
        self.config = replace(self.config, pools=config.pools)
        await self.control.reload(self.config)
        metrics.reloads.labels("ok").inc()
        log.info("reloaded: %d pool(s)", len(config.pools))
        return True

    async def broadcast_control(self, kind: int, body: bytes, timeout_s: float) -> ControlBroadcast:
        """Send a CONTROL message (PROTOCOL.md §5.14) to every connected edge,
        on each of its connections, across the workers, and gather the
        outcomes (:mod:`origin.edge_control`). Call it while running."""
        assert self.edge_control is not None, "the daemon is not running"
        return await self.edge_control.broadcast(kind, body, timeout_s)

    def _publish(self, snapshots: tuple[PoolSnapshot, ...]) -> None:
        if self.worker is not None:
            self.worker.apply_snapshots(snapshots)
        if self.supervisor is not None:
            self.supervisor.broadcast({"op": "pools", "pools": encode_snapshots(snapshots)})

    def _publish_acme(self, messages: list[tuple[int, bytes]]) -> None:
        """The current ACME certificates to the workers (for edges that connect later)."""
        if self.worker is not None:
            self.worker.acme.replace(messages)
        if self.supervisor is not None:
            self.supervisor.broadcast(
                {"op": "acme_certificates", "messages": encode_for_pipe(messages)}
            )

    def _on_worker_exit(self, pid: int, code: int) -> None:
        process_exited(pid)
        supervisor, control = self.supervisor, self.control
        if control is not None and supervisor is not None and not supervisor.statistics().stopping:
            control.metrics.worker_restarts.inc()

    def _parent_fds(self) -> list[int]:
        fd = self.admin.fileno() if self.admin is not None else None
        fds = [fd] if fd is not None else []
        return fds + (self.reloader.fds() if self.reloader is not None else [])

    async def _count_workers(self) -> None:
        assert self.supervisor is not None and self.control is not None
        gauge = self.control.metrics.workers_running
        while True:
            gauge.set(self.supervisor.running)
            await asyncio.sleep(1.0)

    # -- admin -------------------------------------------------------------------------

    def health(self) -> HealthReport:
        assert self.control is not None
        if self.supervisor is not None:
            stats = self.supervisor.statistics()
            workers_ok = self.supervisor.all_running
            workers = {"target": stats.target, "running": stats.running, "restarts": stats.restarts}
        else:
            workers_ok = self.worker is not None and not self.worker.statistics().draining
            workers = {"target": 1, "running": 1 if workers_ok else 0, "restarts": 0}
        usable = self.control.state.usable_backends()
        detail: dict[str, Any] = {
            "draining": self._draining(),
            "workers": workers,
            "usable_backends": usable,
            "pools": self.control.status(),
        }
        return workers_ok and usable > 0 and not detail["draining"], detail

    def liveness(self) -> HealthReport:
        """Live while a worker runs (or a stop drains them) and the tunnel
        listener is open; backends play no part."""
        if self.supervisor is not None:
            stats = self.supervisor.statistics()
            workers_ok = stats.running > 0 or stats.stopping
            running = stats.running
        else:
            workers_ok = self.worker is not None
            running = 1 if workers_ok else 0
        listening = self._sock is not None and self._sock.fileno() >= 0
        detail = {"workers_running": running, "tunnel_listener_open": listening}
        return workers_ok and listening, detail

    def _draining(self) -> bool:
        """A stop has begun (SIGTERM): ``/healthz`` is 503 from then on."""
        if self.supervisor is not None:
            return self.supervisor.statistics().stopping
        return self.worker is not None and self.worker.statistics().draining

    def _worker_counts(self) -> tuple[int, int, bool]:
        """(running, wanted, draining), for the status page."""
        if self.supervisor is not None:
            stats = self.supervisor.statistics()
            return stats.running, stats.target, stats.stopping
        draining = self.worker is not None and self.worker.statistics().draining
        return 1, 1, draining

    # -- worker process ----------------------------------------------------------------

    def _worker_main(self, context: WorkerContext) -> int:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(self._worker_process(context))

    async def _worker_process(self, context: WorkerContext) -> int:
        assert self.control is not None
        loop = asyncio.get_running_loop()
        access_log = open_access_log(self.config)
        worker = OriginWorker(
            self.config,
            self.control.snapshots,
            metrics=WorkerMetrics(),
            access_log=access_log,
            process_metrics=True,
            acme_messages=self.acme.messages if self.acme is not None else None,
        )
        stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: None)  # the parent reloads
        if access_log is not None:  # logrotate's postrotate
            loop.add_signal_handler(signal.SIGUSR1, access_log.reopen)
        await worker.start(sock=self._sock, ssl_context=self._ssl, tls_audit=self._audit)
        pipe = await listen_control(context, worker.on_control, stopping.set, worker.on_request)
        report_ready(context)  # listening: the older workers may go
        tune_gc()
        memory = MemoryKeeper("geoedge_origin", ("origin", "tunnel"))
        memory.start()  # SIGUSR2: a memory report
        log.info("worker %d serving on %s", context.index, self.config.tunnel_listener.address)
        await stopping.wait()
        await worker.drain()
        memory.close()
        pipe.close()
        return 0
