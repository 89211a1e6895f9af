"""``BatchRows``: batches' rows -- creation with their members, reads, cancels, added members.

A batch and its members are inserted in one transaction; the counting that
decides when its callbacks fire is migration 0011's trigger on ``jobs``, so
every path that ends a job (group-committed outcomes, the reaper, liveness,
cancels, dead letters) moves it in the transaction that ends the member.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from coldbrew.batches import CALLBACK_EVENTS, BatchRecord, callback_job_id
from coldbrew.errors import BatchNotFound, InvalidRequest, StaleWrite
from coldbrew.model import JobRecord, Status
from coldbrew.sql import QUERIES
from coldbrew.store.base import StoreBase
from coldbrew.store.records import ClaimRequest

__all__ = ["BatchRows"]


class BatchRows(StoreBase):
    """Batches: create with members, read with counts, cancel, grow from a member."""

    async def create(
        self,
        batch_id: str,
        tenant: str,
        description: str | None,
        members: Sequence[ClaimRequest],
        callbacks: Mapping[str, Mapping[str, Any] | None],
        *,
        collect_results: bool,
        relay_grace: float,
    ) -> tuple[bool, list[tuple[str, datetime]]]:
        """Insert the batch and its members in one transaction.

        Returns ``(created, marks)``: False (nothing written) when a batch with this id
        exists; else each member's publish mark. A member id that exists already rolls
        the whole batch back with ``InvalidRequest`` (it could never be counted).
        """
        async with self._db.transaction() as conn:
            row = await conn.fetchrow(
                QUERIES["insert_batch"].text,
                batch_id,
                tenant,
                description,
                len(members),
                callbacks.get("on_success"),
                callbacks.get("on_complete"),
                callbacks.get("on_death"),
                collect_results,
            )
            if row is None:
                return False, []
            rows = await conn.fetch(
                QUERIES["insert_batch_members"].text,
                [m.id for m in members],
                [m.type for m in members],
                [m.queue for m in members],
                [m.tenant for m in members],
                [m.args for m in members],
                [m.priority for m in members],
                [m.max_attempts for m in members],
                [m.timeout for m in members],
                batch_id,
                relay_grace,
                members[0].traceparent if members else None,  # create_batch gives every
                members[0].tracestate if members else None,  # member the same
            )
            if len(rows) != len(members):
                inserted = {r["id"] for r in rows}
                taken = sorted({m.id for m in members} - inserted)[:3]
                raise InvalidRequest(
                    "duplicate_job",
                    f"batch {batch_id!r}: job ids {taken} exist already; nothing was submitted",
                )
            return True, [(r["id"], r["publish_after"]) for r in rows]

    async def get(self, batch_id: str) -> BatchRecord:
        """The batch with its members' counts; ``BatchNotFound`` when there is none."""
        row = await self._fetchrow("get_batch", batch_id)
        if row is None:
            raise BatchNotFound(batch_id)
        counts = {status.value: 0 for status in Status}
        progress = 0.0
        for group in await self._fetch("batch_member_counts", batch_id):
            counts[group["status"]] = group["members"]
            progress += group["progress"]
        callbacks = {
            f"on_{event}": row[f"on_{event}"]
            for event in CALLBACK_EVENTS
            if row[f"on_{event}"] is not None
        }
        fired = {}
        if callbacks:
            ids = [callback_job_id(batch_id, name.removeprefix("on_")) for name in callbacks]
            found = {r.id: r.status.value for r in await self._callback_jobs(ids)}
            fired = {
                name: found[job_id]
                for name, job_id in zip(callbacks, ids, strict=True)
                if job_id in found
            }
        total = row["total"]
        return BatchRecord(
            id=row["id"],
            tenant=row["tenant"],
            description=row["description"],
            total=total,
            pending=row["pending"],
            counts=counts,
            progress=progress / total if total else 1.0,
            callbacks=callbacks,
            collect_results=row["collect_results"],
            cancel_requested=row["cancel_requested"],
            created_at=row["created_at"],
            finished_at=row["finished_at"],
            fired=fired,
        )

    async def _callback_jobs(self, ids: list[str]) -> list[JobRecord]:
        return [JobRecord.from_row(r) for r in await self._fetch("get_jobs", ids)]

    async def member_ids(self, batch_id: str, limit: int) -> list[str]:
        return [r["id"] for r in await self._fetch("batch_member_ids", batch_id, limit)]

    async def cancel(self, batch_id: str, reason: str) -> int:
        """Flag the batch (no member can be added from then on), then cancel its unfinished
        members as ``request_cancel`` does; returns how many members it touched.

        In this order: the flag commits first (after it, an add waits for nothing and sees
        it), then the members go through ``request_cancel`` (the one cancel statement),
        which locks member rows in id order before the trigger locks the batch row, the
        order every completion takes too. A member that ends between the two reads is
        left alone by the cancel's own status check.
        """
        if await self._fetchrow("flag_batch_cancel", batch_id) is None:
            raise BatchNotFound(batch_id)
        ids = [row["id"] for row in await self._fetch("unfinished_member_ids", batch_id)]
        return len(await self._fetch("request_cancel", ids, reason)) if ids else 0

    async def add_member(self, adder_id: str, attempt: int, request: ClaimRequest) -> bool:
        """Insert ``request`` into the batch of running member ``adder_id`` and raise the
        batch's pending count, in one transaction that holds the adder (it cannot finish
        meanwhile, so the batch cannot complete in between). True when added, False when it
        existed (a retry of the adder); ``StaleWrite`` when this attempt no longer holds
        the adder, ``InvalidRequest`` when it is in no batch or its batch was cancelled."""
        async with self._db.transaction() as conn:
            batch = await conn.fetchrow(QUERIES["lock_adding_member"].text, adder_id, attempt)
            if batch is None:
                held = await conn.fetchrow(QUERIES["get_job"].text, adder_id)
                if held is None or held["attempt"] != attempt or held["status"] != "running":
                    raise StaleWrite(f"job {adder_id} attempt {attempt} no longer holds its claim")
                raise InvalidRequest("not_in_batch", f"job {adder_id} is not a batch member")
            if batch["cancel_requested"]:
                raise InvalidRequest("batch_cancelled", f"batch {batch['id']} was cancelled")
            added = await conn.fetchval(
                QUERIES["insert_added_member"].text,
                *request.row_fields(),
                batch["id"],
                request.traceparent,
                request.tracestate,
            )
            if added is not None:
                await conn.execute(QUERIES["grow_batch"].text, batch["id"])
            return added is not None
