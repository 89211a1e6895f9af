"""Submitting batches and groups, and the member a running member adds (``ctx.batch.add``).

``Client.batch`` resolves every member and callback as ``Client.submit`` would
(the app's spec, else the fleet's registered types), inserts the batch row and
its members in one transaction, then publishes the members like any
submission (the relay publishes what was not confirmed). The callbacks wait
on the batch row until migration 0011's trigger inserts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from coldbrew import storable, tracing
from coldbrew.batches import (
    BATCH_ID_RE,
    MAX_BATCH_MEMBERS,
    MAX_DESCRIPTION,
    BatchRecord,
    Job,
    added_member_id,
    member_job_id,
)
from coldbrew.errors import (
    BrokerUnavailable,
    InvalidRequest,
    Permanent,
    TransientDatabaseError,
)
from coldbrew.model import JOB_ID_RE, new_job_id
from coldbrew.store import ClaimRequest

if TYPE_CHECKING:
    from coldbrew.client import Client
    from coldbrew.settings import Settings
    from coldbrew.store import JobStore

log = structlog.get_logger("coldbrew.batches")

JobLike = Job | tuple[str, Mapping[str, Any]] | str
"""What a batch takes for a member or a callback: a ``Job``, ``(type, args)`` or a type."""

CANCEL_TRIES = 3
"""Times a batch cancel is tried when PostgreSQL breaks a lock cycle with a member's
completion (a deadlock: rolled back, nothing written)."""


def check_batch_id(batch_id: str) -> None:
    """``InvalidRequest`` for an id no batch can have (before any I/O)."""
    if not isinstance(batch_id, str) or not BATCH_ID_RE.match(batch_id):
        raise InvalidRequest(
            "invalid_batch_id", "a batch id is 1-100 printable ASCII characters, no spaces"
        )


def _placeholder(batch_id: str, description: str | None, total: int, results: bool) -> Any:
    """The ``batch`` argument a callback receives, with zero counts: checked at creation,
    so a callback that cannot take it is refused before anything is written."""
    info: dict[str, Any] = {
        "id": batch_id,
        "event": "complete",
        "description": description,
        "total": total,
        "succeeded": 0,
        "failed": 0,
        "dead": 0,
        "cancelled": 0,
    }
    if results:
        info["results"] = {}
    return info


async def _resolve(
    client: Client, job: Job, tenant: str, job_id: str | None, extra: Mapping[str, Any]
) -> ClaimRequest:
    """``job`` checked and resolved as ``Client.submit`` does (``extra``: args added for the
    check only, a callback's ``batch``)."""
    registered = None if client.app is not None else await client.registered_type(job.type)
    request = client._request(
        job.type,
        {**dict(job.args), **extra},
        tenant,
        job.queue,
        job.priority,
        None,
        job_id,
        job.max_attempts,
        job.timeout,
        registered,
    )
    if extra:
        request.args = {k: v for k, v in request.args.items() if k not in extra}
    return request


async def _callbacks(
    client: Client,
    batch_id: str,
    tenant: str,
    description: str | None,
    total: int,
    given: Mapping[str, JobLike | None],
    collect: bool,
) -> dict[str, dict[str, Any] | None]:
    """Each callback resolved and stored as the trigger inserts it."""
    stored: dict[str, dict[str, Any] | None] = {}
    for name, value in given.items():
        if value is None:
            stored[name] = None
            continue
        job = Job.of(value)
        if job.job_id is not None:
            raise InvalidRequest("invalid_batch", f"{name}: a callback's job id is fixed")
        spec = client.app.jobs.get(job.type) if client.app is not None else None
        if spec is not None and "batch" not in spec.arg_names:
            raise InvalidRequest(
                "invalid_batch",
                f"{name}: job type {job.type!r} must take a `batch` argument (the batch's "
                "id, counts and, for a group, results)",
            )
        extra = {"batch": _placeholder(batch_id, description, total, collect)}
        request = await _resolve(client, job, tenant, f"{batch_id}:on_complete", extra)
        stored[name] = {
            "type": request.type,
            "args": request.args,
            "queue": request.queue,
            "tenant": request.tenant,
            "priority": request.priority,
            "max_attempts": request.max_attempts,
            "timeout_seconds": request.timeout,
        }
    return stored


def _check_header(batch_id: str, description: str | None, count: int) -> None:
    check_batch_id(batch_id)
    if description is not None:
        if (problem := storable.text_problem(description)) is not None:
            raise InvalidRequest("invalid_batch", f"the description {problem}")
        if len(description) > MAX_DESCRIPTION:
            raise InvalidRequest(
                "invalid_batch", f"the description is over {MAX_DESCRIPTION} characters"
            )
    if not 0 < count <= MAX_BATCH_MEMBERS:
        raise InvalidRequest(
            "invalid_batch",
            f"a batch has 1-{MAX_BATCH_MEMBERS} members when created, not {count}",
        )


async def create_batch(
    client: Client,
    members: Sequence[JobLike],
    callbacks: Mapping[str, JobLike | None],
    *,
    tenant: str,
    description: str | None,
    batch_id: str | None,
    collect_results: bool,
) -> BatchRecord:
    """Check everything, insert the batch and its members in one transaction, publish.

    A batch id that exists returns that batch (nothing new is written): a
    producer that retries a ``batch`` call after a lost answer gets the same batch.
    """
    batch_id = batch_id or new_job_id()
    jobs = [Job.of(member) for member in members]
    _check_header(batch_id, description, len(jobs))
    requests = [
        await _resolve(client, job, tenant, job.job_id or member_job_id(batch_id, i), {})
        for i, job in enumerate(jobs)
    ]
    if len({r.id for r in requests}) != len(requests):
        raise InvalidRequest("invalid_batch", "two members have the same job id")
    stored = await _callbacks(
        client, batch_id, tenant, description, len(jobs), callbacks, collect_results
    )
    store = client.store
    # the members join the caller's trace under one span of the submission (tracing.py)
    with tracing.span(
        "coldbrew batch", {"coldbrew.batch.id": batch_id, "coldbrew.job.tenant": tenant}
    ):
        tracing.stamp(requests)
        created, marks = await store.batches.create(
            batch_id,
            tenant,
            description,
            requests,
            stored,
            collect_results=collect_results,
            relay_grace=client.settings.relay_grace_seconds,
        )
        if not created:
            existing = await store.batches.get(batch_id)
            if existing.tenant != tenant:
                raise InvalidRequest("invalid_batch", f"batch id {batch_id!r} is taken")
            ids = await store.batches.member_ids(batch_id, existing.total)
            return replace(existing, member_ids=tuple(ids))
        await _publish(client, requests, dict(marks))
    record = await store.batches.get(batch_id)
    return replace(record, member_ids=tuple(r.id for r in requests))


async def _publish(client: Client, requests: list[ClaimRequest], marks: dict[str, Any]) -> None:
    """Publish the members with pipelined confirms; what fails stays due for the relay."""
    if client.broker is None:
        return
    try:
        confirmed = await client.broker.publish_jobs(requests)
    except BrokerUnavailable as exc:
        log.warning("batch_publish_deferred_to_relay", members=len(requests), error=str(exc))
        return
    done = [(r.id, marks[r.id]) for r, ok in zip(requests, confirmed, strict=True) if ok]
    await client.store.outbox.mark_published(done)


async def cancel_batch(store: JobStore, batch_id: str, reason: str) -> BatchRecord:
    """Cancel every unfinished member (``request_cancel``'s rules); return the batch."""
    check_batch_id(batch_id)
    for attempt in range(1, CANCEL_TRIES + 1):
        try:
            touched = await store.batches.cancel(batch_id, reason)
        except TransientDatabaseError:  # a lock cycle with a completion, rolled back
            if attempt == CANCEL_TRIES:
                raise
            await asyncio.sleep(0.05 * attempt)
            continue
        log.info("batch_cancel_requested", batch_id=batch_id, members=touched)
        break
    return await store.batches.get(batch_id)


class BatchHandle:
    """``ctx.batch``: the batch of the running member, and ``add`` to grow it."""

    def __init__(
        self,
        store: JobStore,
        settings: Settings,
        *,
        job_id: str,
        attempt: int,
        tenant: str,
    ) -> None:
        self._store = store
        self._settings = settings
        self._job_id = job_id
        self._attempt = attempt
        self._tenant = tenant

    async def add(
        self,
        type: str,
        args: Mapping[str, Any] | None = None,
        *,
        name: str,
        queue: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> str:
        """Add a member to this job's batch; return its id (``<this job's id>+<name>``).

        The insert and the batch's pending count go in one transaction that
        holds this member, so the batch cannot complete in between; the same
        ``name`` again (a retry of this job) adds nothing. The relay publishes
        the new member within ``COLDBREW_RELAY_INTERVAL_SECONDS``. Raises
        ``Permanent`` (the job fails at once) when this job is in no batch or
        its batch was cancelled, ``InvalidRequest`` when the member would be
        refused, ``StaleWrite`` when this attempt no longer holds the job.
        """
        from coldbrew.client import prepare_job

        storable.check_text(name, "batch member name")
        job_id = added_member_id(self._job_id, name)
        if not JOB_ID_RE.match(job_id):
            raise InvalidRequest(
                "invalid_job_id",
                f"member id {job_id!r} (this job's id, '+', the name) must be 1-128 "
                "printable ASCII characters",
            )
        registered = await self._store.types.get(type)
        request = prepare_job(
            self._settings,
            registered,
            type,
            dict(args or {}),
            tenant=self._tenant,
            queue=queue,
            priority=priority,
            idempotency_key=None,
            job_id=job_id,
            max_attempts=max_attempts,
            timeout=timeout,
        )
        tracing.stamp((request,))  # the member joins the adding member's run span's trace
        try:
            added = await self._store.batches.add_member(self._job_id, self._attempt, request)
        except InvalidRequest as exc:  # no batch, or a cancelled one: a retry cannot help
            raise Permanent(str(exc)) from None
        log.debug("batch_member_added", job_id=job_id, by=self._job_id, new=added)
        return job_id
