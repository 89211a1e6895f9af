"""Recording an attempt's outcome: fenced, durable, and never dropped by a drain or an outage.

The outcome is written through the completions' group commit under
``asyncio.shield``: cancelling the job's task (the drain) does not cancel the
write. A write that meets an outage is retried by a supervised task until
PostgreSQL answers; its fencing (``attempt``) still decides whether it lands.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from coldbrew.claimacks import ClaimAcks
from coldbrew.errors import (
    BrokerUnavailable,
    DatabaseUnavailable,
    StaleWrite,
    TransientDatabaseError,
    UnstorableData,
)
from coldbrew.jobstate import Delivery, JobState, Stop, Unwritten
from coldbrew.metrics import Metrics
from coldbrew.model import Status
from coldbrew.store import CommitMark, JobStore, Outcome
from coldbrew.transport import Broker
from coldbrew.worker import outcomes
from coldbrew.worker.lifecycle import Lifecycle
from coldbrew.worker.service import until_available

log = structlog.get_logger("coldbrew.runner")
T = TypeVar("T")


class OutcomeWriter:
    """Writes outcomes and dead-letter copies; waits out database outages for the runner."""

    def __init__(
        self,
        *,
        store: JobStore,
        broker: Broker,
        metrics: Metrics,
        lifecycle: Lifecycle,
        claim_acks: ClaimAcks | None,
    ) -> None:
        self.store = store
        self.claim_acks = claim_acks
        self.broker = broker
        self.metrics = metrics
        self.lifecycle = lifecycle
        self._detached: set[asyncio.Task[Any]] = set()  # outcome writes waiting out an outage

    async def record(
        self, state: JobState, outcome: Outcome | Unwritten, *, linger: float = 0.0
    ) -> None:
        """Write the attempt's outcome (fenced by attempt), count it, copy a dead job.
        ``linger`` > 0: the write may wait that long to share a commit (batching.py)."""
        delivery = state.delivery
        handles = self.metrics.job_handles(delivery.envelope.queue, delivery.spec.name)
        elapsed = time.monotonic() - state.started
        if outcome is Stop.FENCED:
            handles.finish("fenced", elapsed)
            self.metrics.fenced_writes.labels("complete").inc()
            return
        if outcome is Stop.RELEASED:  # the delivery is acked: the relay publishes it again
            await self.until_db_ok(
                lambda: self.store.leases.release_batches.submit((state.id, state.attempt, True)),
                give_up_on_stop=False,
            )
            handles.finish("released", elapsed)
            return
        if state.progress is not None:  # reported after the last flush: write it with the outcome
            outcome = dataclasses.replace(
                outcome, progress=state.progress[0], progress_message=state.progress[1]
            )
            state.progress = None
        try:
            written = await self._complete(outcome, linger)
        except UnstorableData as exc:  # e.g. a Retry(delay=) past what an interval holds
            outcome = outcomes.refused(outcome, exc)
            written = await self._complete(outcome)  # only our own text: storable
        if written is None:
            self.metrics.fenced_writes.labels("complete").inc()
            handles.finish("fenced", elapsed)
            log.warning("outcome_fenced", job_id=state.id, attempt=state.attempt)
        else:
            if self.claim_acks is not None:  # its commit made earlier async claims durable
                self.claim_acks.completed(written)
            if outcome.status is Status.SCHEDULED:  # a snooze: no attempt spent
                handles.duration.observe(elapsed)
                self.metrics.jobs_snoozed.labels(delivery.spec.name).inc()
            else:
                handles.finish(outcome.status, elapsed)
            if outcome.status is Status.RETRYING:
                handles.retries.inc()
            elif outcome.status is Status.DEAD:
                await self.publish_dead(
                    delivery, outcome.dead_reason or "dead", outcome.error_message or ""
                )
        log.debug("job_finished", job_id=state.id, status=outcome.status, seconds=round(elapsed, 4))

    async def _complete(self, outcome: Outcome, linger: float = 0.0) -> CommitMark | None:
        """Write the outcome; cancelling the job's task (a drain) must not drop the write.
        Returns the mark of the commit that wrote it, or None when it was fenced.

        The usual case costs one shielded future; only a database outage
        starts a task, which retries until the write lands.
        """
        future = self.store.claims.complete_soon(outcome, linger=linger)
        try:
            written = await asyncio.shield(future)
        except asyncio.CancelledError:  # the write goes on; if it fails, retry it detached
            future.add_done_callback(lambda done: self._retry_if_failed(outcome, done))
            raise
        except DatabaseUnavailable as exc:
            self.lifecycle.set_database_ok(False)
            log.warning("database_unavailable", error=str(exc), retry_in=0)
        except StaleWrite:
            return None
        else:
            self.lifecycle.set_database_ok(True)
            return written
        return await asyncio.shield(self._write_through_outage(outcome))

    def _retry_if_failed(self, outcome: Outcome, done: asyncio.Future[CommitMark | None]) -> None:
        if done.cancelled():
            return  # shut down with the store
        if isinstance(exc := done.exception(), UnstorableData):
            self._write_through_outage(outcomes.refused(outcome, exc))
        elif isinstance(exc, DatabaseUnavailable):
            self._write_through_outage(outcome)  # else written, or fenced

    def _write_through_outage(self, outcome: Outcome) -> asyncio.Task[CommitMark | None]:
        """A supervised task that retries the outcome's write until PostgreSQL answers."""
        task = asyncio.create_task(
            self.until_db_ok(lambda: self.store.claims.complete(outcome), give_up_on_stop=False),
            name=f"complete:{outcome.id}",
        )
        self._detached.add(task)
        task.add_done_callback(self._detached_done)
        return task

    def _detached_done(self, task: asyncio.Task[Any]) -> None:
        self._detached.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("outcome_write_failed", task=task.get_name(), error=repr(exc), exc_info=exc)

    async def publish_dead(self, delivery: Delivery, reason: str, detail: str) -> None:
        """A copy of a dead job on ``<ns>.dead`` for RabbitMQ-native tools (best effort)."""
        self.metrics.job_dead(reason)
        message = delivery.message
        try:
            await self.broker.publish_dead(
                message.body,
                reason=reason,
                detail=detail,
                headers=message.headers or {},
                message_id=delivery.envelope.id,
                original_routing_key=message.routing_key or "",
            )
        except BrokerUnavailable as exc:
            log.warning("dead_copy_not_published", job_id=delivery.envelope.id, error=str(exc))

    async def until_db_ok(
        self, op: Callable[[], Awaitable[T]], *, give_up_on_stop: bool = True
    ) -> T | None:
        """Retry ``op`` while PostgreSQL is unreachable, holding the delivery meanwhile.

        None when the write was fenced (``StaleWrite``) or, with
        ``give_up_on_stop``, when the worker drains during the outage.
        """

        async def attempt() -> T | None:
            try:
                result = await op()
            except StaleWrite:
                return None
            self.lifecycle.set_database_ok(True)
            return result

        return await until_available(
            attempt,
            event="database_unavailable",
            give_up=(lambda: self.lifecycle.draining) if give_up_on_stop else (lambda: False),
            on_unavailable=self._unavailable,
        )

    def _unavailable(self, exc: Exception) -> None:
        if not isinstance(exc, TransientDatabaseError):  # a conflict: up, just busy
            self.lifecycle.set_database_ok(False)
