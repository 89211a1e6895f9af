"""``Worker``: the daemon's lifecycle around the job runner.

One lifespan (an ``AsyncExitStack``) opens the store, the broker, the process
pool and the metrics server, and closes them in reverse even when start-up
fails halfway. Background loops run in one ``TaskGroup``: a crash in any of
them is fatal and never silent. SIGTERM (``stop()``) stops consuming at once,
lets in-flight jobs finish within the grace time, then releases the rest so
they run again elsewhere immediately.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from coldbrew.aging import StarvationWatch
from coldbrew.aio import sleep_unless
from coldbrew.app import App
from coldbrew.breaker import Breakers
from coldbrew.broker import Broker
from coldbrew.caps import CapGate, Scope
from coldbrew.deliveries import Inbound, settle, settle_soon
from coldbrew.errors import (
    BrokerUnavailable,
    ConfigurationError,
    ContractViolation,
    DatabaseUnavailable,
    UnknownJobType,
)
from coldbrew.jobstate import Delivery, InFlight
from coldbrew.metrics import Metrics, MetricsServer
from coldbrew.model import parse_envelope
from coldbrew.procpool import ProcessPool
from coldbrew.relay import Relay, run_periodically
from coldbrew.runner import JobRunner
from coldbrew.scheduler import TOP_CLASS, FairScheduler, Pending
from coldbrew.settings import Settings
from coldbrew.stats import StatsSnapshot
from coldbrew.store import JobStore, JobTypeSettings, TenantSettings
from coldbrew.sweeper import QueueSweeper
from coldbrew.tenants import TenantQueues
from coldbrew.topology import Topology

log = structlog.get_logger("coldbrew.worker")


@dataclass(frozen=True, slots=True)
class _Parts:
    """What ``run()`` opened; the loops and callbacks use these."""

    store: JobStore
    broker: Broker
    runner: JobRunner
    tenants: TenantQueues
    stats: StatsSnapshot


Reject = tuple[Inbound, ContractViolation]


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
        # COLDBREW_AGING_SECONDS bounds a priority-0 job's wait: it climbs one
        # of the scheduler's ten classes per tenth of it, then is overdue.
        self.scheduler: FairScheduler[Delivery] = FairScheduler(
            aging_seconds=settings.aging_seconds / TOP_CLASS
        )
        # which queues may hide low-priority messages behind a stream (aging.py)
        self.starvation = StarvationWatch(settings.aging_seconds / 2)
        self.ready = asyncio.Event()
        self.metrics_port: int | None = None
        self._stop = asyncio.Event()
        self._loops_stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._db_ok = True
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._rejects: asyncio.Queue[Reject] = asyncio.Queue()
        self._consumed: set[tuple[str, str]] = set()
        self._paused: frozenset[str] = frozenset()
        self.caps = CapGate(
            scheduler=self.scheduler,
            aging_seconds=settings.aging_seconds / TOP_CLASS,
            metrics=self.metrics,
            dispatch=self._dispatch,
            listening=lambda: self._parts.tenants.cap_listening,
        )
        broker_timeout = settings.broker_consumer_timeout_seconds
        # held deliveries are handed back before RabbitMQ's consumer_timeout would
        # close the channel under them (SEMANTICS §1)
        self.hold_limit = broker_timeout - 60.0 if broker_timeout > 120 else broker_timeout / 2
        self._fatal: BaseException | None = None
        self._started: _Parts | None = None
        self._sweeper: QueueSweeper | None = None

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
            self._stop.set()
        else:
            loop.call_soon_threadsafe(self._stop.set)

    async def run(self) -> None:
        """Start, serve until ``stop()``, drain, and close everything that was opened."""
        self._loop = asyncio.get_running_loop()
        async with AsyncExitStack() as stack:
            await self._start(stack)
            try:
                async with asyncio.TaskGroup() as group:
                    self._start_loops(group)
                    await self._consume_all()
                    self.ready.set()
                    log.info(
                        "worker_ready",
                        worker_id=self.settings.worker_id,
                        lanes=self.lanes,
                        concurrency=self.settings.concurrency,
                        processes=self.settings.processes if self.app.needs_process_pool else 0,
                    )
                    await self._stop.wait()
                    await self._drain()
                    self._loops_stop.set()
            finally:
                self.ready.clear()
        if self._fatal is not None:
            raise self._fatal
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

    async def _start(self, stack: AsyncExitStack) -> None:
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
            is_healthy=self._health,
            is_ready=self._readiness,
        )
        await stack.enter_async_context(server)
        self.metrics_port = server.port
        self._started = self._build_parts(store, broker, pool)
        stack.push_async_callback(self._started.runner.close)  # before the broker closes

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

    def _build_parts(self, store: JobStore, broker: Broker, pool: ProcessPool | None) -> _Parts:
        settings = self.settings
        breakers = Breakers(
            failure_threshold=settings.breaker_failure_threshold,
            reset_seconds=settings.breaker_reset_seconds,
            on_state=self.metrics.set_breaker_state,
        )
        store.on_capped_claim = self.caps.capped_claim_done
        runner = JobRunner(
            settings=settings,
            store=store,
            broker=broker,
            pool=pool,
            metrics=self.metrics,
            inflight=self.inflight,
            is_stopping=lambda: self._closing,
            on_db_health=self._set_db_ok,
            breakers=breakers,
            on_reject=self._reject,  # a claim whose data PostgreSQL refused: dead-lettered
        )
        self.metrics.watch_group_commits([store.claims, store.completions, store.releases])
        stats = StatsSnapshot(store, max_tenants=settings.metrics_max_tenants)
        stats.register(self.metrics)
        tenants = TenantQueues(
            store=store,
            broker=broker,
            topology=self.topology,
            metrics=self.metrics,
            on_queue=self._consume_tenant,
            on_reject=self._reject,
            on_settings=self._apply_tenant_settings,
            on_cap_freed=self._cap_freed_elsewhere,
        )
        return _Parts(store, broker, runner, tenants, stats)

    @property
    def _parts(self) -> _Parts:
        if self._started is None:
            raise RuntimeError("the worker's parts are used before run() opened them")
        return self._started

    def _start_loops(self, group: asyncio.TaskGroup) -> None:
        relay = Relay(self._parts.store, self._parts.broker, self.metrics)
        stop = self._loops_stop
        settings = self.settings
        group.create_task(
            run_periodically(
                "relay",
                relay.publish_due,
                interval=settings.relay_interval_seconds,
                stop=stop,
                full_batch=relay.batch,
            ),
            name="relay",
        )
        group.create_task(
            run_periodically(
                "reaper",
                relay.reap_expired,
                interval=settings.reaper_interval_seconds,
                stop=stop,
                full_batch=500,
            ),
            name="reaper",
        )
        sweeper = self._sweeper = QueueSweeper(
            watch=self.starvation,
            broker=self._parts.broker,
            topology=self.topology,
            metrics=self.metrics,
            accept=self._accept_swept,
            is_closing=lambda: self._closing,
            limit=settings.aging_sweep_limit,
            keep_max=settings.effective_prefetch,
            aging_seconds=settings.aging_seconds,
        )
        group.create_task(
            run_periodically(
                "aging-sweep",
                sweeper.sweep_due,
                interval=self.starvation.window / 4,
                stop=stop,
                full_batch=1 << 30,  # never again at once: due queues were all swept
            ),
            name="aging-sweep",
        )
        group.create_task(self._heartbeat_loop(), name="heartbeat")
        group.create_task(self._reject_loop(), name="dead-letters")
        group.create_task(self._health_loop(), name="db-health")
        group.create_task(
            run_periodically(
                "stats",
                self._parts.stats.refresh,
                interval=settings.stats_interval_seconds,
                stop=stop,
                full_batch=1,
            ),
            name="stats",
        )
        group.create_task(
            self._parts.tenants.watch(stop, settings.tenant_resync_seconds), name="tenant-watch"
        )

    async def _consume_all(self) -> None:
        for lane in self.lanes:
            await self._parts.tenants.ensure(lane, "default")
        await self._parts.tenants.sync()
        await self._parts.broker.consume(
            self.topology.unrouted_queue,
            self.topology.unrouted_queue_arguments(),
            self._parts.tenants.on_unrouted,
        )

    async def _consume_tenant(self, queue: str, tenant: str) -> None:
        """Consume one (lane, tenant) queue if it is one of our lanes (idempotent)."""
        if queue not in self.lanes or (queue, tenant) in self._consumed or self._closing:
            return
        self._consumed.add((queue, tenant))
        try:
            await self._parts.broker.consume(
                self.topology.job_queue(queue, tenant),
                self.topology.job_queue_arguments(),
                self._on_message,
            )
        except BaseException:
            self._consumed.discard((queue, tenant))
            raise
        log.info("consuming", queue=queue, tenant=tenant)

    # --- intake and dispatch -------------------------------------------------------

    async def _on_message(self, message: Inbound) -> None:
        """Consumer callback: check the contract, then hold the delivery for a job slot."""
        if self._closing:
            await settle(message, requeue=True)
            return
        self._hold(message, time.monotonic(), observe=True)

    def _accept_swept(self, message: Inbound, arrived: float) -> None:
        """An aging sweep kept ``message``: it waits as if it had arrived at ``arrived``."""
        if self._closing:
            settle_soon(message, requeue=True)
            return
        self._hold(message, arrived, observe=False)

    def _hold(self, message: Inbound, arrived: float, *, observe: bool) -> None:
        try:
            delivery = self._parse(message)
        except ContractViolation as violation:
            self._reject(message, violation)
            return
        env = delivery.envelope
        if env.priority_clamped:
            self.metrics.priority_clamped.inc()
        if message.redelivered:
            swept = self._sweeper is not None and self._sweeper.returned_here(message.message_id)
            self.metrics.redeliveries.labels("aging_sweep" if swept else "broker_flag").inc()
        if observe:  # a sweep's messages prove nothing about the queue's priority levels
            self.starvation.observe((env.queue, env.tenant), env.priority, arrived)
        pending = Pending(env.tenant, env.priority, arrived, delivery)
        if self._starts_at_once(pending):
            self._launch(pending, ())
        else:
            self.scheduler.push(pending)
            self._dispatch()

    def _starts_at_once(self, pending: Pending[Delivery]) -> bool:
        """Whether ``pending`` may skip the scheduler: a slot is free and nothing else waits.

        Then the scheduler would pick it anyway; skipping its heaps saves
        ~5% of a busy worker's CPU (bench/throughput.py profile). Such a
        job is not charged to its tenant's fair share, which matters only
        while others wait, and then this path is not taken.
        """
        return (
            self._running < self.settings.concurrency
            and not self.scheduler
            and not self._closing
            and not self.caps.active
            and pending.tenant not in self._paused
            and not self.caps.scopes(pending)
        )

    def _parse(self, message: Inbound) -> Delivery:
        envelope = parse_envelope(
            message.body,
            routing_key=message.routing_key or "",
            message_id=message.message_id,
            headers=message.headers,
            priority=message.priority,
            max_body_bytes=self.settings.max_body_bytes,
        )
        try:
            spec = self.app.get(envelope.type)
        except UnknownJobType as exc:
            raise ContractViolation("unknown_type", str(exc)) from None
        return Delivery(message, envelope, spec, spec.validate_args(envelope.args))

    def _apply_tenant_settings(
        self, tenants: list[TenantSettings], types: list[JobTypeSettings]
    ) -> None:
        """Weights go to the scheduler; paused tenants are held; caps route claims."""
        for tenant in tenants:
            self.scheduler.set_weight(tenant.name, tenant.weight)
            self.caps.set_weight(tenant.name, tenant.weight)
        paused = frozenset(t.name for t in tenants if t.paused)
        if paused != self._paused:
            log.info("paused_tenants", tenants=sorted(paused))
            self._paused = paused
        tenant_caps = {t.name: t.max_running for t in tenants if t.max_running is not None}
        type_caps = {t.name: t.max_running for t in types if t.max_running is not None}
        if self.caps.set_caps(tenant_caps, type_caps):
            log.info("fleet_caps", tenants=tenant_caps, types=type_caps)
        self._dispatch()

    def _eligible(self, tenant: str) -> bool:
        if tenant in self._paused:
            return False
        return not self.caps.blocked(("tenant", tenant))

    def _dispatch(self) -> None:
        """Start jobs while there are free slots and held deliveries."""
        limit = self.settings.concurrency
        while self._running < limit and not self._closing:
            pending = self.caps.take_held()
            if pending is None:
                eligible = self._eligible if self._paused or self.caps.active else None
                pending = self.scheduler.pop(time.monotonic(), eligible)
                if pending is None:
                    return
            scopes = self.caps.scopes(pending)
            if scopes and not self._begin_capped_claim(pending, scopes):
                continue
            self._launch(pending, scopes)

    def _launch(self, pending: Pending[Delivery], scopes: tuple[Scope, ...]) -> None:
        self._running += 1
        task = asyncio.create_task(self._run_one(pending, scopes))
        self._tasks.add(task)
        task.add_done_callback(self._job_done)

    async def _run_one(self, pending: Pending[Delivery], scopes: tuple[Scope, ...]) -> None:
        if not scopes:
            await self._parts.runner.process(pending.payload)
            return
        try:
            verdict = await self._parts.runner.process(pending.payload, capped=True)
        except BaseException:
            self.caps.claim_over(pending)
            raise
        if verdict is not None and self._closing:  # the drain handed the others back
            self.caps.claim_over(pending)
            await settle(pending.payload.message, requeue=True)
        elif verdict is not None:  # "capped:<scope>[:busy]": hold it, not nack it
            self.caps.park(pending, verdict)
        else:  # it ran here (or was a duplicate): a place of its scopes may have freed
            self.caps.job_done(pending, scopes, draining=self._closing)
        self._dispatch()

    # --- fleet-wide caps: ``CapGate`` (caps.py) decides, the worker asks and tells ----

    def _begin_capped_claim(self, pending: Pending[Delivery], scopes: tuple[Scope, ...]) -> bool:
        """Mark the claim of ``pending`` in flight for its scopes; False when one is blocked,
        and then ``pending`` waits (a tenant's in the scheduler, a type's in its ``held``)."""
        if not self._eligible(pending.tenant):  # a held type delivery whose tenant is held back
            self.scheduler.push(pending)
            return False
        return self.caps.begin_claim(pending, scopes)

    def _cap_freed_elsewhere(self, payload: str, pid: int) -> None:
        """NOTIFY ``<ns>.caps`` (``tenant:x`` or ``type:y``): a place freed somewhere in the
        fleet; the gate wakes whatever of that scope waits here."""
        if self._started is None or self._parts.store.is_own_backend(pid):
            return  # our own completion: already woken here, after its commit
        self.caps.freed_elsewhere(payload)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._running -= 1
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("job_task_crashed", error=repr(exc), exc_info=exc)
            self._fatal = exc
            self.stop()
        self._dispatch()

    # --- dead letters for contract violations -----------------------------------

    def _reject(self, message: Inbound, violation: ContractViolation) -> None:
        self._rejects.put_nowait((message, violation))

    async def _reject_loop(self) -> None:
        """Store rejected messages with their bytes, copy them to ``<ns>.dead``, then ack."""
        while not self._loops_stop.is_set():
            try:
                first = await asyncio.wait_for(self._rejects.get(), timeout=0.5)
            except TimeoutError:
                continue
            batch = [first]
            while len(batch) < 200 and not self._rejects.empty():
                batch.append(self._rejects.get_nowait())
            await self._dead_letter(batch)
        while not self._rejects.empty():
            message, _ = self._rejects.get_nowait()
            await settle(message, requeue=True)

    async def _dead_letter(self, batch: list[Reject]) -> None:
        rows = [
            (
                v.reason,
                v.detail,
                m.message_id,
                m.routing_key or "",
                _json_headers(m.headers),
                m.body,
            )
            for m, v in batch
        ]
        delay = 0.2
        while True:
            try:
                await self._parts.store.insert_rejected(rows)
                for message, violation in batch:
                    await self._parts.broker.publish_dead(
                        message.body,
                        reason=violation.reason,
                        detail=violation.detail,
                        headers=message.headers or {},
                        message_id=message.message_id,
                        original_routing_key=message.routing_key or "",
                    )
                break
            except (DatabaseUnavailable, BrokerUnavailable) as exc:
                if self._loops_stop.is_set():
                    return
                log.warning("dead_letter_delayed", error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        for message, violation in batch:
            self.metrics.dead_letters.labels(violation.reason).inc()
            log.warning(
                "message_rejected",
                reason=violation.reason,
                detail=violation.detail[:300],
                message_id=message.message_id,
                routing_key=message.routing_key,
            )
            await settle(message)

    # --- leases, progress and health -------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """Flush progress every tick; extend all leases in one UPDATE every heartbeat."""
        settings = self.settings
        loop = asyncio.get_running_loop()
        tick = min(settings.progress_flush_seconds, settings.heartbeat_seconds)
        next_beat = loop.time() + settings.heartbeat_seconds
        while not self._loops_stop.is_set():
            await sleep_unless(self._loops_stop, tick)
            try:
                await self._flush_progress()
                now = loop.time()
                if now >= next_beat:
                    self.metrics.heartbeat_lag.set(now - next_beat)
                    next_beat = now + settings.heartbeat_seconds
                    await self._extend_leases()
                    await self._requeue_stale_holds()
            except DatabaseUnavailable as exc:
                self._set_db_ok(False)
                log.warning("heartbeat_failed", error=str(exc))

    async def _flush_progress(self) -> None:
        updates = self.inflight.take_progress()
        if updates:
            await self._parts.store.write_progress(updates)

    async def _extend_leases(self) -> None:
        held = self.inflight.held()
        if not held:
            return
        alive = await self._parts.store.extend_leases(held, self.settings.lease_seconds)
        self.metrics.lease_extensions.inc(len(alive))
        for job_id, attempt in held:
            state = self.inflight.get(job_id)
            if state is None or state.attempt != attempt:
                continue  # finished while the heartbeat was in flight
            if job_id not in alive:
                self.metrics.leases_lost.inc()
                log.warning("lease_lost", job_id=job_id, attempt=attempt)
                self._parts.runner.stop(state, "fenced")
            elif (reason := alive[job_id]) is not None:
                log.info("job_cancel_requested", job_id=job_id, reason=reason)
                self._parts.runner.stop(state, f"cancelled: {reason}")

    async def _requeue_stale_holds(self) -> None:
        """Hand back deliveries held unclaimed for too long (a saturated worker, a full cap).

        RabbitMQ's consumer_timeout would otherwise close the consuming
        channel; requeued, they go to whichever worker has room, or come back.
        """
        cutoff = time.monotonic() - self.hold_limit
        stale = self.scheduler.remove_where(lambda p: p.enqueued_at < cutoff)
        stale.extend(self.caps.remove_held_where(lambda p: p.enqueued_at < cutoff))
        for pending in stale:
            self.metrics.held_requeued.inc()
            await settle(pending.payload.message, requeue=True)
        if stale:
            log.info("held_deliveries_requeued", count=len(stale))

    async def _health_loop(self) -> None:
        while not self._loops_stop.is_set():
            try:
                await self._parts.store.ping()
                self._set_db_ok(True)
            except DatabaseUnavailable:
                self._set_db_ok(False)
            await sleep_unless(self._loops_stop, 5.0)

    def _set_db_ok(self, ok: bool) -> None:
        if ok != self._db_ok:
            log.info("database_health", ok=ok)
        self._db_ok = ok

    def _health(self) -> tuple[bool, str]:
        if self._fatal is not None:
            return False, f"fatal: {self._fatal!r}"
        return True, "ok"

    def _readiness(self) -> tuple[bool, str]:
        if self._closing:
            return False, "draining"
        if not self.ready.is_set():
            return False, "starting"
        if self._started is None or not self._started.broker.connected:
            return False, "RabbitMQ connection lost; reconnecting"
        if not self._db_ok:
            return False, "PostgreSQL unreachable"
        if self._started.broker.consuming == 0:
            return False, "not consuming any queue"
        return True, "ok"

    # --- drain --------------------------------------------------------------------

    async def _drain(self) -> None:
        """Stop consuming, finish or release in-flight jobs, requeue held deliveries."""
        self._closing = True
        self.ready.clear()
        log.info("worker_draining", in_flight=len(self._tasks), held=len(self.scheduler))
        await self._parts.broker.cancel_consumers()
        waiting = self.scheduler.drain()
        waiting.extend(self.caps.drain())
        for pending in waiting:
            await settle(pending.payload.message, requeue=True)
        grace = self.settings.shutdown_grace_seconds
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)
        if self._tasks:
            log.info("releasing_jobs", count=len(self.inflight))
            for state in self.inflight.states():
                self._parts.runner.stop(state, "released")
            await asyncio.wait(set(self._tasks), timeout=15.0)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)
        # deliveries of asynchronously committed claims: acked once durable, else requeued
        await self._parts.runner.settle_claim_acks(timeout=10.0)
        if freed := self.caps.freed_at_drain():  # released jobs freed places: tell the fleet
            with contextlib.suppress(DatabaseUnavailable):
                await self._parts.store.notify_caps_freed(freed)


def _json_headers(headers: Any) -> dict[str, Any] | None:
    """Headers as JSON-safe values (bytes decoded, dates as text) for the rejected table."""
    if not headers:
        return None
    safe: dict[str, Any] = {}
    for key, value in dict(headers).items():
        if isinstance(value, bytes):
            safe[key] = value.decode("utf-8", "replace")
        elif isinstance(value, str | int | float | bool) or value is None:
            safe[key] = value
        else:
            safe[key] = repr(value)
    return safe
