"""``CronStore``: cron schedules' rows, and the one transaction that fires their ticks.

A tick is decided by a compare-and-swap on the schedule's watermark
(``last_tick``) in the same transaction that inserts the ticks' jobs, through
the submission's own statement (``insert_job``: queued, with a publish mark
the relay honours). So one worker decides each tick however many race, a
crash between the decision and the insert cannot happen, and a job inserted
but not yet published is published by the relay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from coldbrew.sql import QUERIES
from coldbrew.store.base import StoreBase
from coldbrew.store.records import ClaimRequest


@dataclass(frozen=True, slots=True)
class CronDefinition:
    """What a worker declares of a schedule (its state -- watermark, pause -- is the row's)."""

    name: str
    expression: str
    tz: str
    type: str
    args: dict[str, Any]
    queue: str
    tenant: str
    priority: int
    max_attempts: int
    timeout_seconds: float | None
    catch_up: str
    max_catch_up: int


_DEFINITION_FIELDS = CronDefinition.__dataclass_fields__


@dataclass(frozen=True, slots=True)
class CronRow:
    """A schedule's row: its definition and its state."""

    definition: CronDefinition
    paused: bool
    last_tick: datetime
    last_job_id: str | None
    seen_at: datetime
    updated_at: datetime

    @property
    def name(self) -> str:
        return self.definition.name

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> CronRow:
        definition = CronDefinition(**{name: row[name] for name in _DEFINITION_FIELDS})
        return cls(
            definition,
            row["paused"],
            row["last_tick"],
            row["last_job_id"],
            row["seen_at"],
            row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class CronDeclared:
    """What a worker's start-up upsert found: the row, and whether it was new or edited."""

    row: CronRow
    created: bool
    edited: bool


@dataclass(frozen=True, slots=True)
class CronListed:
    """One line of ``coldbrew cron list``: the row, its last tick's job status, the clock."""

    row: CronRow
    last_status: str | None
    orphaned: bool
    now: datetime


@dataclass(frozen=True, slots=True)
class Watermark:
    """A declared schedule's state as the cron service reads it each look."""

    name: str
    expression: str
    tz: str
    paused: bool
    last_tick: datetime
    now: datetime


class CronStore(StoreBase):
    """Schedules' rows: declarations, watermarks, the firing transaction, pause flags."""

    async def declare(self, row: CronDefinition) -> CronDeclared:
        """Upsert one declared schedule; say whether it is new, or its timing was edited."""
        found = await self._fetchrow(
            "cron_upsert",
            row.name,
            row.expression,
            row.tz,
            row.type,
            row.args,
            row.queue,
            row.tenant,
            row.priority,
            row.max_attempts,
            row.timeout_seconds,
            row.catch_up,
            row.max_catch_up,
        )
        assert found is not None  # an upsert always returns its row
        old = found["old_expression"], found["old_tz"]
        created = old[0] is None
        edited = not created and old != (row.expression, row.tz)
        return CronDeclared(CronRow.from_row(found), created, edited)

    async def watermarks(self, names: Sequence[str]) -> list[Watermark]:
        rows = await self._fetch("cron_watermarks", list(names))
        return [
            Watermark(
                name=row["name"],
                expression=row["expression"],
                tz=row["tz"],
                paused=row["paused"],
                last_tick=row["last_tick"],
                now=row["now"],
            )
            for row in rows
        ]

    async def fire(
        self,
        mark: Watermark,
        new_watermark: datetime,
        requests: Sequence[ClaimRequest],
        *,
        relay_grace: float,
    ) -> list[tuple[ClaimRequest, datetime]] | None:
        """Advance ``mark`` to ``new_watermark`` and insert ``requests`` in one transaction.

        None when the compare-and-swap found the watermark moved (another worker
        decided these ticks), the schedule paused or redefined: nothing is
        inserted then. Otherwise the requests that made a new job, each with its
        publish mark (a job id that exists already is not inserted twice).
        """
        last_job = requests[-1].id if requests else None
        async with self._db.transaction() as conn:
            advanced = await conn.fetchrow(
                QUERIES["cron_advance"].text,
                mark.name,
                mark.last_tick,
                new_watermark,
                mark.expression,
                mark.tz,
                last_job,
            )
            if advanced is None:
                return None
            inserted: list[tuple[ClaimRequest, datetime]] = []
            for request in requests:
                row = await conn.fetchrow(
                    QUERIES["insert_job"].text,
                    *request.row_fields(),
                    request.idempotency_key,
                    relay_grace,
                    None,  # run_at: a tick runs now (its time has come)
                    None,  # delay
                    None,  # webhook url: a scheduled job's webhook is its tenant's
                    request.traceparent,  # the tick's span (worker/cron.py), if traced
                    request.tracestate,
                )
                if row is not None:
                    inserted.append((request, row["publish_after"]))
        return inserted

    async def seen(self, names: Sequence[str]) -> None:
        await self._execute("cron_seen", list(names))

    async def list_schedules(self, orphan_seconds: float) -> list[CronListed]:
        rows = await self._fetch("cron_list", orphan_seconds)
        return [
            CronListed(CronRow.from_row(row), row["last_status"], row["orphaned"], row["now"])
            for row in rows
        ]

    async def get(self, name: str) -> CronRow | None:
        row = await self._fetchrow("cron_get", name)
        return None if row is None else CronRow.from_row(row)

    async def set_paused(self, name: str, paused: bool) -> CronRow | None:
        """Pause or resume; None for an unknown name."""
        row = await self._fetchrow("cron_set_paused", name, paused)
        return None if row is None else CronRow.from_row(row)

    async def delete(self, name: str) -> bool:
        """Delete a schedule's row; False for an unknown name."""
        return await self._fetchval("cron_delete", name) is not None
