"""``Client``: submit jobs and follow them, for Python producers, the CLI and the API.

A submission is transactional: the job row is committed with a publish mark,
then published with a confirm, then the mark is cleared. If the process dies
between commit and confirm, a worker's relay publishes the row later, so a
submission that returned is never lost (guarantee 1).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from coldbrew import storable
from coldbrew.app import App
from coldbrew.errors import BrokerUnavailable, InvalidRequest, JobNotFound
from coldbrew.model import (
    JobFields,
    JobRecord,
    Status,
    check_job_id,
    check_schedule,
    check_submission,
    job_id_for_key,
    new_job_id,
)
from coldbrew.settings import Settings, load_settings
from coldbrew.store import ClaimRequest, JobStore
from coldbrew.topology import Topology
from coldbrew.transport import Broker

log = structlog.get_logger("coldbrew.client")

MAX_REASON = 500
"""Longest cancel reason, in characters (it becomes the job's error message)."""


class Client:
    """Connected to the job store and (for submissions) the broker."""

    def __init__(
        self, settings: Settings, store: JobStore, broker: Broker | None, app: App | None
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.app = app

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        settings: Settings | None = None,
        *,
        app: App | None = None,
        broker: bool = True,
    ) -> AsyncIterator[Client]:
        """Open connections (settings from the environment by default); close them on exit."""
        settings = settings or load_settings()
        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(
                JobStore.open(settings.database_url, settings.namespace, pool_size=4)
            )
            connected = None
            if broker:
                connected = Broker(
                    settings.amqp_url, Topology(settings.namespace), name="coldbrew-client"
                )
                await connected.connect()
                stack.push_async_callback(connected.close)
            yield cls(settings, store, connected, app)

    async def submit(
        self,
        type: str,
        args: Mapping[str, Any] | None = None,
        *,
        tenant: str = "default",
        queue: str | None = None,
        priority: int = 0,
        idempotency_key: str | None = None,
        job_id: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
    ) -> JobRecord:
        """Submit a job and return its record; the same idempotency key returns the same job.

        ``run_at`` (a timezone-aware datetime) or ``delay`` (seconds, or a
        ``timedelta``, from when PostgreSQL records the job) schedules it: the
        job is ``scheduled`` until then and the relay publishes it at its
        time. A time in the past, or a delay of 0, runs it now.
        """
        request = self._request(
            type,
            dict(args or {}),
            tenant,
            queue,
            priority,
            idempotency_key,
            job_id,
            max_attempts,
            timeout,
        )
        request.run_at, request.delay = check_schedule(run_at, delay, now=datetime.now(UTC))
        record, mark = await self.store.jobs.insert_job(
            request, relay_grace=self.settings.relay_grace_seconds
        )
        # a new queued job (an existing one keeps its own publishing; a scheduled one has no
        # message until the relay publishes it at its run_at)
        if mark is not None and record.status is Status.QUEUED:
            await self._publish(request, mark)
        return record

    def _request(
        self,
        type: str,
        args: dict[str, Any],
        tenant: str,
        queue: str | None,
        priority: int,
        idempotency_key: str | None,
        job_id: str | None,
        max_attempts: int | None,
        timeout: float | None,
    ) -> ClaimRequest:
        spec = self.app.get(type) if self.app is not None else None
        if spec is not None:
            args = spec.validate_args(args)
        lane = queue or (spec.queue if spec else "default")
        given = JobFields(
            job_id or "", type, lane, tenant, args, priority, max_attempts, timeout, idempotency_key
        )
        job = given.resolved(spec, self.settings.max_attempts)  # the defaults chain (model.py)
        # what goes on the wire, defaults filled in: exactly what a worker will check
        check_submission(
            job_id=job_id,
            type=type,
            args=args,
            queue=lane,
            tenant=tenant,
            priority=priority,
            idempotency_key=idempotency_key,
            max_attempts=job.max_attempts,
            timeout=job.timeout,
            max_body_bytes=self.settings.max_body_bytes,
        )
        job.id = job_id or (
            job_id_for_key(tenant, idempotency_key) if idempotency_key else new_job_id()
        )
        return job

    async def _publish(self, request: ClaimRequest, mark: datetime) -> None:
        """Publish with a confirm, then clear the mark; on failure the relay publishes later."""
        if self.broker is None:
            return
        try:
            await self.broker.publish_job(
                request  # the claim's fields are the message's (one job value)
            )
        except BrokerUnavailable as exc:
            log.warning("publish_deferred_to_relay", job_id=request.id, error=str(exc))
            return
        await self.store.outbox.mark_published([(request.id, mark)])

    async def status(self, job_id: str) -> dict[str, Any]:
        """The job's status JSON (DESIGN §1)."""
        return (await self.get(job_id)).to_status_json()

    async def get(self, job_id: str) -> JobRecord:
        """The job's record; ``InvalidRequest`` for an id no job can have (a NUL, say)."""
        check_job_id(job_id)
        return await self.store.jobs.get_job(job_id)

    async def wait(self, job_id: str, *, timeout: float = 60.0, poll: float = 0.2) -> JobRecord:
        """Wait until the job is terminal; raise ``TimeoutError`` after ``timeout`` seconds."""
        check_job_id(job_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = min(poll, 0.05)
        while True:
            record = await self.store.jobs.get_job(job_id)
            if record.status.terminal:
                return record
            if loop.time() >= deadline:
                raise TimeoutError(f"job {job_id} is still {record.status} after {timeout:g} s")
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
            delay = min(delay * 2, poll)

    async def cancel(self, job_id: str, reason: str = "cancelled by request") -> JobRecord:
        """Cancel a waiting (queued, retrying or scheduled) job at once; a running one is
        stopped within one heartbeat."""
        check_job_id(job_id)
        if (problem := storable.text_problem(reason)) is not None or len(reason) > MAX_REASON:
            problem = problem or f"is {len(reason)} characters long; the limit is {MAX_REASON}"
            raise InvalidRequest("invalid_request", f"the cancel reason {problem}")
        record = await self.store.jobs.request_cancel(job_id, reason)
        if record.status is Status.RUNNING:
            log.info("cancel_requested", job_id=job_id)
        return record


__all__ = ["Client", "JobNotFound"]
