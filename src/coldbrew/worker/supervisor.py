"""``Worker``: a supervisor of services around the intake and the job runner.

One lifespan (an ``AsyncExitStack``) opens the store, the broker, the process
pool and the metrics server, and closes them in reverse even when start-up
fails halfway. The background services (``services()``: one file each in
this package) run in one ``TaskGroup``: a crash in any of them is fatal and
never silent. SIGTERM (``stop()``) stops consuming at once, lets in-flight
jobs finish within the grace time, then releases the rest so they run again
elsewhere immediately.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AsyncExitStack

import structlog
from prometheus_client import CollectorRegistry

from coldbrew.aging import StarvationWatch
from coldbrew.app import App
from coldbrew.caps import CapGate
from coldbrew.client import Client
from coldbrew.errors import DatabaseUnavailable
from coldbrew.jobstate import Delivery, InFlight, Stop
from coldbrew.metrics import Metrics
from coldbrew.scheduler import FairScheduler
from coldbrew.settings import Settings
from coldbrew.webhooks import WebhookConfig, WebhookSender
from coldbrew.worker.aging_sweep import QueueSweeper
from coldbrew.worker.cron import CronService, declared_schedules
from coldbrew.worker.health import DatabaseHealth
from coldbrew.worker.heartbeat import Heartbeat
from coldbrew.worker.lifecycle import Lifecycle
from coldbrew.worker.parts import Parts, Shared, open_parts
from coldbrew.worker.prune import PruneService, Retention
from coldbrew.worker.reconcile import Reconciler
from coldbrew.worker.rollup import RollupService
from coldbrew.worker.service import Periodic, Service

log = structlog.get_logger("coldbrew.worker")


class Worker:
    """Runs the jobs of one ``App`` until ``stop()``."""

    def __init__(
        self, app: App, settings: Settings, *, registry: CollectorRegistry | None = None
    ) -> None:
        self.settings = settings
        self.topology = settings.topology()
        self.metrics = Metrics(registry if registry is not None else CollectorRegistry())
        # the app's jobs and the built-in delivery job of durable webhooks (webhooks/), on
        # a copy: the caller's app stays as written
        self.app = app.extended()
        WebhookSender(WebhookConfig.of(settings), count=self._webhook_outcome).register(self.app)
        self.lanes = settings.queues or self.app.queues
        self.inflight = InFlight()
        self.lifecycle = Lifecycle()
        self.ready = self.lifecycle.ready
        # which queues may hide low-priority messages behind a stream (aging.py)
        self.starvation = StarvationWatch(settings.aging_seconds / 2)
        self.metrics_port: int | None = None
        # @app.cron and COLDBREW_CRON, checked now: a bad one fails the start-up
        self.schedules = declared_schedules(app, settings)
        for schedule in self.schedules:
            self.metrics.declare_cron_schedule(schedule)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._built: Parts | None = None

    def _webhook_outcome(self, outcome: str) -> None:
        self.metrics.webhook_deliveries.labels(outcome).inc()

    @property
    def parts(self) -> Parts:
        if self._built is None:
            raise RuntimeError("the worker's parts are used before run() opened them")
        return self._built

    @property
    def scheduler(self) -> FairScheduler[Delivery]:
        """The deliveries waiting here for a job slot."""
        return self.parts.intake.scheduler

    @property
    def caps(self) -> CapGate:
        return self.parts.intake.caps

    @property
    def hold_limit(self) -> float:
        return self.parts.intake.hold_limit

    # --- control ------------------------------------------------------------------

    def stop(self) -> None:
        """Begin a graceful drain; safe to call from any thread or a signal handler."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self.lifecycle.stop_requested.set()
        else:
            loop.call_soon_threadsafe(self.lifecycle.stop_requested.set)

    async def run(self) -> None:
        """Start, serve until ``stop()``, drain, and close everything that was opened."""
        self._loop = asyncio.get_running_loop()
        lifecycle = self.lifecycle
        async with AsyncExitStack() as stack:
            self._built = await open_parts(stack, self._shared())
            self.metrics_port = self._built.metrics_port
            try:
                async with asyncio.TaskGroup() as group:
                    for service in self.services():
                        group.create_task(service.run(lifecycle.services_stop), name=service.name)
                    await self.parts.consumers.start(self.parts.tenants)
                    lifecycle.mark_ready()
                    log.info(
                        "worker_ready",
                        worker_id=self.settings.worker_id,
                        lanes=self.lanes,
                        concurrency=self.settings.concurrency,
                        processes=self.settings.processes if self.app.needs_process_pool else 0,
                    )
                    await lifecycle.stop_requested.wait()
                    await self._drain()
                    lifecycle.services_stop.set()
            finally:
                lifecycle.mark_stopped()
        if lifecycle.fatal is not None:
            raise lifecycle.fatal
        log.info("worker_stopped", worker_id=self.settings.worker_id)

    async def wait_ready(self, task: asyncio.Task[None], timeout: float = 30.0) -> None:
        """Wait until ``task`` (running ``run()``) is ready; re-raise its start-up error."""
        ready = asyncio.create_task(self.ready.wait())
        done, _ = await asyncio.wait(
            {ready, task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if ready not in done:
            ready.cancel()
        if task in done:
            task.result()
        if ready not in done:
            raise TimeoutError(f"the worker did not become ready within {timeout:g} s")

    def services(self) -> list[Service]:
        """Every background loop of this worker, each a file of this package."""
        settings, parts = self.settings, self.parts
        store, broker, metrics = parts.store, parts.broker, self.metrics
        # quorum mode: each band is a FIFO queue whose head every worker holds, so nothing
        # hides behind a stream of higher priorities and no sweep is needed (aging.py)
        sweep_limit = 0 if self.topology.quorum else settings.aging_sweep_limit
        reconciler = Reconciler(
            store=store,
            broker=broker,
            topology=self.topology,
            metrics=metrics,
            worker_id=settings.worker_id,
            reconcile_seconds=settings.reconcile_seconds,
            prefetch=parts.hold.permit.granted,  # then what the hold is permitted (reported)
            keep=settings.effective_prefetch if sweep_limit else 0,
            holdings=parts.intake.held_by_queue,
            ensure=parts.tenants.ensure,
            cancels=broker.queue_cancels,
            permit=parts.hold.permit,
        )
        sweeper = QueueSweeper(
            watch=self.starvation,
            broker=broker,
            topology=self.topology,
            metrics=metrics,
            accept=parts.intake.accept_swept,
            returns=parts.intake.sweep_returns,
            lifecycle=self.lifecycle,
            limit=sweep_limit,
            keep_max=settings.effective_prefetch,
            aging_seconds=settings.aging_seconds,
            on_sweep=reconciler.sweep_starting,
        )
        cron: list[Service] = []
        if self.schedules:  # only a worker that declares schedules fires any
            cron.append(
                CronService(
                    app=self.app,
                    settings=settings,
                    store=store,
                    client=Client(settings, store, broker, self.app),
                    metrics=metrics,
                    schedules=self.schedules,
                )
            )
        return [
            *cron,
            parts.relay,
            parts.reaper,
            parts.liveness,
            parts.hold,
            sweeper,
            Heartbeat(
                settings=settings,
                store=store,
                inflight=self.inflight,
                runner=parts.runner,
                metrics=metrics,
                lifecycle=self.lifecycle,
            ),
            Periodic(
                "held-deliveries",
                parts.intake.return_stale,
                interval=settings.heartbeat_seconds,
                full_batch=1 << 30,
            ),
            parts.dead_letters,
            DatabaseHealth(store, self.lifecycle),
            Periodic(
                "stats",
                parts.stats.refresh,
                interval=settings.stats_interval_seconds,
                full_batch=1,
            ),
            parts.tenants,
            reconciler,
            PruneService(
                store,
                metrics,
                Retention.of(settings),
                interval=settings.prune_interval_seconds,
                batch=settings.prune_batch,
            ),
            RollupService(
                store,
                interval=settings.stats_rollup_interval_seconds,
                settle=settings.stats_rollup_settle_seconds,
            ),
        ]

    def _shared(self) -> Shared:
        return Shared(
            app=self.app,
            settings=self.settings,
            topology=self.topology,
            lanes=self.lanes,
            metrics=self.metrics,
            lifecycle=self.lifecycle,
            inflight=self.inflight,
            starvation=self.starvation,
        )

    # --- drain --------------------------------------------------------------------

    async def _drain(self) -> None:
        """Stop consuming, finish or release in-flight jobs, requeue held deliveries."""
        self.lifecycle.begin_drain()
        intake, runner = self.parts.intake, self.parts.runner
        log.info("worker_draining", in_flight=len(intake.tasks), held=len(intake.scheduler))
        await self.parts.broker.cancel_consumers()
        await intake.return_all()
        tasks = intake.tasks
        if tasks:
            await asyncio.wait(set(tasks), timeout=self.settings.shutdown_grace_seconds)
        if tasks:
            log.info("releasing_jobs", count=len(self.inflight))
            for state in self.inflight.states():
                runner.stop(state, Stop.RELEASED)
            await asyncio.wait(set(tasks), timeout=15.0)
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.wait(set(tasks), timeout=5.0)
        # deliveries of asynchronously committed claims: acked once durable, else requeued
        await runner.settle_claim_acks(timeout=10.0)
        if freed := intake.caps.freed_at_drain():  # released jobs freed places: tell the fleet
            with contextlib.suppress(DatabaseUnavailable):
                await self.parts.store.caps.notify_caps_freed(freed)
