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
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry

from coldbrew.aging import StarvationWatch
from coldbrew.app import App
from coldbrew.breaker import Breakers
from coldbrew.caps import CapGate
from coldbrew.errors import ConfigurationError, DatabaseUnavailable
from coldbrew.jobstate import Delivery, InFlight, Stop
from coldbrew.metrics import Metrics, MetricsServer
from coldbrew.procpool import ProcessPool
from coldbrew.scheduler import FairScheduler
from coldbrew.settings import Settings
from coldbrew.stats import StatsSnapshot
from coldbrew.store import JobStore
from coldbrew.topology import Topology
from coldbrew.transport import Broker
from coldbrew.worker.aging_sweep import QueueSweeper, SweepReturns
from coldbrew.worker.dead_letters import DeadLetters
from coldbrew.worker.health import DatabaseHealth
from coldbrew.worker.heartbeat import Heartbeat
from coldbrew.worker.intake import Intake
from coldbrew.worker.lifecycle import Lifecycle
from coldbrew.worker.reaper import Reaper
from coldbrew.worker.relay import Relay
from coldbrew.worker.runner import JobRunner
from coldbrew.worker.service import Periodic, Service
from coldbrew.worker.tenant_watch import TenantQueues

log = structlog.get_logger("coldbrew.worker")


@dataclass(frozen=True, slots=True)
class Parts:
    """What ``run()`` opened and built; the services share these."""

    store: JobStore
    broker: Broker
    runner: JobRunner
    intake: Intake
    tenants: TenantQueues
    dead_letters: DeadLetters
    stats: StatsSnapshot


class Worker:
    """Runs the jobs of one ``App`` until ``stop()``."""

    def __init__(
        self, app: App, settings: Settings, *, registry: CollectorRegistry | None = None
    ) -> None:
        self.app = app
        self.settings = settings
        self.topology = Topology(settings.namespace)
        self.lanes = settings.queues or app.queues
        self.metrics = Metrics(registry if registry is not None else CollectorRegistry())
        self.inflight = InFlight()
        self.lifecycle = Lifecycle()
        self.ready = self.lifecycle.ready
        # which queues may hide low-priority messages behind a stream (aging.py)
        self.starvation = StarvationWatch(settings.aging_seconds / 2)
        self.metrics_port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._built: Parts | None = None
        self._consumed: set[tuple[str, str]] = set()

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
            await self._open(stack)
            try:
                async with asyncio.TaskGroup() as group:
                    for service in self.services():
                        group.create_task(service.run(lifecycle.services_stop), name=service.name)
                    await self._consume_all()
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

    # --- start-up -------------------------------------------------------------------

    async def _open(self, stack: AsyncExitStack) -> None:
        settings = self.settings
        store = await stack.enter_async_context(
            JobStore.open(
                settings.database_url, settings.namespace, pool_size=settings.db_pool_size
            )
        )
        await store.check_schema()
        store.configure_claims(
            lease_seconds=settings.lease_seconds,
            worker_id=settings.worker_id,
            commit=settings.claim_commit,
        )
        broker = Broker(
            settings.amqp_url,
            self.topology,
            name=f"coldbrew-worker:{settings.worker_id}",
            heartbeat=settings.amqp_heartbeat_seconds,
            consume_channels=settings.consume_channels,
        )
        await broker.connect(prefetch=settings.effective_prefetch)
        stack.push_async_callback(broker.close)
        pool = await self._open_pool(stack)
        server = MetricsServer(  # port 0 picks a free port (tests, several workers per host)
            settings.metrics_host,
            settings.metrics_port,
            self.metrics.registry,
            is_healthy=self.lifecycle.health,
            is_ready=self._readiness,
        )
        await stack.enter_async_context(server)
        self.metrics_port = server.port
        self._built = self._build(store, broker, pool)
        stack.push_async_callback(self._built.runner.close)  # before the broker closes

    async def _open_pool(self, stack: AsyncExitStack) -> ProcessPool | None:
        """The process pool, when the app has plain-function jobs."""
        settings = self.settings
        if not self.app.needs_process_pool:
            return None
        pooled = sorted(s.name for s in self.app.jobs.values() if s.runs_in_process)
        if settings.processes == 0:
            raise ConfigurationError(
                f"COLDBREW_PROCESSES is 0 but {', '.join(pooled)} run in the process pool"
            )
        if self.app.ref is None:
            raise ConfigurationError(
                "process-pool jobs need an app loaded by reference (coldbrew.app.load_app)"
            )
        pool = ProcessPool(settings.processes, self.app.ref)
        await pool.start()
        stack.push_async_callback(pool.close, settings.shutdown_grace_seconds)
        return pool

    def _build(self, store: JobStore, broker: Broker, pool: ProcessPool | None) -> Parts:
        settings, metrics = self.settings, self.metrics
        breakers = Breakers(
            failure_threshold=settings.breaker_failure_threshold,
            reset_seconds=settings.breaker_reset_seconds,
            on_state=metrics.set_breaker_state,
        )
        runner = JobRunner(
            settings=settings,
            store=store,
            broker=broker,
            pool=pool,
            metrics=metrics,
            inflight=self.inflight,
            lifecycle=self.lifecycle,
            breakers=breakers,
        )
        metrics.watch_group_commits([store.claims, store.completions, store.releases])
        stats = StatsSnapshot(store, max_tenants=settings.metrics_max_tenants)
        stats.register(metrics)
        dead_letters = DeadLetters(store, broker, metrics)
        tenants: TenantQueues | None = None
        intake = Intake(
            app=self.app,
            settings=settings,
            metrics=metrics,
            lifecycle=self.lifecycle,
            runner=runner,
            store=store,
            dead_letters=dead_letters,
            starvation=self.starvation,
            sweep_returns=SweepReturns(),
            cap_listening=lambda: tenants is not None and tenants.cap_listening,
        )
        store.on_capped_claim = intake.caps.capped_claim_done
        tenants = TenantQueues(
            resync_seconds=settings.tenant_resync_seconds,
            store=store,
            broker=broker,
            topology=self.topology,
            metrics=metrics,
            on_queue=self._consume_tenant,
            on_reject=dead_letters.reject,
            on_settings=intake.apply_tenant_settings,
            on_cap_freed=intake.cap_freed_elsewhere,
        )
        return Parts(store, broker, runner, intake, tenants, dead_letters, stats)

    def services(self) -> list[Service]:
        """Every background loop of this worker, each a file of this package."""
        settings, parts = self.settings, self.parts
        store, broker, metrics = parts.store, parts.broker, self.metrics
        sweeper = QueueSweeper(
            watch=self.starvation,
            broker=broker,
            topology=self.topology,
            metrics=metrics,
            accept=parts.intake.accept_swept,
            returns=parts.intake.sweep_returns,
            lifecycle=self.lifecycle,
            limit=settings.aging_sweep_limit,
            keep_max=settings.effective_prefetch,
            aging_seconds=settings.aging_seconds,
        )
        return [
            Relay(store, broker, metrics, interval=settings.relay_interval_seconds),
            Reaper(store, broker, metrics, interval=settings.reaper_interval_seconds),
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
        ]

    async def _consume_all(self) -> None:
        tenants = self.parts.tenants
        for lane in self.lanes:
            await tenants.ensure(lane, "default")
        await tenants.sync()
        await self.parts.broker.consume(
            self.topology.unrouted_queue,
            self.topology.unrouted_queue_arguments(),
            tenants.on_unrouted,
        )

    async def _consume_tenant(self, queue: str, tenant: str) -> None:
        """Consume one (lane, tenant) queue if it is one of our lanes (idempotent)."""
        if queue not in self.lanes or (queue, tenant) in self._consumed:
            return
        if self.lifecycle.draining:
            return
        self._consumed.add((queue, tenant))
        try:
            await self.parts.broker.consume(
                self.topology.job_queue(queue, tenant),
                self.topology.job_queue_arguments(),
                self.parts.intake.on_message,
            )
        except BaseException:
            self._consumed.discard((queue, tenant))
            raise
        log.info("consuming", queue=queue, tenant=tenant)

    def _readiness(self) -> tuple[bool, str]:
        lifecycle = self.lifecycle
        if lifecycle.draining:
            return False, "draining"
        if not lifecycle.ready.is_set():
            return False, "starting"
        if self._built is None or not self._built.broker.connected:
            return False, "RabbitMQ connection lost; reconnecting"
        if not lifecycle.database_ok:
            return False, "PostgreSQL unreachable"
        if self._built.broker.consuming == 0:
            return False, "not consuming any queue"
        return True, "ok"

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
                await self.parts.store.notify_caps_freed(freed)
