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

from coldbrew import retry, storable
from coldbrew.breaker import Breakers
from coldbrew.broker import Broker
from coldbrew.claimacks import ClaimAcks, HeldAck
from coldbrew.context import Context
from coldbrew.deliveries import Inbound, ack_soon, settle
from coldbrew.errors import (
    BrokerUnavailable,
    ContractViolation,
    DatabaseUnavailable,
    JobCancelled,
    JobTimeout,
    StaleWrite,
    TransientDatabaseError,
    UnstorableData,
    UnstorableValue,
)
from coldbrew.jobstate import Delivery, InFlight, JobState
from coldbrew.metrics import Metrics
from coldbrew.procpool import ProcessPool
from coldbrew.settings import Settings
from coldbrew.store import ClaimRequest, ClaimResult, JobStore, Outcome, RawJSON

log = structlog.get_logger("coldbrew.runner")
T = TypeVar("T")


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
        is_stopping: Callable[[], bool],
        on_db_health: Callable[[bool], None],
        breakers: Breakers | None = None,
        on_reject: Callable[[Inbound, ContractViolation], None] | None = None,
    ) -> None:
        self.settings = settings
        self._on_reject = on_reject  # dead-letters a delivery whose data PostgreSQL refused
        self.store = store
        self.broker = broker
        self.pool = pool
        self.metrics = metrics
        self.inflight = inflight
        self._is_stopping = is_stopping
        self._on_db_health = on_db_health
        self._rand = random.Random()
        self._detached: set[asyncio.Task[Any]] = set()  # outcome writes waiting out an outage
        self.breakers = breakers
        # COLDBREW_CLAIM_COMMIT=async: a delivery's ack waits until its claim is durable
        self.claim_acks: ClaimAcks | None = None
        if settings.claim_commit == "async":
            self.claim_acks = ClaimAcks(
                store,
                metrics,
                delay=settings.claim_barrier_seconds,
                worker_id=settings.worker_id,
                stop_job=self._stop_lost,
            )

    # --- one delivery -------------------------------------------------------------

    async def process(self, delivery: Delivery, *, capped: bool = False) -> str | None:
        """Claim, ack, run and record one delivery. Never raises (but CancelledError).

        ``capped``: the job's tenant or type has a fleet-wide cap, so the claim
        goes through the serialized capped path. Returns ``capped:<scope>`` when
        the cap left no room: the delivery is then neither acked nor run, and
        the caller holds it until a place frees.
        """
        message = delivery.message
        request = self._claim_request(delivery)
        claim_op = self.store.claim_capped if capped else self.store.claim
        try:
            claim = await self._until_db_ok(lambda: claim_op(request))
        except UnstorableData as exc:  # the job's own data, not the worker's trouble
            await self._refuse(delivery, exc)
            return None
        if claim is None:  # stopping while the database is away: let another worker have it
            await settle(message, requeue=True)
            return None
        if claim.status.startswith("capped:"):
            return claim.status
        if not claim.claimed:
            await self._not_claimed(delivery, claim)
            return None
        state = JobState(claim.id, claim.attempt, delivery, time.monotonic())
        if claim.mark is not None and self.claim_acks is not None:
            # committed asynchronously: ack once the claim is durable; the job starts now
            self.claim_acks.hold(HeldAck(claim.id, claim.attempt, claim.mark, message, state))
        else:
            ack_soon(message)  # the lease guards the job from here; it need not wait for the ack
        self.inflight.add(state)
        handles = self.metrics.job_handles(delivery.envelope.queue, delivery.spec.name)
        handles.started.inc()
        self.metrics.jobs_in_flight.inc()
        try:
            if self._is_stopping():  # claimed during the drain: hand it straight back
                state.stop_reason = "released"
                outcome: Outcome | str = "released"
            else:
                outcome = await self._run(state, claim)
            await self._record(state, outcome)
        finally:
            self.inflight.remove(state)
            self.metrics.jobs_in_flight.dec()
        return None

    def _claim_request(self, delivery: Delivery) -> ClaimRequest:
        env, spec = delivery.envelope, delivery.spec
        return ClaimRequest(
            id=env.job_id,
            type=env.type,
            queue=env.queue,
            tenant=env.tenant,
            args=env.args,
            priority=env.priority,
            max_attempts=env.max_attempts or spec.max_attempts or self.settings.max_attempts,
            timeout=env.timeout or spec.timeout,
            idempotency_key=env.idempotency_key,
        )

    async def _refuse(self, delivery: Delivery, exc: UnstorableData) -> None:
        """PostgreSQL refused the claim's data: dead-letter the delivery with the reason."""
        violation = ContractViolation("unstorable", f"PostgreSQL refused the job at claim: {exc}")
        if self._on_reject is not None:
            self._on_reject(delivery.message, violation)  # stored, copied to <ns>.dead, acked
            return
        log.error("claim_refused", job_id=delivery.envelope.job_id, error=str(exc))
        await settle(delivery.message)

    async def _not_claimed(self, delivery: Delivery, claim: ClaimResult) -> None:
        """The job is finished, held elsewhere, not due yet, or just ran out of attempts."""
        env = delivery.envelope
        if claim.status == "dead":
            await self._publish_dead(delivery, "max_attempts", "retry budget spent at claim")
        else:
            self.metrics.duplicate_deliveries.labels(env.queue).inc()
            self.metrics.redeliveries.labels("duplicate").inc()
            log.debug("duplicate_delivery", job_id=env.job_id, status=claim.status)
        await settle(delivery.message)

    # --- running --------------------------------------------------------------------

    async def _run(self, state: JobState, claim: ClaimResult) -> Outcome | str:
        """Run the job; return the outcome to write, or "fenced"/"released"."""
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
        )
        try:
            if spec.is_coroutine:
                result = await self._run_coroutine(state, ctx, timeout)
            else:
                result = await self._run_in_pool(state, ctx, claim, timeout)
        except asyncio.CancelledError:
            if state.stop_reason is None:
                raise
            return await self._stopped(state, ctx)
        except JobCancelled:
            return await self._stopped(state, ctx)
        except Exception as exc:  # noqa: BLE001 - a job's own exception is data, classified below
            if state.stop_reason is not None:
                return await self._stopped(state, ctx)
            return self._failure(state, claim, exc)
        return self._success(state, result)

    async def _run_coroutine(self, state: JobState, ctx: Context, timeout: float | None) -> Any:
        if state.stop_reason is not None:
            raise JobCancelled(state.stop_reason)
        scope = asyncio.timeout(timeout)
        state.scope = scope
        try:
            async with scope:
                return await state.delivery.spec.func(ctx, **state.delivery.args)
        except TimeoutError:
            if state.stop_reason is not None:
                raise JobCancelled(state.stop_reason) from None
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
        }
        return await self.pool.run(ctx.type, state.delivery.args, info, ctx, timeout=timeout)

    def stop(self, state: JobState, reason: str) -> None:
        """Stop a running job: cancelled by request, fenced, or released at shutdown."""
        if state.stop_reason is not None:
            return
        state.stop_reason = reason
        if state.in_process and self.pool is not None:
            self.pool.cancel(state.id)
        elif state.scope is not None:
            # RuntimeError: the scope already exited, the job is finishing anyway
            with contextlib.suppress(RuntimeError):
                state.scope.reschedule(asyncio.get_running_loop().time())

    def _stop_lost(self, state: JobState) -> None:
        """A PostgreSQL restart lost (or another claim superseded) this job's claim."""
        if self.inflight.get(state.id) is state:
            self.stop(state, "fenced")

    async def settle_claim_acks(self, timeout: float) -> None:
        """The drain: settle the deliveries still waiting for their claims to be durable."""
        if self.claim_acks is not None:
            await self.claim_acks.settle_all(timeout)

    async def close(self) -> None:
        if self.claim_acks is not None:
            await self.claim_acks.close()

    async def _stopped(self, state: JobState, ctx: Context) -> Outcome | str:
        reason = state.stop_reason or "cancelled"
        if reason in ("fenced", "released"):
            return reason
        hook = state.delivery.spec.on_cancel
        if hook is not None:
            try:
                async with asyncio.timeout(30):
                    await hook(ctx, reason.removeprefix("cancelled: "))
            except Exception as exc:  # noqa: BLE001 - a failing hook must not lose the cancel
                log.warning("on_cancel_hook_failed", job_id=state.id, error=repr(exc))
        return Outcome(
            state.id,
            state.attempt,
            "cancelled",
            error_kind="cancelled",
            error_message=reason.removeprefix("cancelled: "),
        )

    def _success(self, state: JobState, result: Any) -> Outcome:
        try:
            encoded = RawJSON(storable.dump_json(result, "result"))
        except UnstorableValue as exc:  # NUL, NaN, too big...: PostgreSQL cannot store it
            return Outcome(
                state.id,
                state.attempt,
                "failed",
                error_kind="unstorable_result",
                error_message=f"the job's return value cannot be stored: {exc}",
            )
        except (TypeError, ValueError) as exc:
            return Outcome(
                state.id,
                state.attempt,
                "failed",
                error_kind="unserializable_result",
                error_message=f"the job's return value is not JSON: {exc}",
            )
        return Outcome(state.id, state.attempt, "succeeded", result=encoded)

    def _failure(self, state: JobState, claim: ClaimResult, exc: Exception) -> Outcome:
        spec = state.delivery.spec
        policy = retry.RetryPolicy(
            max_attempts=claim.max_attempts,
            base=self.settings.retry_base_seconds,
            cap=self.settings.retry_max_seconds,
            max_wall_seconds=spec.max_wall_seconds,
            retry_on=spec.retry_on,
            dont_retry_on=spec.dont_retry_on,
        )
        decision = retry.decide(
            policy,
            exc,
            attempt=state.attempt,
            first_started_at=claim.started_at,
            now=datetime.now(UTC),
            rand=self._rand.random,
        )
        log.info(
            "job_failed",
            job_id=state.id,
            type=spec.name,
            attempt=state.attempt,
            error_kind=decision.error_kind,
            error=decision.error_message,
            next_status=str(decision.status),
            retry_in=round(decision.delay, 3),
        )
        return Outcome(
            state.id,
            state.attempt,
            str(decision.status),
            error_kind=storable.clean_text(decision.error_kind, say=False),
            error_message=storable.clean_text(decision.error_message),
            delay=decision.delay,
            dead_reason=decision.reason,
        )

    # --- recording ----------------------------------------------------------------

    async def _record(self, state: JobState, outcome: Outcome | str) -> None:
        delivery = state.delivery
        handles = self.metrics.job_handles(delivery.envelope.queue, delivery.spec.name)
        elapsed = time.monotonic() - state.started
        if outcome == "fenced":
            handles.finish("fenced", elapsed)
            self.metrics.fenced_writes.labels("complete").inc()
            return
        if outcome == "released":  # the delivery is acked: the relay publishes it again
            await self._until_db_ok(
                lambda: self.store.releases.submit((state.id, state.attempt, True)),
                give_up_on_stop=False,
            )
            handles.finish("released", elapsed)
            return
        assert isinstance(outcome, Outcome)
        if state.progress is not None:  # reported after the last flush: write it with the outcome
            outcome = dataclasses.replace(
                outcome, progress=state.progress[0], progress_message=state.progress[1]
            )
            state.progress = None
        try:
            written = await self._complete(outcome)
        except UnstorableData as exc:  # e.g. a Retry(delay=) past what an interval holds
            outcome = _refused_outcome(outcome, exc)
            written = await self._complete(outcome)  # only our own text: storable
        if not written:
            self.metrics.fenced_writes.labels("complete").inc()
            handles.finish("fenced", elapsed)
            log.warning("outcome_fenced", job_id=state.id, attempt=state.attempt)
        else:
            handles.finish(outcome.status, elapsed)  # type: ignore[arg-type]
            if outcome.status == "retrying":
                handles.retries.inc()
            elif outcome.status == "dead":
                await self._publish_dead(
                    delivery, outcome.dead_reason or "dead", outcome.error_message or ""
                )
        log.debug("job_finished", job_id=state.id, status=outcome.status, seconds=round(elapsed, 4))

    async def _complete(self, outcome: Outcome) -> bool | None:
        """Write the outcome; cancelling the job's task (a drain) must not drop the write.

        The usual case costs one shielded future; only a database outage
        starts a task, which retries until the write lands.
        """
        future = self.store.complete_soon(outcome)
        try:
            written = await asyncio.shield(future)
        except asyncio.CancelledError:  # the write goes on; if it fails, retry it detached
            future.add_done_callback(lambda done: self._retry_if_failed(outcome, done))
            raise
        except DatabaseUnavailable as exc:
            self._on_db_health(False)
            log.warning("database_unavailable", error=str(exc), retry_in=0)
        except StaleWrite:
            return None
        else:
            self._on_db_health(True)
            return written
        return await asyncio.shield(self._write_through_outage(outcome))

    def _retry_if_failed(self, outcome: Outcome, done: asyncio.Future[bool]) -> None:
        if done.cancelled():
            return  # shut down with the store
        if isinstance(exc := done.exception(), UnstorableData):
            self._write_through_outage(_refused_outcome(outcome, exc))
        elif isinstance(exc, DatabaseUnavailable):
            self._write_through_outage(outcome)  # else written, or fenced

    def _write_through_outage(self, outcome: Outcome) -> asyncio.Task[bool | None]:
        """A supervised task that retries the outcome's write until PostgreSQL answers."""
        task = asyncio.create_task(
            self._until_db_ok(lambda: self.store.complete(outcome), give_up_on_stop=False),
            name=f"complete:{outcome.id}",
        )
        self._detached.add(task)
        task.add_done_callback(self._detached_done)
        return task

    def _detached_done(self, task: asyncio.Task[Any]) -> None:
        self._detached.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("outcome_write_failed", task=task.get_name(), error=repr(exc), exc_info=exc)

    async def _publish_dead(self, delivery: Delivery, reason: str, detail: str) -> None:
        """A copy of a dead job on ``<ns>.dead`` for RabbitMQ-native tools (best effort)."""
        self.metrics.dead_letters.labels(reason).inc()
        message = delivery.message
        try:
            await self.broker.publish_dead(
                message.body,
                reason=reason,
                detail=detail,
                headers=message.headers or {},
                message_id=delivery.envelope.job_id,
                original_routing_key=message.routing_key or "",
            )
        except BrokerUnavailable as exc:
            log.warning("dead_copy_not_published", job_id=delivery.envelope.job_id, error=str(exc))

    async def _until_db_ok(
        self, op: Callable[[], Awaitable[T]], *, give_up_on_stop: bool = True
    ) -> T | None:
        """Retry ``op`` while PostgreSQL is unreachable, holding the delivery meanwhile."""
        delay = 0.2
        while True:
            try:
                result = await op()
            except DatabaseUnavailable as exc:
                if not isinstance(exc, TransientDatabaseError):  # a conflict: up, just busy
                    self._on_db_health(False)
                if give_up_on_stop and self._is_stopping():
                    return None
                log.warning("database_unavailable", error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            except StaleWrite:
                return None
            self._on_db_health(True)
            return result


def _refused_outcome(outcome: Outcome, exc: UnstorableData) -> Outcome:
    """What is written instead of an outcome PostgreSQL refused: a permanent failure."""
    return Outcome(
        outcome.id,
        outcome.attempt,
        "failed",
        error_kind="unstorable_outcome",
        error_message=storable.clean_text(
            f"PostgreSQL refused this attempt's outcome ({outcome.status}): {exc}"
        )[: retry.MAX_ERROR_MESSAGE],
    )
