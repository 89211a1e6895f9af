"""``Client``: submit jobs and follow them, for Python producers, the CLI and the API.

A submission is transactional: the job row is committed with a publish mark,
then published with a confirm, then the mark is cleared. If the process dies
between commit and confirm, a worker's relay publishes the row later, so a
submission that returned is never lost (guarantee 1).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import structlog

from coldbrew import storable, tracing
from coldbrew.app import App, JobSpec
from coldbrew.batches import BatchRecord
from coldbrew.batchjobs import JobLike, cancel_batch, check_batch_id, create_batch
from coldbrew.errors import BrokerUnavailable, ContractViolation, InvalidRequest, JobNotFound
from coldbrew.flow import Chain, Step, chain_step_id, child_job_id
from coldbrew.metrics import Metrics
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
from coldbrew.store import ChainRecord, ClaimRequest, JobStore, RegisteredType, UniqueKey
from coldbrew.transport import Broker
from coldbrew.unique import UniqueError, UniqueOpts, merged
from coldbrew.urlguard import check_webhook_url

log = structlog.get_logger("coldbrew.client")

MAX_REASON = 500
"""Longest cancel reason, in characters (it becomes the job's error message)."""

REGISTERED_TTL = 5.0
"""Seconds a client trusts a job type's registration it read (a lane rarely moves)."""
UNREGISTERED_TTL = 1.0
"""Seconds it trusts that a type is not registered (a worker may be starting)."""
REGISTERED_CACHE_SIZE = 1024
"""Most type names cached (an API's submitters may send any name)."""

CHILD_OPTIONS = frozenset({"tenant", "queue", "priority", "max_attempts", "timeout"})
"""What ``ctx.submit`` takes besides type, args and name."""


def step_record(request: ClaimRequest, result_arg: str | None) -> dict[str, Any]:
    """One resolved step as the chain's record keeps it (what the trigger inserts)."""
    return {
        "id": request.id,
        "type": request.type,
        "queue": request.queue,
        "tenant": request.tenant,
        "args": request.args,
        "priority": request.priority,
        "max_attempts": request.max_attempts,
        "timeout": request.timeout,
        "result_arg": result_arg,
    }


def _check_transactional(connection: Any, *, unique: bool) -> None:
    """``submit(connection=)`` takes an asyncpg connection, and no unique options."""
    if unique:
        raise InvalidRequest(
            "invalid_unique",
            "a unique job cannot be submitted in your transaction (connection=) yet: "
            "its key is taken in a statement of its own; submit it without connection=",
        )
    if not isinstance(connection, asyncpg.Connection):
        raise InvalidRequest(
            "invalid_request",
            "connection= takes an asyncpg connection (with SQLAlchemy: the raw one, "
            "(await conn.get_raw_connection()).driver_connection), "
            f"not a {connection.__class__.__name__}",
        )


class Client:
    """Connected to the job store and (for submissions) the broker."""

    def __init__(
        self, settings: Settings, store: JobStore, broker: Broker | None, app: App | None
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.app = app
        self.metrics: Metrics | None = None
        """Where unique duplicates are counted (``coldbrew_unique_duplicates_total``,
        source ``client``); None (not counted) unless the process that owns the client
        exports metrics and sets it."""
        self._registered: dict[str, tuple[float, RegisteredType | None]] = {}

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        settings: Settings | None = None,
        *,
        app: App | None = None,
        broker: bool = True,
        check_schema: bool = False,
    ) -> AsyncIterator[Client]:
        """Open connections (settings from the environment by default); close them on exit.

        ``check_schema``: raise ``SchemaOutOfDate`` ("run `coldbrew migrate`") when the
        namespace's schema is missing or old, before anything is declared on the broker.
        """
        settings = settings or load_settings()
        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(
                JobStore.open(settings.database_url, settings.namespace, pool_size=4)
            )
            if check_schema:
                await store.check_schema()
            connected = None
            if broker:
                connected = Broker(settings.amqp_url, settings.topology(), name="coldbrew-client")
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
        unique_for: float | str | None = None,
        unique_by: tuple[str, ...] | str | None = None,
        unique_states: tuple[str, ...] | str | None = None,
        unique_keys: tuple[str, ...] | str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        webhook_url: str | None = None,
        connection: asyncpg.Connection | None = None,
    ) -> JobRecord:
        """Submit a job and return its record; the same idempotency key returns the same job.

        ``connection``: an asyncpg connection inside a transaction the caller owns. The
        job's row is written there and commits or rolls back with the caller's rows;
        nothing is published now: the relays publish it once it commits (woken by a
        NOTIFY that PostgreSQL delivers at commit). README "Enqueue in your transaction".

        ``webhook_url``: when the job reaches a terminal status, a signed webhook is
        delivered there by a job of its own, enqueued with the outcome (README
        "Webhooks"); without one, the tenant's URL (``coldbrew tenants set T
        --webhook-url``), if any. A literal loopback, private, link-local, ... address is
        refused (``invalid_webhook_url``) unless ``COLDBREW_WEBHOOK_ALLOW_PRIVATE``.

        ``run_at`` (a timezone-aware datetime) or ``delay`` (seconds, or a
        ``timedelta``, from when PostgreSQL records the job) schedules it: the
        job is ``scheduled`` until then and the relay publishes it at its
        time. A time in the past, or a delay of 0, runs it now.

        ``unique_for`` and its companions (README "Unique jobs") override the type's
        ``@app.job(unique_for=...)`` for this submission: while a job with the same key
        stands, its record is returned with ``duplicate=True`` and nothing is published.

        Without an app, the type's lane and defaults come from its registration by the
        fleet's workers (``registered_type``); a type no worker registered goes to
        ``default`` unless ``queue`` names a lane.
        """
        spec = self.app.jobs.get(type) if self.app is not None else None
        try:
            opts = merged(
                spec.unique if spec is not None else None,
                unique_for,
                unique_by,
                unique_states,
                unique_keys,
            )
        except UniqueError as exc:
            raise InvalidRequest("invalid_unique", str(exc)) from None
        scheduled_at, scheduled_delay = check_schedule(run_at, delay, now=datetime.now(UTC))
        if opts is not None and (scheduled_at is not None or scheduled_delay is not None):
            raise InvalidRequest(
                "invalid_unique", "a unique job cannot be scheduled (run_at, delay) yet"
            )
        if connection is not None:
            _check_transactional(connection, unique=opts is not None)
        registered = None if self.app is not None else await self.registered_type(type)
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
            registered,
        )
        request.webhook_url = self._webhook(webhook_url)
        # the job's trace starts here (or joins the caller's span): its context goes into
        # the row and the message, so every later publish of the job stays in this trace
        with tracing.job_span("coldbrew submit", request, kind="producer"):
            if opts is not None:
                return await self._submit_unique(request, opts)
            request.run_at, request.delay = scheduled_at, scheduled_delay
            if connection is not None:
                return await self.store.flow.insert_in_transaction(connection, request)
            record, mark = await self.store.jobs.insert_job(
                request, relay_grace=self.settings.relay_grace_seconds
            )
            # a new queued job (an existing one keeps its own publishing; a scheduled one has
            # no message until the relay publishes it at its run_at)
            if mark is not None and record.status is Status.QUEUED:
                await self._publish(request, mark)
            return record

    def _webhook(self, url: str | None) -> str | None:
        """The submission's webhook URL, checked (``InvalidRequest("invalid_webhook_url")``)."""
        if url is None:
            return None
        try:
            return check_webhook_url(url, allow_private=self.settings.webhook_allow_private).url
        except ContractViolation as violation:
            raise InvalidRequest(violation.reason, violation.detail) from None

    async def _submit_unique(self, request: ClaimRequest, opts: UniqueOpts) -> JobRecord:
        """Insert the job unless its unique key's holder stands; return the holder then."""
        record, mark, duplicate = await self.store.unique.insert(
            request, UniqueKey.of(request, opts), relay_grace=self.settings.relay_grace_seconds
        )
        if duplicate:
            if self.metrics is not None:
                self.metrics.unique_duplicates.labels(request.type, "client").inc()
            log.debug("unique_duplicate", type=request.type, job_id=record.id)
            return replace(record, duplicate=True)
        if mark is not None:
            await self._publish(request, mark)
        return record

    def prepare(
        self,
        type: str,
        args: Mapping[str, Any],
        *,
        job_id: str,
        tenant: str = "default",
        queue: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> ClaimRequest:
        """The checked job ``submit`` would insert, for a caller that inserts it in a
        transaction of its own (the cron service), then hands it to ``publish``."""
        return self._request(
            type, dict(args), tenant, queue, priority, None, job_id, max_attempts, timeout
        )

    async def publish(self, request: ClaimRequest, mark: datetime) -> None:
        """Publish an inserted job now; if that fails the relay publishes it when due."""
        await self._publish(request, mark)

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
        registered: RegisteredType | None = None,
        *,
        known: bool = True,
        validate: bool = True,
    ) -> ClaimRequest:
        # known=False: a type this app lacks is another app's (a child's): not an error
        spec = None
        if self.app is not None:
            spec = self.app.get(type) if known else self.app.jobs.get(type)
        return prepare_job(
            self.settings,
            spec or registered,  # the app's own word, else the fleet's
            type,
            args,
            validate=validate,
            tenant=tenant,
            queue=queue,
            priority=priority,
            idempotency_key=idempotency_key,
            job_id=job_id,
            max_attempts=max_attempts,
            timeout=timeout,
        )

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

    # --- batches (batchjobs.py) ---------------------------------------------------------

    async def batch(
        self,
        members: Sequence[JobLike],
        *,
        on_success: JobLike | None = None,
        on_complete: JobLike | None = None,
        on_death: JobLike | None = None,
        description: str | None = None,
        tenant: str = "default",
        batch_id: str | None = None,
    ) -> BatchRecord:
        """Submit ``members`` as one batch; its callbacks run once when it is done.

        ``on_complete`` runs when every member is terminal, ``on_success`` when
        every member succeeded, ``on_death`` when a member is dead (once, the
        first). Each is a ``Job`` (or ``(type, args)``) whose function takes a
        ``batch`` argument too: the batch's id, event and counts. The batch
        and its members commit in one transaction; an existing ``batch_id``
        returns that batch. The result's ``member_ids`` are in order.
        """
        return await create_batch(
            self,
            members,
            {"on_success": on_success, "on_complete": on_complete, "on_death": on_death},
            tenant=tenant,
            description=description,
            batch_id=batch_id,
            collect_results=False,
        )

    async def group(
        self,
        members: Sequence[JobLike],
        *,
        then: JobLike,
        on_death: JobLike | None = None,
        on_complete: JobLike | None = None,
        description: str | None = None,
        tenant: str = "default",
        batch_id: str | None = None,
    ) -> BatchRecord:
        """Fan out, fan in: run ``members``; when all succeeded, run ``then`` with their
        results (``batch["results"]``: member id → result; ``member_ids`` gives the
        order). A batch with ``on_success=then`` whose callbacks get the results."""
        return await create_batch(
            self,
            members,
            {"on_success": then, "on_complete": on_complete, "on_death": on_death},
            tenant=tenant,
            description=description,
            batch_id=batch_id,
            collect_results=True,
        )

    async def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch with its members' counts; ``BatchNotFound`` when there is none."""
        check_batch_id(batch_id)
        return await self.store.batches.get(batch_id)

    async def batch_status(self, batch_id: str) -> dict[str, Any]:
        """The batch's status JSON (``GET /batches/{id}``, ``coldbrew batch status``)."""
        return (await self.get_batch(batch_id)).to_status_json()

    async def cancel_batch(
        self, batch_id: str, reason: str = "batch cancelled by request"
    ) -> BatchRecord:
        """Cancel the batch's waiting members at once and its running ones within one
        heartbeat (``cancel``'s rules); no member can be added to it afterwards."""
        _check_reason(reason)
        return await cancel_batch(self.store, batch_id, reason)

    async def child_request(
        self, parent_id: str, type: str, args: Mapping[str, Any], options: Mapping[str, Any]
    ) -> ClaimRequest:
        """The checked child job ``ctx.submit`` collects (``context.Spawn``): its id derived
        from the parent's and ``options["name"]``; a type not in this app is routed by
        its registration, like a submission without the app."""
        opts = dict(options)
        name = opts.pop("name")
        unknown = sorted(set(opts) - CHILD_OPTIONS)
        if unknown:
            raise TypeError(f"ctx.submit got unknown options {unknown}; it takes {CHILD_OPTIONS}")
        in_app = self.app is not None and type in self.app.jobs
        registered = None if in_app else await self.registered_type(type)
        request = self._request(
            type,
            dict(args),
            opts.get("tenant", "default"),
            opts.get("queue"),
            opts.get("priority", 0),
            None,
            child_job_id(parent_id, name),
            opts.get("max_attempts"),
            opts.get("timeout"),
            registered,
            known=False,
        )
        tracing.stamp((request,))  # ctx.submit runs in the parent's run span: its child
        return request

    async def submit_chain(self, chain: Chain) -> ChainRecord:
        """Submit a chain (``coldbrew.flow.chain``); return its record.

        Every step is resolved and checked now, as a submission would be (a step
        after the first is checked with its ``result_arg`` present); the record and
        the first step's job commit together, and each later step's job is inserted
        by PostgreSQL when the one before it succeeds. The same ``chain_id`` twice
        returns the existing chain.
        """
        chain_id = chain.chain_id or new_job_id()
        check_job_id(chain_id)
        requests, steps = [], []
        for index, step in enumerate(chain.steps):
            passes = index > 0 and step.result_arg is not None
            registered = None if self.app is not None else await self.registered_type(step.type)
            self._check_result_arg(step, passes)
            request = self._request(
                step.type,
                dict(step.args),
                chain.tenant,
                step.queue,
                step.priority,
                None,
                chain_step_id(chain_id, index),
                step.max_attempts,
                step.timeout,
                registered,
                validate=not passes,
            )
            requests.append(request)
            steps.append(step_record(request, step.result_arg if passes else None))
        mark = await self.store.flow.insert_chain(
            chain_id,
            chain.tenant,
            steps,
            requests[0],
            relay_grace=self.settings.relay_grace_seconds,
        )
        if mark is not None:
            await self._publish(requests[0], mark)
        return await self.store.flow.get_chain(chain_id)

    def _check_result_arg(self, step: Step, passes: bool) -> None:
        """A step that receives the previous result must take it as a parameter (its
        other args are checked against the signature when it runs, result included)."""
        spec = self.app.jobs.get(step.type) if self.app is not None else None
        if not passes or spec is None or spec.args_model is None:
            return
        if step.result_arg not in spec.arg_names:
            raise InvalidRequest(
                "invalid_arguments",
                f"chain step {step.type!r} receives the previous result as "
                f"{step.result_arg!r}, which is not one of its parameters "
                f"({', '.join(spec.arg_names) or 'none'}); add it, or pass result_arg=None",
            )

    async def chain_status(self, chain_id: str) -> ChainRecord:
        """A chain's record: status, current step, the jobs of the steps it reached, and
        why it stopped (a step that failed, died or was cancelled)."""
        check_job_id(chain_id)
        return await self.store.flow.get_chain(chain_id)

    async def registered_type(self, type: str) -> RegisteredType | None:
        """How the fleet's workers registered ``type`` (its lane and defaults), or None
        when none did yet; cached briefly, so a burst of submissions reads it once."""
        loop = asyncio.get_running_loop()
        cached = self._registered.get(type)
        if cached is not None and cached[0] > loop.time():
            return cached[1]
        found = await self.store.types.get(type)
        ttl = REGISTERED_TTL if found is not None else UNREGISTERED_TTL
        if len(self._registered) >= REGISTERED_CACHE_SIZE:  # type names may come from outside
            self._registered.clear()
        self._registered[type] = (loop.time() + ttl, found)
        return found

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
        _check_reason(reason)
        record = await self.store.jobs.request_cancel(job_id, reason)
        if record.status is Status.RUNNING:
            log.info("cancel_requested", job_id=job_id)
        return record


def _check_reason(reason: str) -> None:
    if (problem := storable.text_problem(reason)) is not None or len(reason) > MAX_REASON:
        problem = problem or f"is {len(reason)} characters long; the limit is {MAX_REASON}"
        raise InvalidRequest("invalid_request", f"the cancel reason {problem}")


def prepare_job(
    settings: Settings,
    declared: JobSpec | RegisteredType | None,
    type: str,
    args: dict[str, Any],
    *,
    tenant: str,
    queue: str | None,
    priority: int,
    idempotency_key: str | None,
    job_id: str | None,
    max_attempts: int | None,
    timeout: float | None,
    validate: bool = True,
) -> ClaimRequest:
    """The checked job a submission inserts: args validated against the app's signature
    (when ``declared`` is its ``JobSpec``), the lane and defaults resolved, and exactly the
    message a worker will accept (``check_submission``). Shared by ``Client.submit``,
    batches and ``ctx.batch.add``."""
    if isinstance(declared, JobSpec) and validate:  # validate=False: a chain step's later args
        args = declared.validate_args(args)
    lane = queue or (declared.queue if declared else "default")
    given = JobFields(
        job_id or "", type, lane, tenant, args, priority, max_attempts, timeout, idempotency_key
    )
    job = given.resolved(declared, settings.max_attempts)  # defaults chain (model.py)
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
        max_body_bytes=settings.max_body_bytes,
    )
    job.id = job_id or (
        job_id_for_key(tenant, idempotency_key) if idempotency_key else new_job_id()
    )
    return job


__all__ = ["Client", "JobNotFound", "prepare_job"]
