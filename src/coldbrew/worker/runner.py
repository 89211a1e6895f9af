"""Runs one delivery end to end: claim, ack, run, write the fenced outcome.

The delivery is a hint and the row is the truth (STYLE §8). The delivery is
acked once the claim has committed: from then on the row's lease guards the
job, and the reaper and relay run it again if this worker dies -- which is
what happened anyway with a later ack, since a redelivery of a job under a
live lease is a duplicate. Acking at the claim means a tenant queue's
prefetch only bounds the deliveries *waiting* in this worker, not its running
jobs, so it can be small (fairness), and RabbitMQ's consumer_timeout never
closes a channel under a long job. A delivery whose job is finished, or held
under a live lease elsewhere, is acked as a duplicate and not run.

With ``COLDBREW_CLAIM_COMMIT=async`` the claim commits without waiting for the
WAL flush and the job starts at once, but "committed" is not yet "durable":
the ack then waits in ``ClaimAcks`` (claimacks.py) until it is.

A process-pool job's claim and outcome may **linger** (batching.py) while
the pool's queue is long: a job claimed now waits for a child anyway, and a
finished job's child has already been handed to the next queued job, so
neither the claim nor the outcome is on any child's path. Each may then wait
up to ``COLDBREW_POOL_LINGER_SECONDS``, and at most half the time the queued
jobs keep the children busy, to share its commit with the next ones. CPU
jobs finish one at a time; alone, each claim and each outcome paid a commit
whose CPU (the worker's and PostgreSQL's) the full pool's children lost
(issue #19 item 4). Nothing is acked earlier and no write is skipped: the
claim still commits before the job runs and before its delivery is acked,
and the outcome is still fenced by attempt; the row's ``finished_at`` is
later by the linger. Capped jobs never linger: their fleet-wide place frees
at the outcome's commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog

from coldbrew import tracing
from coldbrew.app import App
from coldbrew.breaker import Breakers
from coldbrew.caps import Capped, claim_capped
from coldbrew.claimacks import ClaimAcks, HeldAck
from coldbrew.client import Client
from coldbrew.context import Context
from coldbrew.errors import (
    ContractViolation,
    DatabaseUnavailable,
    JobCancelled,
    JobTimeout,
    Snooze,
    UnstorableData,
)
from coldbrew.jobstate import Delivery, InFlight, JobState, Stop, Unwritten
from coldbrew.metrics import Metrics
from coldbrew.model import JobFields, Status
from coldbrew.procpool import ProcessPool
from coldbrew.rates import Bucket, RateLimited, claim_limited, claim_one_token
from coldbrew.settings import Settings
from coldbrew.store import Admission, ClaimRequest, ClaimResult, JobStore, Outcome, UniqueKey
from coldbrew.transport import Broker
from coldbrew.worker import outcomes
from coldbrew.worker.dead_letters import DeadLetters
from coldbrew.worker.lifecycle import Lifecycle
from coldbrew.worker.recorder import OutcomeWriter

log = structlog.get_logger("coldbrew.runner")

LINGER_SHARE_OF_QUEUE = 0.5
"""A pool job's claim or outcome lingers at most this share of the time the jobs already
queued for a child keep the children busy (``ProcessPool.queue_seconds``)."""
C = TypeVar(
    "C",
    ClaimResult,
    ClaimResult | Capped | RateLimited,
    ClaimResult | RateLimited,
    Admission,
)


class JobRunner:
    """Everything needed to run one claimed job; shared by all of a worker's jobs."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: JobStore,
        broker: Broker,
        pool: ProcessPool | None,
        metrics: Metrics,
        inflight: InFlight,
        lifecycle: Lifecycle,
        dead_letters: DeadLetters,
        breakers: Breakers | None = None,
        app: App | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.pool = pool
        self.metrics = metrics
        self.inflight = inflight
        self.lifecycle = lifecycle
        self.dead_letters = dead_letters  # a delivery whose data PostgreSQL refused goes there
        self._rand = random.Random()
        self.breakers = breakers
        # builds the children ctx.submit collects, as a submission of this app would
        self.requests = Client(settings, store, None, app)
        # COLDBREW_CLAIM_COMMIT=async: a delivery's ack waits until its claim is durable
        self.claim_acks: ClaimAcks | None = None
        if settings.claim_commit == "async":
            self.claim_acks = ClaimAcks(
                store.claims,
                metrics,
                delay=settings.claim_barrier_seconds,
                worker_id=settings.worker_id,
                stop_job=self._stop_lost,
            )
        self.writer = OutcomeWriter(
            store=store,
            broker=broker,
            metrics=metrics,
            lifecycle=lifecycle,
            claim_acks=self.claim_acks,
        )

    # --- one delivery -------------------------------------------------------------

    async def process(self, delivery: Delivery) -> None:
        """Claim, ack, run and record one delivery of no capped scope. Never raises
        (but CancelledError)."""
        request = self._claim_request(delivery)
        if not await self._webhook_noted(delivery, request, admitted=False):
            return
        if request.deferred and await self._deferred(delivery, request):
            return
        if not await self._admitted(delivery, request):
            return
        if not await self._webhook_noted(delivery, request, admitted=True):
            return
        linger = self._pool_linger(delivery)
        claim = await self._claim(delivery, lambda: self.store.claims.claim(request, linger=linger))
        if claim is not None:
            await self.run_claimed(delivery, claim)

    async def claim_capped(self, delivery: Delivery) -> ClaimResult | Capped | RateLimited | None:
        """The claim of a job whose tenant or type has a fleet-wide cap (caps/claim.py):
        ``Capped`` when the cap left no room; the caller holds the delivery then."""
        return await self.claim_gated(delivery, capped=True, buckets=())

    async def claim_gated(
        self,
        delivery: Delivery,
        *,
        capped: bool,
        buckets: tuple[Bucket, ...],
        peek: bool = False,
    ) -> ClaimResult | Capped | RateLimited | None:
        """The claim of a job with a fleet-wide cap (``capped``: caps/claim.py) or rate
        limits (``buckets``: rates/claim.py), or both: ``Capped`` when a cap left no room,
        ``RateLimited`` when a bucket had no token; the caller holds the delivery then.
        ``peek``: a single limit's bucket is contested (``RateGate.contested``)."""
        answer = await self._claim_gated(delivery, capped=capped, buckets=buckets, peek=peek)
        if isinstance(answer, RateLimited):  # recorded as waiting: not again next time
            delivery.waiting_recorded = True
        return answer

    async def _claim_gated(
        self, delivery: Delivery, *, capped: bool, buckets: tuple[Bucket, ...], peek: bool
    ) -> ClaimResult | Capped | RateLimited | None:
        request = self._claim_request(delivery)
        if not await self._webhook_noted(delivery, request, admitted=False):
            return None
        if request.deferred and await self._deferred(delivery, request):
            return None
        if not await self._admitted(delivery, request):
            return None
        if not await self._webhook_noted(delivery, request, admitted=True):
            return None
        if capped:
            return await self._claim(
                delivery, lambda: claim_capped(self.store.caps, request, buckets)
            )
        recorded = delivery.waiting_recorded
        if len(buckets) == 1:
            bucket = buckets[0]
            return await self._claim(
                delivery,
                lambda: claim_one_token(
                    self.store.caps, request, bucket, peek=peek, recorded=recorded
                ),
            )
        return await self._claim(
            delivery, lambda: claim_limited(self.store.caps, request, buckets, recorded=recorded)
        )

    async def _admitted(self, delivery: Delivery, request: ClaimRequest) -> bool:
        """Whether to claim the delivery: a job of a unique type whose row a raw producer
        left to the worker first takes its key (``store.unique``). A duplicate is acked and
        counted, its message id mapped to the job it duplicates; False then, or when the
        admission was refused or handed back as a claim would be."""
        opts = delivery.spec.unique
        if opts is None:  # the hot path: no statement, no lookup
            return True
        unique = UniqueKey.of(request, opts, delivery.args)
        admission = await self._claim(
            delivery,
            lambda: self.store.unique.admit_delivery(request, unique),
            "coldbrew admit",
        )
        if admission is None:
            return False
        if admission.duplicate_of is None:
            return True
        self.metrics.unique_duplicates.labels(request.type, "amqp").inc()
        log.info("unique_duplicate", job_id=request.id, duplicate_of=admission.duplicate_of)
        await delivery.message.ack()
        return False

    async def _webhook_noted(
        self, delivery: Delivery, request: ClaimRequest, *, admitted: bool
    ) -> bool:
        """A raw delivery naming ``x-webhook-url``: record the URL with the job's row before
        the claim (a unique type's once its admission inserted the row: ``admitted``), where
        the outcome's trigger finds it (migration 0012). The hot path (no URL) sends
        nothing. False when the delivery was settled instead (refused data, drained)."""
        url = request.webhook_url
        if url is None or (delivery.spec.unique is not None) != admitted:
            return True

        async def note() -> bool:
            if admitted:
                await self.store.webhooks.attach(request.id, url)
            else:
                grace = self.settings.relay_grace_seconds
                await self.store.webhooks.record(request, relay_grace=grace)
            return True

        try:
            noted = await self.writer.until_db_ok(note)
        except UnstorableData as exc:
            violation = ContractViolation("unstorable", f"PostgreSQL refused the job: {exc}")
            self.dead_letters.reject(delivery.message, violation)
            return False
        if noted is None:  # stopping while the database is away
            await delivery.message.requeue()
            return False
        return True

    async def _deferred(self, delivery: Delivery, request: ClaimRequest) -> bool:
        """A raw message asked for a later start (``x-run-at``/``x-delay-seconds``): record its
        job as ``scheduled`` and ack the delivery, so that it runs when the relay publishes it
        at its time. False (claim as usual): the row exists, or the time has come already.
        True also when the delivery was settled otherwise (refused data, drained)."""
        try:
            recorded = await self.writer.until_db_ok(lambda: self.store.jobs.defer_job(request))
        except UnstorableData as exc:
            violation = ContractViolation("unstorable", f"PostgreSQL refused the job: {exc}")
            self.dead_letters.reject(delivery.message, violation)
            return True
        if recorded is None:  # stopping while the database is away
            await delivery.message.requeue()
            return True
        if recorded:
            self.metrics.scheduled_deliveries.labels("deferred").inc()
            log.debug("job_deferred", job_id=request.id, run_at=request.run_at, delay=request.delay)
            await delivery.message.ack()
        return recorded

    async def _claim(
        self,
        delivery: Delivery,
        op: Callable[[], Awaitable[C]],
        span_name: str = "coldbrew claim",
    ) -> C | None:
        """Upsert and claim the delivery's job, waiting out a database outage.

        None when the claim's data was refused (the delivery is dead-lettered)
        or the worker drains during the outage (the delivery is handed back).
        """
        env = delivery.envelope
        try:
            with tracing.job_span(
                span_name, env, kind="consumer", destination=self.settings.namespace
            ) as span:
                claim = await self.writer.until_db_ok(op)
                if span is not None and isinstance(claim, ClaimResult):
                    tracing.set_attributes(span, _claim_attributes(claim))
        except UnstorableData as exc:  # the job's own data, not the worker's trouble
            violation = ContractViolation(
                "unstorable", f"PostgreSQL refused the job at claim: {exc}"
            )
            self.dead_letters.reject(delivery.message, violation)  # stored, copied, acked
            return None
        if claim is None:  # stopping while the database is away: let another worker have it
            await delivery.message.requeue()
        return claim

    def _pool_linger(self, delivery: Delivery) -> float:
        """How long a claim or an outcome of this job may wait to share a commit now: 0 but
        for a process-pool job while the pool's queue keeps every child busy (module
        docstring)."""
        cap = self.settings.pool_linger_seconds
        pool = self.pool
        if not cap or pool is None or delivery.spec.is_coroutine:
            return 0.0
        return min(cap, pool.queue_seconds() * LINGER_SHARE_OF_QUEUE)

    async def run_claimed(
        self, delivery: Delivery, claim: ClaimResult, *, lingers: bool = True
    ) -> None:
        """Ack, run and record a claimed job; ack a duplicate or a job that is done.
        ``lingers``: a pool job's ack and outcome may wait for company (not a capped job's:
        its place in the cap frees at the outcome's commit)."""
        message = delivery.message
        if not claim.claimed:
            adopted = await self._own_claim(claim)
            if adopted is None:
                await self._not_claimed(delivery, claim)
                return
            claim = adopted
        state = JobState(claim.id, claim.attempt, delivery, time.monotonic())
        if claim.mark is not None and self.claim_acks is not None:
            # committed asynchronously: ack once the claim is durable; the job starts now.
            # A pool job queued for a child may wait for a (lingering) completion's commit.
            patience = self._pool_linger(delivery) if lingers else 0.0
            held = HeldAck(claim.id, claim.attempt, claim.mark, message, state, patience=patience)
            self.claim_acks.hold(held)
        else:
            message.ack_soon()  # the lease guards the job from here; it need not wait for the ack
        self.inflight.add(state)
        if claim.attempt == 1 and claim.started_at is not None and claim.id.startswith("cron:"):
            self.metrics.observe_cron_start(claim.id, claim.started_at)
        handles = self.metrics.job_handles(delivery.envelope.queue, delivery.spec.name)
        handles.started.inc()
        if claim.waited is not None:
            handles.start_latency.observe(claim.waited)
        self.metrics.jobs_in_flight.inc()
        env = delivery.envelope
        try:
            with tracing.log_trace_id(env):  # the job's log lines carry its trace_id
                if self.lifecycle.draining:  # claimed during the drain: hand it straight back
                    state.stop = Stop.RELEASED
                    outcome: Outcome | Unwritten = Stop.RELEASED
                elif tracing.active():
                    outcome = await self._traced_run(state, claim)
                else:  # no coroutine of _traced_run's built per job
                    outcome = await self._run(state, claim)
                with tracing.job_span("coldbrew outcome", env, attempt=claim.attempt) as span:
                    if span is not None:  # off: no attributes built
                        tracing.set_attributes(span, _outcome_attributes(outcome))
                    linger = self._pool_linger(delivery) if lingers else 0.0
                    await self.writer.record(state, outcome, linger=linger)
        finally:
            self.inflight.remove(state)
            self.metrics.jobs_in_flight.dec()

    async def _own_claim(self, claim: ClaimResult) -> ClaimResult | None:
        """A claim refused because the row is ``running`` under *our* worker id while we do
        not run it: our own earlier try of this claim committed, and its answer was lost
        with the connection (``until_db_ok`` retried it; a failover that kept the claim).
        Acked as a duplicate, the job would wait a lease and the reaper's hold with nobody
        running it; adopted, it runs now. None: not ours (ack it as a duplicate).

        Rare (only refused ``running`` claims pay the two statements): a barrier first, so
        that the claim read is durable (it may have committed asynchronously), then its
        row, at this claim's attempt."""
        if claim.status != "running" or self.inflight.get(claim.id) is not None:
            return None

        async def read() -> Any:
            await self.store.claims.durability_barrier()
            return (await self.store.claims.verify_claims([claim.id])).get(claim.id)

        row = await self.writer.until_db_ok(read)
        if (
            row is None
            or row["status"] != "running"
            or row["worker_id"] != self.settings.worker_id
            or row["attempt"] != claim.attempt
            or self.inflight.get(claim.id) is not None
        ):
            return None
        log.warning("claim_adopted", job_id=claim.id, attempt=claim.attempt)
        return dataclasses.replace(claim, claimed=True, mark=None)

    def _claim_request(self, delivery: Delivery) -> ClaimRequest:
        return delivery.envelope.resolved(delivery.spec, self.settings.max_attempts)

    async def _not_claimed(self, delivery: Delivery, claim: ClaimResult) -> None:
        """The job is finished, held elsewhere, not due yet, or just ran out of attempts."""
        env = delivery.envelope
        if claim.status == "dead":
            await self.writer.publish_dead(delivery, "max_attempts", "retry budget spent at claim")
        elif claim.status == "scheduled":  # early: the relay publishes it at its run_at
            self.metrics.scheduled_deliveries.labels("early").inc()
            log.debug("early_delivery", job_id=env.id)
        else:
            self.metrics.duplicate_deliveries.labels(env.queue).inc()
            self.metrics.redeliveries.labels("duplicate").inc()
            log.debug("duplicate_delivery", job_id=env.id, status=claim.status)
        await delivery.message.ack()

    # --- running --------------------------------------------------------------------

    async def _traced_run(self, state: JobState, claim: ClaimResult) -> Outcome | Unwritten:
        """``_run`` in a ``coldbrew run`` span (tracing is on): linked to the previous
        attempt's run span on a retry; a retrying outcome first leaves this span in the
        row for the next attempt's link (tracing.py)."""
        env = state.delivery.envelope
        with tracing.job_span(
            "coldbrew run", env, attempt=claim.attempt, previous=env.previous_span
        ) as span:
            outcome = await self._run(state, claim)
            if span is None:
                return outcome
            tracing.set_attributes(span, _outcome_attributes(outcome))
            if isinstance(outcome, Outcome) and outcome.status is not Status.SUCCEEDED:
                tracing.mark_error(span, outcome.error_kind or str(outcome.status))
                if outcome.status is Status.RETRYING:
                    await self._note_retry_trace(state, env, span)
        return outcome

    async def _note_retry_trace(self, state: JobState, env: JobFields, span: Any) -> None:
        """Write the trace context and this run span to the row before the retrying
        outcome; a database failure costs the retry its link, not the job (logged)."""
        previous, _ = tracing.traceparent_of(span)
        try:
            await self.store.jobs.note_retry_trace(state.id, state.attempt, env, previous)
        except (DatabaseUnavailable, UnstorableData) as exc:
            log.warning("retry_trace_not_noted", job_id=state.id, error=str(exc))

    async def _run(self, state: JobState, claim: ClaimResult) -> Outcome | Unwritten:
        """Run the job; return the outcome to write, or ``Stop.FENCED``/``Stop.RELEASED``."""
        delivery = state.delivery
        spec = delivery.spec
        timeout = claim.timeout
        ctx = Context(
            job_id=state.id,
            type=spec.name,
            queue=delivery.envelope.queue,
            tenant=delivery.envelope.tenant,
            attempt=state.attempt,
            max_attempts=claim.max_attempts,
            checkpoint_state=claim.checkpoint,
            store=self.store,
            on_progress=state.report_progress,
            breakers=self.breakers,
            snoozes=claim.snoozes,
            settings=self.settings,
            spawn=self.requests.child_request,
        )
        try:
            if spec.is_coroutine:
                result = await self._run_coroutine(state, ctx, timeout)
            else:
                result = await self._run_in_pool(state, ctx, claim, timeout)
        except asyncio.CancelledError:
            if state.stop is None:
                raise
            return await self._stopped(state, ctx)
        except JobCancelled:
            return await self._stopped(state, ctx)
        except Snooze as snooze:
            if state.stop is not None:
                return await self._stopped(state, ctx)
            return outcomes.snoozed(state, claim, snooze, now=datetime.now(UTC))
        except Exception as exc:  # noqa: BLE001 - a job's own exception is data, classified below
            if state.stop is not None:
                return await self._stopped(state, ctx)
            return outcomes.failed(state, claim, exc, settings=self.settings, rand=self._rand)
        if isinstance(result, Snooze):  # ``return Snooze(s)``: the same as raising it
            return outcomes.snoozed(state, claim, result, now=datetime.now(UTC))
        outcome = outcomes.succeeded(state, result)
        if ctx.children and outcome.status is Status.SUCCEEDED:  # written with the outcome
            outcome.children = list(ctx.children.values())
        return outcome

    async def _run_coroutine(self, state: JobState, ctx: Context, timeout: float | None) -> Any:
        if state.stop is not None:
            raise JobCancelled(state.stop.value)
        scope = asyncio.timeout(timeout)
        state.scope = scope
        try:
            async with scope:
                return await state.delivery.spec.func(ctx, **state.delivery.args)
        except TimeoutError:
            if state.stop is not None:
                raise JobCancelled(state.stop.value) from None
            if scope.expired():
                raise JobTimeout(f"job ran past its timeout of {timeout:g} s") from None
            raise

    async def _run_in_pool(
        self, state: JobState, ctx: Context, claim: ClaimResult, timeout: float | None
    ) -> Any:
        if self.pool is None:
            raise RuntimeError("a process-pool job arrived but COLDBREW_PROCESSES is 0")
        state.in_process = True
        info = {
            "job_id": state.id,
            "type": ctx.type,
            "attempt": state.attempt,
            "tenant": ctx.tenant,
            "queue": ctx.queue,
            "max_attempts": claim.max_attempts,
            "checkpoint": claim.checkpoint,
            "snoozes": claim.snoozes,
        }
        traceparent = state.delivery.envelope.traceparent
        if traceparent is not None:  # the child's log lines carry it (procpool/child.py)
            info["trace_id"] = tracing.trace_id_of(traceparent)
        if state.stop is not None:
            raise JobCancelled(state.stop.value)
        # no deadline (the pool counts the timeout once a child has the job): the scope lets
        # a cancel end the wait for a free child, which pool.cancel cannot reach
        scope = asyncio.timeout(None)
        state.scope = scope
        async with scope:
            return await self.pool.run(ctx.type, state.delivery.args, info, ctx, timeout=timeout)

    def stop(self, state: JobState, why: Stop, reason: str = "") -> None:
        """Stop a running job: cancelled by request (``reason``), fenced, or released."""
        if state.stop is not None:
            return
        state.stop = why
        state.cancel_reason = reason
        if state.in_process and self.pool is not None and self.pool.cancel(state.id):
            return  # its child is killed; the pool's run() raises JobCancelled
        if state.scope is not None:  # a coroutine, or a pool job still waiting for a child
            # RuntimeError: the scope already exited, the job is finishing anyway
            with contextlib.suppress(RuntimeError):
                state.scope.reschedule(asyncio.get_running_loop().time())

    def _stop_lost(self, state: JobState) -> None:
        """A PostgreSQL restart lost (or another claim superseded) this job's claim."""
        if self.inflight.get(state.id) is state:
            self.stop(state, Stop.FENCED)

    async def settle_claim_acks(self, timeout: float) -> None:
        """The drain: settle the deliveries still waiting for their claims to be durable."""
        if self.claim_acks is not None:
            await self.claim_acks.settle_all(timeout)

    async def close(self) -> None:
        if self.claim_acks is not None:
            await self.claim_acks.close()

    async def _stopped(self, state: JobState, ctx: Context) -> Outcome | Unwritten:
        if state.stop is Stop.FENCED:
            return Stop.FENCED
        if state.stop is Stop.RELEASED:
            return Stop.RELEASED
        # a cancel request's reason, or "cancelled" when the job raised JobCancelled itself
        reason = state.cancel_reason if state.stop is Stop.CANCELLED else "cancelled"
        hook = state.delivery.spec.on_cancel
        if hook is not None:
            try:
                async with asyncio.timeout(30):
                    await hook(ctx, reason)
            except Exception as exc:  # noqa: BLE001 - a failing hook must not lose the cancel
                log.warning("on_cancel_hook_failed", job_id=state.id, error=repr(exc))
        return outcomes.cancelled(state, reason)


def _claim_attributes(claim: ClaimResult) -> dict[str, Any]:
    return {
        "coldbrew.job.attempt": claim.attempt,
        "coldbrew.claim.claimed": claim.claimed,
        "coldbrew.claim.status": claim.status,
    }


def _outcome_attributes(outcome: Outcome | Unwritten) -> dict[str, Any]:
    if isinstance(outcome, Outcome):
        attributes: dict[str, Any] = {"coldbrew.job.status": str(outcome.status)}
        if outcome.error_kind is not None:
            attributes["coldbrew.job.error_kind"] = outcome.error_kind
        return attributes
    return {"coldbrew.job.status": f"unwritten:{outcome.value}"}
