"""A worker's parts: what it opens (store, broker, pool, metrics server) and builds on them.

``open_parts`` enters each resource into the worker's ``AsyncExitStack`` as
it opens it, so a start-up that fails halfway closes what was opened, in
reverse. Every hook between parts is a constructor argument wired here once;
no part reaches into another after it was built.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass

import structlog

from coldbrew.aging import StarvationWatch
from coldbrew.app import App
from coldbrew.breaker import Breakers
from coldbrew.errors import ConfigurationError
from coldbrew.jobstate import InFlight
from coldbrew.metrics import Metrics, MetricsServer
from coldbrew.procpool import ProcessPool
from coldbrew.settings import Settings
from coldbrew.stats import StatsSnapshot
from coldbrew.store import JobStore
from coldbrew.topology import Topology
from coldbrew.transport import Broker
from coldbrew.worker.aging_sweep import SweepReturns
from coldbrew.worker.consumer_hold import ConsumerHold
from coldbrew.worker.dead_letters import DeadLetters
from coldbrew.worker.intake import Intake
from coldbrew.worker.lifecycle import Lifecycle
from coldbrew.worker.liveness import Liveness
from coldbrew.worker.reaper import Reaper
from coldbrew.worker.registration import publish_job_types
from coldbrew.worker.relay import Relay
from coldbrew.worker.runner import JobRunner
from coldbrew.worker.tenant_watch import TenantQueues

log = structlog.get_logger("coldbrew.worker")


@dataclass(frozen=True, slots=True)
class Parts:
    """What ``Worker.run()`` opened and built; the services share these."""

    store: JobStore
    broker: Broker
    runner: JobRunner
    intake: Intake
    tenants: TenantQueues
    consumers: LaneConsumers
    dead_letters: DeadLetters
    stats: StatsSnapshot
    metrics_port: int
    relay: Relay
    reaper: Reaper
    liveness: Liveness
    hold: ConsumerHold


@dataclass(frozen=True, slots=True)
class Shared:
    """What the worker itself keeps across its parts (made before anything opens)."""

    app: App
    settings: Settings
    topology: Topology
    lanes: list[str]
    metrics: Metrics
    lifecycle: Lifecycle
    inflight: InFlight
    starvation: StarvationWatch


class LaneConsumers:
    """Which (lane, tenant) queues this worker consumes: every tenant queue of its lanes."""

    def __init__(self, shared: Shared, broker: Broker, intake: Intake) -> None:
        self.shared = shared
        self.broker = broker
        self.intake = intake
        self._consumed: set[tuple[str, str]] = set()

    def consumes(self, queue: str, tenant: str) -> bool:
        """Whether this worker consumes (or is subscribing to) the (lane, tenant) queue."""
        return (queue, tenant) in self._consumed

    async def start(self, tenants: TenantQueues) -> None:
        """Consume the known tenant queues of our lanes, and ``<ns>.unrouted``."""
        topology = self.shared.topology
        for lane in self.shared.lanes:
            await tenants.ensure(lane, "default")
        await tenants.sync()
        await self.broker.consume(
            topology.unrouted_queue, topology.unrouted_queue_arguments(), tenants.on_unrouted
        )

    async def consume(self, queue: str, tenant: str) -> None:
        """Consume one (lane, tenant) queue if it is one of our lanes (idempotent)."""
        key = (queue, tenant)
        if queue not in self.shared.lanes or self.shared.lifecycle.draining:
            return
        if key in self._consumed:
            # idempotent; it starts again a consumer that a probe stopped because its queue
            # was deleted while paused, once the queue is declared again (consume.py)
            await self._consume_queues(queue, tenant)
            return
        self._consumed.add(key)
        try:
            await self._consume_queues(queue, tenant)
        except BaseException:
            self._consumed.discard(key)
            raise
        log.info("consuming", queue=queue, tenant=tenant)

    async def _consume_queues(self, queue: str, tenant: str) -> None:
        """Consume the (lane, tenant)'s queues (quorum: every priority band's, consumed
        together: topology.py), their deliveries held by the hold (consume.py)."""
        topology = self.shared.topology
        for name in topology.job_queues(queue, tenant):
            await self.broker.consume(
                name, topology.job_queue_arguments(), self.intake.on_message, held=True
            )


async def open_parts(stack: AsyncExitStack, shared: Shared) -> Parts:
    """Open the resources into ``stack`` and build the parts on them."""
    settings = shared.settings
    store = await stack.enter_async_context(
        JobStore.open(settings.database_url, settings.namespace, pool_size=settings.db_pool_size)
    )
    await store.check_schema()
    store.configure_claims(
        lease_seconds=settings.lease_seconds,
        worker_id=settings.worker_id,
        commit=settings.claim_commit,
    )
    await publish_job_types(store, shared.app, settings.worker_id)  # before it consumes
    broker = Broker(
        settings.amqp_url,
        shared.topology,
        name=f"coldbrew-worker:{settings.worker_id}",
        heartbeat=settings.amqp_heartbeat_seconds,
        consume_channels=settings.consume_channels,
        spread_key=settings.worker_id,  # where in COLDBREW_AMQP_URL's list it starts
    )
    hold = ConsumerHold(
        settings=settings, broker=broker, lifecycle=shared.lifecycle, metrics=shared.metrics
    )
    await broker.connect(prefetch=hold.initial_prefetch)
    stack.push_async_callback(broker.close)
    pool = await _open_pool(stack, shared)
    dead_letters = DeadLetters(store, broker, shared.metrics)
    runner = _runner(shared, store, broker, pool, dead_letters)
    stack.push_async_callback(runner.close)  # before the broker closes
    return await _build(stack, shared, store, broker, runner, dead_letters, hold)


async def _open_pool(stack: AsyncExitStack, shared: Shared) -> ProcessPool | None:
    """The process pool, when the app has plain-function jobs."""
    app, settings = shared.app, shared.settings
    if not app.needs_process_pool:
        return None
    pooled = sorted(s.name for s in app.jobs.values() if s.runs_in_process)
    if settings.processes == 0:
        raise ConfigurationError(
            f"COLDBREW_PROCESSES is 0 but {', '.join(pooled)} run in the process pool"
        )
    if app.ref is None:
        raise ConfigurationError(
            "process-pool jobs need an app loaded by reference (coldbrew.app.load_app)"
        )
    pool = ProcessPool(
        settings.processes,
        app.ref,
        app_dir=app.app_dir,
        max_memory_mb=settings.process_max_memory_mb,
        max_jobs=settings.process_max_jobs,
    )
    await pool.start()
    shared.metrics.watch_process_pool(pool)
    stack.push_async_callback(pool.close, settings.shutdown_grace_seconds)
    return pool


def _runner(
    shared: Shared,
    store: JobStore,
    broker: Broker,
    pool: ProcessPool | None,
    dead_letters: DeadLetters,
) -> JobRunner:
    settings, metrics = shared.settings, shared.metrics
    breakers = Breakers(
        failure_threshold=settings.breaker_failure_threshold,
        reset_seconds=settings.breaker_reset_seconds,
        on_state=metrics.set_breaker_state,
    )
    return JobRunner(
        settings=settings,
        store=store,
        broker=broker,
        pool=pool,
        metrics=metrics,
        inflight=shared.inflight,
        lifecycle=shared.lifecycle,
        dead_letters=dead_letters,
        breakers=breakers,
        app=shared.app,
    )


async def _build(
    stack: AsyncExitStack,
    shared: Shared,
    store: JobStore,
    broker: Broker,
    runner: JobRunner,
    dead_letters: DeadLetters,
    hold: ConsumerHold,
) -> Parts:
    settings, metrics = shared.settings, shared.metrics
    metrics.watch_group_commits(store.group_commits)
    stats = StatsSnapshot(
        store,
        max_tenants=settings.metrics_max_tenants,
        max_age=settings.stats_interval_seconds / 2,
    )
    stats.register(metrics)
    tenants: TenantQueues | None = None
    intake = Intake(
        app=shared.app,
        settings=settings,
        metrics=metrics,
        lifecycle=shared.lifecycle,
        runner=runner,
        store=store,
        dead_letters=dead_letters,
        starvation=shared.starvation,
        sweep_returns=SweepReturns(),
        cap_listening=lambda: tenants is not None and tenants.cap_listening,
        hold=hold,
    )
    consumers = LaneConsumers(shared, broker, intake)
    tenants = TenantQueues(
        resync_seconds=settings.tenant_resync_seconds,
        store=store,
        broker=broker,
        topology=shared.topology,
        metrics=metrics,
        on_queue=consumers.consume,
        on_reject=dead_letters.reject,
        on_settings=intake.apply_tenant_settings,
        on_cap_freed=intake.cap_freed_elsewhere,
        on_lanes=intake.apply_lanes,
    )
    server = MetricsServer(  # port 0 picks a free port (tests, several workers per host)
        settings.metrics_host,
        settings.metrics_port,
        metrics.registry,
        is_healthy=shared.lifecycle.health,
        is_ready=lambda: readiness(shared.lifecycle, broker),
        ready_details=lambda: {
            "broker": broker.node,
            "database": shared.lifecycle.database_node,
        },
    )
    await stack.enter_async_context(server)
    metrics.watch_worker(
        ready=lambda: readiness(shared.lifecycle, broker)[0],
        database_up=lambda: shared.lifecycle.database_ok,
        broker_up=lambda: broker.connected,
        slots=settings.concurrency,
    )
    relay, reaper, liveness = await _open_liveness(stack, shared, store, broker)
    tenants.also_listen(shared.topology.relay_channel, relay.wake)  # commits that made rows due
    return Parts(
        store,
        broker,
        runner,
        intake,
        tenants,
        consumers,
        dead_letters,
        stats,
        server.port,
        relay,
        reaper,
        liveness,
        hold,
    )


async def _open_liveness(
    stack: AsyncExitStack, shared: Shared, store: JobStore, broker: Broker
) -> tuple[Relay, Reaper, Liveness]:
    """Register the worker (before it consumes); the relay and reaper act on what it finds."""
    settings, metrics = shared.settings, shared.metrics
    relay = Relay(
        store,
        broker,
        metrics,
        interval=settings.relay_interval_seconds,
        batch=settings.relay_batch,
    )
    reaper = Reaper(
        store,
        broker,
        metrics,
        interval=settings.reaper_interval_seconds,
        lease_seconds=settings.lease_seconds,
    )
    liveness = Liveness(
        settings=settings,
        store=store,
        lanes=shared.lanes,
        inflight=shared.inflight,
        metrics=metrics,
        publish_due=relay.publish_due,
        on_released=reaper.settle,
    )
    await liveness.open()
    stack.push_async_callback(liveness.close)
    return relay, reaper, liveness


def readiness(lifecycle: Lifecycle, broker: Broker) -> tuple[bool, str]:
    """The readiness probe: ready while consuming with both services reachable."""
    if lifecycle.draining:
        return False, "draining"
    if not lifecycle.ready.is_set():
        return False, "starting"
    if not broker.connected:
        return False, "RabbitMQ connection lost; reconnecting"
    if not lifecycle.database_ok:
        return False, "PostgreSQL unreachable"
    if broker.consuming == 0:
        return False, "not consuming any queue"
    return True, "ok"
