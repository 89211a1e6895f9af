"""``FlowStore``: jobs submitted in a caller's transaction, and chains' records.

A transactional submission runs on the *caller's* asyncpg connection, inside
its transaction: the row commits or rolls back with the caller's own rows.
That connection is not ours: it has no ``search_path`` to our schema and
perhaps no jsonb codec (or another one). So the statements run inside a
savepoint that searches our schema only until it ends (``set_config(...,
true)``, restored after), pass json as text, and read it back as text. A
failure rolls back the savepoint alone: the caller's transaction stays usable.

The row is due at once (``publish_after = now()``, the transaction's start)
and the statement NOTIFYs ``<schema>.relay``, which PostgreSQL delivers only at
commit: the relays wake then and publish it (``worker/relay.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from coldbrew.errors import ChainNotFound, DataRefused, InvalidRequest
from coldbrew.model import JobFields, JobRecord
from coldbrew.sql import QUERIES
from coldbrew.store.base import DATA_ERRORS, StoreBase, refused

__all__ = ["ChainRecord", "FlowStore"]


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _record(row: asyncpg.Record) -> JobRecord:
    values = dict(row)
    for key in ("args", "result"):
        if values[key] is not None:
            values[key] = json.loads(values[key])
    return JobRecord.from_row(values)


class ChainRecord(dict[str, Any]):
    """A chain's record as JSON: id, tenant, status, current_step, steps, jobs,
    stopped_reason, created_at, finished_at."""

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> ChainRecord:
        steps = row["steps"]
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            status=row["status"],
            current_step=row["current_step"],
            step_count=len(steps),
            steps=[{"type": s["type"], "id": s["id"]} for s in steps],
            jobs=row["jobs"],
            stopped_reason=row["stopped_reason"],
            created_at=row["created_at"].isoformat(),
            finished_at=None if row["finished_at"] is None else row["finished_at"].isoformat(),
        )


class FlowStore(StoreBase):
    """Submissions on a caller's connection; chains' records."""

    async def insert_in_transaction(
        self, conn: asyncpg.Connection, request: JobFields
    ) -> JobRecord:
        """Insert ``request`` on ``conn`` (in the caller's transaction); return its record,
        or the existing job's when the id is taken (the same idempotency key)."""
        if not conn.is_in_transaction():
            raise InvalidRequest(
                "invalid_request",
                "submit(connection=...) needs a connection inside a transaction you own "
                "(async with conn.transaction(): ...); without one use submit() alone",
            )
        args = json.dumps(request.args)
        try:
            async with conn.transaction():  # a savepoint: a failure leaves the caller's usable
                previous = await conn.fetchval(
                    QUERIES["flow_enter_schema"].text, _quote_ident(self._db.namespace)
                )
                row = await conn.fetchrow(
                    QUERIES["insert_job_in_transaction"].text,
                    request.id,
                    request.type,
                    request.queue,
                    request.tenant,
                    args,
                    request.priority,
                    request.max_attempts,
                    request.timeout,
                    request.idempotency_key,
                    request.run_at,
                    request.delay,
                    request.webhook_url,
                    request.traceparent,
                    request.tracestate,
                )
                if row is None:
                    row = await conn.fetchrow(QUERIES["get_job_in_transaction"].text, request.id)
                await conn.execute(QUERIES["flow_leave_schema"].text, previous)
        except DATA_ERRORS as exc:
            raise refused(exc) from exc
        if row is None:  # taken by a row that is gone again: cannot happen in one snapshot
            raise DataRefused(f"job {request.id} could not be inserted", None)
        return _record(row)

    async def insert_chain(
        self,
        chain_id: str,
        tenant: str,
        steps: list[dict[str, Any]],
        first: JobFields,
        *,
        relay_grace: float,
    ) -> datetime | None:
        """Write the chain's record and its first step's job in one transaction; return the
        job's publish mark, or None when the chain existed already (nothing inserted)."""
        async with self._db.transaction() as conn:
            if await conn.fetchval(QUERIES["insert_chain"].text, chain_id, tenant, steps) is None:
                return None
            row = await conn.fetchrow(
                QUERIES["insert_chain_job"].text,
                first.id,
                first.type,
                first.queue,
                first.tenant,
                first.args,
                first.priority,
                first.max_attempts,
                first.timeout,
                relay_grace,
                chain_id,
            )
        return None if row is None else row["publish_after"]

    async def get_chain(self, chain_id: str) -> ChainRecord:
        row = await self._fetchrow("get_chain", chain_id)
        if row is None:
            raise ChainNotFound(chain_id)
        return ChainRecord.from_row(row)

    async def children_of(self, parent_id: str) -> Sequence[JobRecord]:
        """Every child of ``parent_id`` (tests and tools; the status JSON counts them)."""
        return [JobRecord.from_row(r) for r in await self._fetch("children_of", parent_id)]

    async def find_jobs(
        self,
        *,
        type: str | None = None,
        args: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        queue: str | None = None,
        statuses: Sequence[str] | None = None,
    ) -> list[JobRecord]:
        """Jobs matching every filter given (``args``: the job's args contain these)."""
        rows = await self._fetch(
            "find_jobs",
            type,
            None if args is None else dict(args),
            tenant,
            queue,
            None if statuses is None else list(statuses),
        )
        return [JobRecord.from_row(row) for row in rows]

    async def count_unsettled(self, horizon: float) -> int:
        """Jobs queued or running, or retrying/scheduled and due within ``horizon`` s."""
        return int(await self._fetchval("count_unsettled", horizon))
