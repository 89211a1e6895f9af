"""Dead letters for contract violations: a message no job can come from.

The intake rejects a delivery that breaks the contract (bad JSON, unknown
type, invalid header...). This service stores it with its bytes and reason
in the ``rejected`` table, copies it to ``<ns>.dead`` for RabbitMQ-native
tools, and only then acks it, so a rejected message is never lost and never
requeued in a loop (STYLE §8). Rejections are batched: a garbage stream costs
one INSERT per batch.

A rejected message whose ``message_id`` is a job row still waiting (a
submitter accepted what the worker refuses) makes that row ``failed`` with the
rejection's reason as its error kind: its only message is gone, and a row
left ``queued`` would never run nor fail (reconciliation would only publish
it again, to be rejected again). A row that is running or finished is left
alone: the message was a duplicate of a job that did run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from coldbrew.errors import ContractViolation
from coldbrew.metrics import Metrics
from coldbrew.model import JOB_ID_RE
from coldbrew.store import JobStore
from coldbrew.transport import Broker, Inbound
from coldbrew.worker.service import Backoff, until_available

log = structlog.get_logger("coldbrew.worker")

Reject = tuple[Inbound, ContractViolation]

BATCH = 200


class DeadLetters:
    """Takes rejected deliveries (``reject``) and settles them once they are stored."""

    name = "dead-letters"

    def __init__(self, store: JobStore, broker: Broker, metrics: Metrics) -> None:
        self.store = store
        self.broker = broker
        self.metrics = metrics
        self._rejects: asyncio.Queue[Reject] = asyncio.Queue()

    def reject(self, message: Inbound, violation: ContractViolation) -> None:
        """Dead-letter ``message`` for ``violation`` (it is acked once stored)."""
        self._rejects.put_nowait((message, violation))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                first = await asyncio.wait_for(self._rejects.get(), timeout=0.5)
            except TimeoutError:
                continue
            batch = [first]
            while len(batch) < BATCH and not self._rejects.empty():
                batch.append(self._rejects.get_nowait())
            if not await self._store(batch, stop):
                for message, _ in batch:  # stopping during an outage: the broker keeps it
                    await message.requeue()
                continue
            await self._settle(batch)
        while not self._rejects.empty():
            message, _ = self._rejects.get_nowait()
            await message.requeue()

    async def _store(self, batch: list[Reject], stop: asyncio.Event) -> bool:
        """Record and copy ``batch``; False when the worker stopped before both worked."""
        rows = [
            (
                v.reason,
                v.detail,
                m.message_id,
                m.routing_key or "",
                json_headers(m.headers),
                m.body,
            )
            for m, v in batch
        ]

        rejected_jobs = [
            (m.message_id, v.reason, v.detail)
            for m, v in batch
            if m.message_id is not None and JOB_ID_RE.match(m.message_id)
        ]

        async def record_and_copy() -> bool:
            # first, and idempotent (guarded), so a retry after an outage repeats nothing
            failed = await self.store.dead.fail_rejected_jobs(rejected_jobs)
            self._failed(batch, failed)
            await self.store.dead.insert_rejected(rows)
            for message, violation in batch:
                await self.broker.publish_dead(
                    message.body,
                    reason=violation.reason,
                    detail=violation.detail,
                    headers=message.headers or {},
                    message_id=message.message_id,
                    original_routing_key=message.routing_key or "",
                )
            return True

        done = await until_available(
            record_and_copy, event="dead_letter_delayed", give_up=stop.is_set, backoff=Backoff()
        )
        return done is not None

    def _failed(self, batch: list[Reject], failed: set[str]) -> None:
        """Count and log the waiting jobs that failed because their message was rejected."""
        for message, violation in batch:
            if message.message_id in failed:
                failed.discard(message.message_id)
                self.metrics.rejected_jobs_failed.labels(violation.reason).inc()
                log.warning(
                    "job_failed_by_rejection",
                    job_id=message.message_id,
                    reason=violation.reason,
                    detail=violation.detail[:300],
                )

    async def _settle(self, batch: list[Reject]) -> None:
        for message, violation in batch:
            self.metrics.rejected(violation.reason)
            log.warning(
                "message_rejected",
                reason=violation.reason,
                detail=violation.detail[:300],
                message_id=message.message_id,
                routing_key=message.routing_key,
            )
            await message.ack()


def json_headers(headers: Any) -> dict[str, Any] | None:
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
