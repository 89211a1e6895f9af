"""``UniqueRows``: the keys of unique jobs (``job_unique``) and duplicates' aliases.

A unique submission takes its key in the statement that inserts its job, so
two producers at once make one job (the key's primary key decides, and
``ON CONFLICT DO UPDATE ... WHERE`` re-reads the winner's committed row). When
nothing was inserted, a second statement, with a fresh snapshot, reads the job
that holds the key. Jobs without ``unique_for`` never come here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from coldbrew.errors import JobNotFound
from coldbrew.model import JobRecord
from coldbrew.store.base import StoreBase
from coldbrew.store.records import ClaimRequest
from coldbrew.unique import UniqueOpts

ATTEMPTS = 3
"""How often a submission tries again when the key's holder vanished between its two
statements (pruned, or its window passed and a third producer took it)."""


@dataclass(frozen=True, slots=True)
class UniqueKey:
    """A job's unique key, with the submission's rule for when its holder stands."""

    key: str
    opts: UniqueOpts

    @classmethod
    def of(
        cls, job: ClaimRequest, opts: UniqueOpts, args: Mapping[str, Any] | None = None
    ) -> UniqueKey:
        """The key of ``job``, over ``args`` when given (a worker's validated args)."""
        return cls(
            opts.key(job.type, job.args if args is None else args, job.tenant, job.queue), opts
        )


@dataclass(frozen=True, slots=True)
class Admission:
    """What ``admit_delivery`` found: ``duplicate_of`` another job's id, or None (claim it)."""

    duplicate_of: str | None


class UniqueRows(StoreBase):
    """Unique submissions, raw deliveries of unique types, and duplicates' aliases."""

    async def insert(
        self, request: ClaimRequest, unique: UniqueKey, *, relay_grace: float
    ) -> tuple[JobRecord, datetime | None, bool]:
        """Insert ``request`` unless its key's holder stands: (record, publish mark if new,
        whether the record is another job the submission duplicates)."""
        opts = unique.opts
        for _ in range(ATTEMPTS):
            row = await self._fetchrow(
                "insert_unique_job",
                *request.row_fields(),
                request.idempotency_key,
                relay_grace,
                unique.key,
                list(opts.states),
                opts.period,
                request.webhook_url,
                request.traceparent,
                request.tracestate,
            )
            if row is not None:
                return JobRecord.from_row(row), row["publish_after"], False
            holder = await self._fetchrow("find_unique_holder", request.id, unique.key)
            if holder is not None:
                return JobRecord.from_row(holder), None, bool(holder["duplicate"])
        raise JobNotFound(f"the holder of unique key {unique.key} for job {request.id}")

    async def admit_delivery(self, request: ClaimRequest, unique: UniqueKey) -> Admission:
        """A delivery of a unique type: insert its row if its key is free (the claim then
        runs it), or name the job it duplicates and map its message id to it."""
        opts = unique.opts
        for _ in range(ATTEMPTS):
            row = await self._fetchrow(
                "admit_unique_delivery",
                *request.row_fields(),
                request.idempotency_key,
                unique.key,
                list(opts.states),
                opts.period,
                request.traceparent,
                request.tracestate,
            )
            known, taken = (None, None) if row is None else (row["known"], row["taken"])
            if known is not None:  # a job of this id, or a duplicate mapped before
                return Admission(None if known == request.id else known)
            if taken is not None:
                return Admission(None)
            holder = await self._fetchval("alias_unique_duplicate", request.id, unique.key)
            if holder is not None:
                return Admission(None if holder == request.id else holder)
        raise JobNotFound(f"the holder of unique key {unique.key} for job {request.id}")
