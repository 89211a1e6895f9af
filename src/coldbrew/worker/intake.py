"""The intake: a delivery's route from the consumer callback to a running job.

Read top to bottom, this is what happens to a delivery before the runner
(runner.py) claims it:

1. **hold** -- the consumer callback (or an aging sweep) hands it in; while
   the worker drains it goes straight back to the broker;
2. **parse** -- the contract checks (model.parse_envelope, the app's job
   spec, the args model); a violation goes to the dead letters with its
   reason, never into a job slot;
3. **schedule** -- with a free slot and nothing else waiting it starts at
   once, else it waits in the fair scheduler (weights, aging, paused
   tenants) and, for capped tenants and types, behind the cap gate; a
   paused lane's delivery waits aside (``_lane_held``) until its lane resumes;
4. **dispatch** -- while slots are free, the best eligible delivery is
   launched as a task that runs ``JobRunner.process`` (claim -> run ->
   fenced outcome -> settle) and tells the cap gate what became of it.

A delivery held longer than ``hold_limit`` is handed back before RabbitMQ's
consumer_timeout would close its channel (``return_stale``, called by the
held-deliveries service). The drain hands every held delivery back.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

import structlog

from coldbrew.aging import StarvationWatch
from coldbrew.app import App
from coldbrew.caps import CapGate, Capped, Scope
from coldbrew.errors import ContractViolation, UnknownJobType
from coldbrew.jobstate import Delivery
from coldbrew.metrics import Metrics
from coldbrew.model import parse_envelope
from coldbrew.ratelimit import Rate, default_burst, rate_key_value
from coldbrew.rates import Bucket, RateGate, RateLimited
from coldbrew.scheduler import TOP_CLASS, FairScheduler, Pending
from coldbrew.settings import Settings
from coldbrew.store import JobStore, JobTypeSettings, LaneSettings, TenantSettings
from coldbrew.transport import Inbound
from coldbrew.worker.aging_sweep import SweepReturns
from coldbrew.worker.consumer_hold import ConsumerHold
from coldbrew.worker.dead_letters import DeadLetters
from coldbrew.worker.lifecycle import Lifecycle
from coldbrew.worker.runner import JobRunner

log = structlog.get_logger("coldbrew.worker")


class Intake:
    """Holds parsed deliveries and starts them as job slots free up."""

    def __init__(
        self,
        *,
        app: App,
        settings: Settings,
        metrics: Metrics,
        lifecycle: Lifecycle,
        runner: JobRunner,
        store: JobStore,
        dead_letters: DeadLetters,
        starvation: StarvationWatch,
        sweep_returns: SweepReturns,
        cap_listening: Callable[[], bool],
        hold: ConsumerHold,
    ) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.lifecycle = lifecycle
        self.runner = runner
        self.store = store
        self.dead_letters = dead_letters
        self.starvation = starvation
        self.sweep_returns = sweep_returns
        self.hold = hold
        # COLDBREW_AGING_SECONDS bounds a priority-0 job's wait: it climbs one
        # of the scheduler's ten classes per tenth of it, then is overdue.
        self.scheduler: FairScheduler[Delivery] = FairScheduler(
            aging_seconds=settings.aging_seconds / TOP_CLASS
        )
        self.caps = CapGate(
            scheduler=self.scheduler,
            aging_seconds=settings.aging_seconds / TOP_CLASS,
            metrics=metrics,
            dispatch=self.dispatch,
            listening=cap_listening,
        )
        self.rates = RateGate(
            scheduler=self.scheduler,
            aging_seconds=settings.aging_seconds / TOP_CLASS,
            metrics=metrics,
            dispatch=self.dispatch,
        )
        broker_timeout = settings.broker_consumer_timeout_seconds
        # held deliveries are handed back before RabbitMQ's consumer_timeout would
        # close the channel under them (SEMANTICS §1)
        self.hold_limit = broker_timeout - 60.0 if broker_timeout > 120 else broker_timeout / 2
        self.running = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self._paused: frozenset[str] = frozenset()
        self._paused_lanes: frozenset[str] = frozenset()
        self._lane_held: list[Pending[Delivery]] = []
        """Deliveries of paused lanes, unclaimed, in arrival order, until their lane resumes
        (outside the scheduler, whose eligibility is per tenant, not per lane)."""

    # --- 1. hold ------------------------------------------------------------------

    async def on_message(self, message: Inbound) -> None:
        """Consumer callback of every tenant queue."""
        if self.lifecycle.draining:
            await message.requeue()
            return
        self._hold(message, time.monotonic(), observe=True)

    def accept_swept(self, message: Inbound, arrived: float) -> None:
        """An aging sweep kept ``message``: it waits as if it had arrived at ``arrived``."""
        if self.lifecycle.draining:
            message.requeue_soon()
            return
        self._hold(message, arrived, observe=False)

    def _hold(self, message: Inbound, arrived: float, *, observe: bool) -> None:
        try:
            delivery = self._parse(message)
        except ContractViolation as violation:
            self.dead_letters.reject(message, violation)
            return
        env = delivery.envelope
        if env.priority_clamped:
            self.metrics.priority_clamped.inc()
        if env.trace_ignored is not None:  # the job runs as if the producer sent none
            self.metrics.trace_headers_ignored.labels(env.trace_ignored).inc()
            log.info("trace_header_ignored", job_id=env.id, reason=env.trace_ignored)
        if message.redelivered:
            swept = self.sweep_returns.returned_here(message.message_id)
            self.metrics.redeliveries.labels("aging_sweep" if swept else "broker_flag").inc()
        if observe:  # a sweep's messages prove nothing about the queue's priority levels
            self.starvation.observe((env.queue, env.tenant), env.priority, arrived)
        self._schedule(Pending(env.tenant, env.priority, arrived, delivery))

    # --- 2. parse -----------------------------------------------------------------

    def _parse(self, message: Inbound) -> Delivery:
        envelope = parse_envelope(
            message.body,
            routing_key=message.routing_key or "",
            message_id=message.message_id,
            headers=message.headers,
            priority=message.priority,
            max_body_bytes=self.settings.max_body_bytes,
            allow_private_webhooks=self.settings.webhook_allow_private,
        )
        try:
            spec = self.app.get(envelope.type)
        except UnknownJobType as exc:
            raise ContractViolation("unknown_type", str(exc)) from None
        args = spec.validate_args(envelope.args)
        rate_key = None
        if spec.rate_limit is not None:  # a key that cannot be read: dead-lettered, reason rate_key
            rate_key = rate_key_value(spec.name, spec.rate_key, args)
        return Delivery(message, envelope, spec, args, rate_key)

    # --- 3. schedule ----------------------------------------------------------------

    def _schedule(self, pending: Pending[Delivery]) -> None:
        if self._lane_paused(pending):
            self._lane_held.append(pending)
        elif self._starts_at_once(pending):
            self._launch(pending, (), ())
        else:
            self.scheduler.push(pending)
            self.dispatch()
            self.hold.note(self.running, len(self.scheduler))

    def _starts_at_once(self, pending: Pending[Delivery]) -> bool:
        """Whether ``pending`` may skip the scheduler: a slot is free and nothing else waits.

        Then the scheduler would pick it anyway; skipping its heaps saves
        ~5% of a busy worker's CPU (bench/throughput.py profile). Such a
        job is not charged to its tenant's fair share, which matters only
        while others wait, and then this path is not taken.
        """
        return (
            self.running < self.settings.concurrency
            and not self.scheduler
            and not self.lifecycle.draining
            and not self.caps.active
            and not self.rates.active
            and pending.tenant not in self._paused
            and not self.caps.scopes(pending)
            and not self.rates.buckets(pending)
        )

    def apply_tenant_settings(
        self, tenants: list[TenantSettings], types: list[JobTypeSettings]
    ) -> None:
        """Weights go to the scheduler; paused tenants are held; caps route claims."""
        for tenant in tenants:
            self.scheduler.set_weight(tenant.name, tenant.weight)
            self.caps.set_weight(tenant.name, tenant.weight)
            self.rates.set_weight(tenant.name, tenant.weight)
        paused = frozenset(t.name for t in tenants if t.paused)
        if paused != self._paused:
            log.info("paused_tenants", tenants=sorted(paused))
            self._paused = paused
        tenant_caps = {t.name: t.max_running for t in tenants if t.max_running is not None}
        type_caps = {t.name: t.max_running for t in types if t.max_running is not None}
        if self.caps.set_caps(tenant_caps, type_caps):
            log.info("fleet_caps", tenants=tenant_caps, types=type_caps)
        tenant_rates = {t.name: _rate(t.rate_per_second, t.rate_burst) for t in tenants}
        type_rates = {t.name: _rate(t.rate_per_second, t.rate_burst) for t in types}
        if self.rates.set_rates(
            {k: r for k, r in tenant_rates.items() if r is not None},
            {k: r for k, r in type_rates.items() if r is not None},
        ):
            log.info("fleet_rates", tenants=_shown(tenant_rates), types=_shown(type_rates))
        self.dispatch()

    def cap_freed_elsewhere(self, payload: str, pid: int) -> None:
        """NOTIFY ``<ns>.caps`` (``tenant:x`` or ``type:y``): a place freed somewhere in the
        fleet; the gate wakes whatever of that scope waits here."""
        if self.store.is_own_backend(pid):
            return  # our own completion: already woken here, after its commit
        self.caps.freed_elsewhere(payload)

    def _lane_paused(self, pending: Pending[Delivery]) -> bool:
        return bool(self._paused_lanes) and pending.payload.envelope.queue in self._paused_lanes

    def apply_lanes(self, lanes: list[LaneSettings]) -> None:
        """Paused lanes are held (new deliveries and those waiting here); a resumed lane's
        held deliveries go back to the scheduler, in their arrival order."""
        paused = frozenset(lane.name for lane in lanes if lane.paused)
        if paused == self._paused_lanes:
            return
        log.info("paused_lanes", lanes=sorted(paused))
        self._paused_lanes = paused
        held, self._lane_held = self._lane_held, []
        for pending in held:
            self._schedule(pending)
        if paused:  # deliveries of a newly paused lane waiting in the scheduler: aside
            self._lane_held.extend(self.scheduler.remove_where(self._lane_paused))
        self.dispatch()

    def _eligible(self, tenant: str) -> bool:
        if tenant in self._paused:
            return False
        return not self.caps.blocked(("tenant", tenant)) and not self.rates.tenant_blocked(tenant)

    # --- 4. dispatch ----------------------------------------------------------------

    def dispatch(self) -> None:
        """Start jobs while there are free slots and held deliveries."""
        limit = self.settings.concurrency
        while self.running < limit and not self.lifecycle.draining:
            pending = self.caps.take_held() or self.rates.take_held()
            if pending is None:
                gated = self._paused or self.caps.active or self.rates.active
                pending = self.scheduler.pop(time.monotonic(), self._eligible if gated else None)
                if pending is None:
                    return
            if self._lane_paused(pending):  # held by a gate when its lane was paused
                self._lane_held.append(pending)
                continue
            scopes = self.caps.scopes(pending)
            buckets = self.rates.buckets(pending)
            if (scopes or buckets) and not self._begin_gated_claim(pending, scopes, buckets):
                continue
            self._launch(pending, scopes, buckets)

    def _begin_gated_claim(
        self, pending: Pending[Delivery], scopes: tuple[Scope, ...], buckets: tuple[Bucket, ...]
    ) -> bool:
        """Mark the claim of ``pending`` in flight for its cap scopes and rate buckets; False
        when one is blocked, and then ``pending`` waits (a tenant's in the scheduler, a
        type's or key's in its gate's ``held``)."""
        if not self._eligible(pending.tenant):  # a held delivery whose tenant is held back
            self.scheduler.push(pending)
            return False
        if buckets and not self.rates.begin_claim(pending, buckets):
            return False
        if scopes and not self.caps.begin_claim(pending, scopes):
            self.rates.claim_over(pending)
            return False
        return True

    def _launch(
        self, pending: Pending[Delivery], scopes: tuple[Scope, ...], buckets: tuple[Bucket, ...]
    ) -> None:
        self.running += 1
        self.hold.note(self.running, len(self.scheduler))
        task = asyncio.create_task(self._run_one(pending, scopes, buckets))
        self.tasks.add(task)
        task.add_done_callback(self._job_done)

    async def _run_one(
        self, pending: Pending[Delivery], scopes: tuple[Scope, ...], buckets: tuple[Bucket, ...]
    ) -> None:
        if not scopes and not buckets:
            await self.runner.process(pending.payload)
            return
        delivery = pending.payload
        began = time.monotonic()  # a rate limit's wait counts from the claim's transaction
        try:
            claim = await self.runner.claim_gated(
                delivery, capped=bool(scopes), buckets=buckets, peek=self.rates.contested(buckets)
            )
            if claim is None:  # refused, or drained during an outage: settled already
                self._claims_over(pending)
                return
            if isinstance(claim, Capped):  # no room: hold it (not nack it) until a wake
                self.rates.claim_over(pending)
                self._park(pending, claim)
                return
            if isinstance(claim, RateLimited):  # no token: hold it until the token is due
                self.caps.claim_over(pending)
                self._park_limited(pending, claim, began)
                return
            # before the job runs: the next of its scopes and buckets may try now
            self.caps.capped_claim_done(claim)
            self.rates.claim_done(claim, began)
            await self.runner.run_claimed(delivery, claim, lingers=not scopes)
        except BaseException:
            self._claims_over(pending)
            raise
        # it ran here (or was a duplicate): a place of its scopes may have freed
        self.caps.job_done(pending, scopes, draining=self.lifecycle.draining)
        self.dispatch()

    def _claims_over(self, pending: Pending[Delivery]) -> None:
        self.caps.claim_over(pending)
        self.rates.claim_over(pending)

    def _park_limited(self, pending: Pending[Delivery], limited: RateLimited, began: float) -> None:
        if self.lifecycle.draining:  # the drain handed the others back: this one too
            pending.payload.message.requeue_soon()
        else:
            self.rates.park(pending, limited, began)
        self.dispatch()

    def _park(self, pending: Pending[Delivery], capped: Capped) -> None:
        if self.lifecycle.draining:  # the drain handed the others back: this one too
            self.caps.claim_over(pending)
            pending.payload.message.requeue_soon()
        else:
            self.caps.park(pending, capped)
        self.dispatch()

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self.running -= 1
        self.hold.finished += 1
        self.tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("job_task_crashed", error=repr(exc), exc_info=exc)
            self.lifecycle.die(exc)
        self.dispatch()
        self.hold.note(self.running, len(self.scheduler))

    def held_by_queue(self) -> dict[tuple[str, str], int]:
        """Deliveries held here unclaimed, per (lane, tenant): in the scheduler or the cap
        gate, unacked and so in no queue's ready count (reconcile.py subtracts them)."""
        held: dict[tuple[str, str], int] = {}
        seen: set[int] = set()  # a claim in flight for a cap and a rate is in both gates
        gates = itertools.chain(self.caps.held_items(), self.rates.held_items())
        for pending in itertools.chain(self.scheduler.items(), gates, self._lane_held):
            if id(pending) in seen:
                continue
            seen.add(id(pending))
            env = pending.payload.envelope
            key = (env.queue, env.tenant)
            held[key] = held.get(key, 0) + 1
        return held

    # --- handing deliveries back ------------------------------------------------------

    async def return_stale(self) -> int:
        """Hand back deliveries held unclaimed for too long (a saturated worker, a full cap).

        RabbitMQ's consumer_timeout would otherwise close the consuming
        channel; requeued, they go to whichever worker has room, or come back.
        """
        cutoff = time.monotonic() - self.hold_limit
        stale = self.scheduler.remove_where(lambda p: p.enqueued_at < cutoff)
        stale.extend(self.caps.remove_held_where(lambda p: p.enqueued_at < cutoff))
        stale.extend(self.rates.remove_held_where(lambda p: p.enqueued_at < cutoff))
        stale.extend(p for p in self._lane_held if p.enqueued_at < cutoff)
        self._lane_held = [p for p in self._lane_held if p.enqueued_at >= cutoff]
        for pending in stale:
            self.metrics.held_requeued.inc()
            await pending.payload.message.requeue()
        if stale:
            log.info("held_deliveries_requeued", count=len(stale))
        return len(stale)

    async def return_all(self) -> None:
        """The drain: every delivery that waits here goes back to the broker."""
        waiting = self.scheduler.drain()
        waiting.extend(self.caps.drain())
        waiting.extend(self.rates.drain())
        waiting.extend(self._lane_held)
        self._lane_held = []
        for pending in waiting:
            await pending.payload.message.requeue()


def _rate(per_second: float | None, burst: int | None) -> Rate | None:
    """A tenant's or type's stored rate limit, with the default burst when none is set."""
    if per_second is None:
        return None
    return Rate(per_second, burst if burst is not None else default_burst(per_second))


def _shown(rates: dict[str, Rate | None]) -> dict[str, str]:
    return {name: str(rate) for name, rate in rates.items() if rate is not None}
