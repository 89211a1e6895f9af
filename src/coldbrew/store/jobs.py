"""``JobRows``: a job's row as producers and its own attempt see it.

Submit, read, cancel; and the fenced writes a running attempt makes from its
``Context`` (checkpoints, at-most-once guards), each refused with
``StaleWrite`` once the attempt no longer holds the job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import asyncpg

from coldbrew.errors import JobNotFound, StaleWrite
from coldbrew.model import JobFields, JobRecord
from coldbrew.sql import QUERIES
from coldbrew.store.base import StoreBase
from coldbrew.store.records import ClaimRequest


class JobRows(StoreBase):
    """Job rows: submissions, reads, cancels, and an attempt's own fenced writes."""

    async def insert_job(
        self, request: ClaimRequest, *, relay_grace: float
    ) -> tuple[JobRecord, datetime | None]:
        """Insert a queued, unpublished job (``scheduled`` when its ``run_at`` or ``delay`` is
        still ahead); return it and, if it is new, its publish mark."""
        row = await self._fetchrow(
            "insert_job",
            *request.row_fields(),
            request.idempotency_key,
            relay_grace,
            request.run_at,
            request.delay,
            request.webhook_url,
            request.traceparent,
            request.tracestate,
        )
        if row is not None:
            return JobRecord.from_row(row), row["publish_after"]
        return await self.get_job(request.id), None

    async def note_retry_trace(
        self, job_id: str, attempt: int, job: JobFields, previous_span: str
    ) -> None:
        """Keep ``job``'s trace context and this attempt's run span (``previous_span``) in
        its row before the retrying outcome is written, for the relay's republish
        (tracing.py); a row this attempt no longer holds is left alone."""
        await self._execute(
            "note_retry_trace", job_id, attempt, job.traceparent, job.tracestate, previous_span
        )

    async def defer_job(self, request: ClaimRequest) -> bool:
        """Record a delivered job that asks for a later start as ``scheduled``, if it has no
        row and is not due yet; True when it did (the delivery is then acked, and the relay
        publishes the job at its time), False: claim it as usual."""
        row = await self._fetchrow(
            "defer_job",
            *request.row_fields(),
            request.idempotency_key,
            request.run_at,
            request.delay,
            request.traceparent,
            request.tracestate,
        )
        return row is not None

    async def get_job(self, job_id: str) -> JobRecord:
        """The job ``job_id`` names; or, for the message id of a raw delivery that was a
        unique duplicate, the job it duplicated (looked up only on a miss)."""
        row = await self._fetchrow("get_job", job_id)
        if row is None:
            row = await self._fetchrow("get_job_by_alias", job_id)
        if row is None:
            raise JobNotFound(job_id)
        return JobRecord.from_row(row)

    async def get_finished_jobs(self, ids: Sequence[str]) -> list[JobRecord]:
        """Which of ``ids`` are terminal: one primary-key lookup per id, in one statement."""
        return [
            JobRecord.from_row(row) for row in await self._fetch("get_finished_jobs", list(ids))
        ]

    async def get_jobs(self, ids: Sequence[str]) -> list[JobRecord]:
        """The rows of ``ids`` that exist, in one statement (a watcher's poll)."""
        return [JobRecord.from_row(row) for row in await self._fetch("get_jobs", list(ids))]

    async def request_cancel(self, job_id: str, reason: str) -> JobRecord:
        row = await self._fetchrow("request_cancel", [job_id], reason)
        if row is None:
            record = await self.get_job(job_id)  # raises JobNotFound, or shows the final status
            if record.id != job_id:  # a raw unique duplicate's message id: cancel its job
                return await self.request_cancel(record.id, reason)
            return record
        return JobRecord.from_row(row)

    # --- an attempt's own writes (fenced) ------------------------------------------------

    async def claim_once(self, job_id: str, name: str, attempt: int) -> bool:
        row = await self._fetchrow("claim_once", job_id, name, attempt)
        if row is None or not row["holds"]:
            raise StaleWrite(f"job {job_id} attempt {attempt} no longer holds its claim")
        return bool(row["taken"])

    @asynccontextmanager
    async def once_transaction(
        self, job_id: str, name: str, attempt: int
    ) -> AsyncIterator[asyncpg.Connection | None]:
        """A transaction holding the once-guard; yields the connection, or None if taken."""
        async with self._db.transaction() as conn:
            row = await conn.fetchrow(QUERIES["claim_once"].text, job_id, name, attempt)
            if row is None or not row["holds"]:
                raise StaleWrite(f"job {job_id} attempt {attempt} no longer holds its claim")
            yield conn if row["taken"] else None

    async def save_checkpoint(self, job_id: str, attempt: int, state: Any) -> None:
        if await self._fetchval("save_checkpoint", job_id, attempt, state) is None:
            raise StaleWrite(f"job {job_id} attempt {attempt} no longer holds its claim")
