"""``coldbrew.testing``: test helpers for applications that use coldbrew.

Modelled on Oban.Testing, River's rivertest and Sidekiq::Testing, but against
the real services (coldbrew's rule: no mocks of RabbitMQ or PostgreSQL):

* ``burst(app)``: an async context manager on a fresh namespace (its own
  PostgreSQL schema and broker entities, migrated), with a ``Client``. Jobs
  you submit stay enqueued until ``drain()`` starts a worker, waits until
  nothing is due (children and chain steps the jobs spawned included), and
  stops it -- so you can ``assert_enqueued`` first, then drain, then check
  results. Everything is dropped on exit.
* ``assert_enqueued`` / ``refute_enqueued``: a waiting job (queued,
  scheduled or retrying) of a type whose args *contain* the ones given.
* ``run_inline(app, type, args)``: run one job's function directly, now, with
  a real ``Context`` (no broker, no row); returns its result, the children it
  spawned with ``ctx.submit`` and the progress it reported. With ``store=``
  (``Harness.run_inline``) its checkpoints and once-guards work too.

A pytest fixture is three lines (README "Testing your jobs")::

    @pytest.fixture
    async def coldbrew():
        async with burst(app) as harness:
            yield harness
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aio_pika

from coldbrew.app import App
from coldbrew.client import Client
from coldbrew.context import Context
from coldbrew.migrate import drop_namespace, migrate
from coldbrew.model import JobFields, JobRecord
from coldbrew.settings import Settings, load_settings
from coldbrew.store import JobStore
from coldbrew.worker import Worker

__all__ = ["Harness", "InlineRun", "burst", "run_inline"]

WAITING = ("queued", "scheduled", "retrying")
"""The statuses ``assert_enqueued`` counts as enqueued (not started, not finished)."""

BURST_SETTINGS: dict[str, Any] = {
    "metrics_port": 0,
    "metrics_host": "127.0.0.1",
    "lease_seconds": 10.0,
    "heartbeat_seconds": 1.0,
    "relay_interval_seconds": 0.2,
    "reaper_interval_seconds": 1.0,
    "retry_base_seconds": 0.05,
    "retry_max_seconds": 0.5,
    "shutdown_grace_seconds": 5.0,
    "processes": 1,
    "log_level": "warning",
}
"""Short intervals for tests; ``burst(**overrides)`` changes any of them."""


@dataclass
class InlineRun:
    """What ``run_inline`` saw: the job's return value, its children, its progress."""

    result: Any
    children: list[JobFields] = field(default_factory=list)
    progress: list[tuple[float | None, str | None]] = field(default_factory=list)


class Harness:
    """A fresh namespace with a client; ``drain`` runs what is due with a worker."""

    def __init__(self, app: App, settings: Settings, client: Client) -> None:
        self.app = app
        self.settings = settings
        self.client = client

    @property
    def store(self) -> JobStore:
        return self.client.store

    async def submit(self, type: str, args: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        """``Client.submit`` (the same options)."""
        return await self.client.submit(type, args, **kw)

    async def drain(self, *, timeout: float = 30.0, horizon: float = 0.0) -> None:
        """Start a worker, wait until no job is queued or running (nor retrying or
        scheduled within ``horizon`` seconds), then stop it; ``TimeoutError`` after
        ``timeout`` seconds."""
        worker = Worker(self.app, self.settings)
        task = asyncio.create_task(worker.run(), name="coldbrew-testing-worker")
        try:
            await worker.wait_ready(task)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            quiet = 0
            while quiet < 2:  # twice in a row: a job's outcome may be spawning the next
                await asyncio.sleep(0.05)
                unsettled = await self.store.flow.count_unsettled(horizon)
                quiet = quiet + 1 if unsettled == 0 else 0
                if unsettled and loop.time() > deadline:
                    raise TimeoutError(f"{unsettled} jobs still due after {timeout:g} s")
        finally:
            worker.stop()
            await task

    async def jobs(self, **filters: Any) -> list[JobRecord]:
        """Jobs by ``type``, ``args`` (contained), ``tenant``, ``queue``, ``statuses``."""
        return await self.store.flow.find_jobs(**filters)

    async def assert_enqueued(
        self,
        *,
        type: str,
        args: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        queue: str | None = None,
    ) -> JobRecord:
        """The waiting job of ``type`` whose args contain ``args``; AssertionError listing
        what is enqueued when there is none."""
        found = await self.jobs(type=type, args=args, tenant=tenant, queue=queue, statuses=WAITING)
        if not found:
            waiting = await self.jobs(statuses=WAITING)
            listed = ", ".join(f"{j.type}({j.args}, tenant={j.tenant})" for j in waiting[:20])
            raise AssertionError(
                f"no {type} job enqueued with args containing {dict(args or {})}"
                f"{f' for tenant {tenant}' if tenant else ''}; enqueued: {listed or 'none'}"
            )
        return found[0]

    async def refute_enqueued(
        self,
        *,
        type: str,
        args: Mapping[str, Any] | None = None,
        tenant: str | None = None,
        queue: str | None = None,
    ) -> None:
        """AssertionError if a waiting job of ``type`` has args containing ``args``."""
        found = await self.jobs(type=type, args=args, tenant=tenant, queue=queue, statuses=WAITING)
        if found:
            raise AssertionError(f"{len(found)} {type} jobs enqueued: {found[0].args} ...")

    async def run_inline(self, type: str, args: Mapping[str, Any] | None = None) -> InlineRun:
        """``run_inline`` with this namespace's store (checkpoints and once-guards work)."""
        return await run_inline(self.app, type, args, store=self.store, settings=self.settings)


@asynccontextmanager
async def burst(
    app: App, settings: Settings | None = None, **overrides: Any
) -> AsyncIterator[Harness]:
    """A ``Harness`` on a fresh namespace of the services ``settings`` (default: the
    environment's, ``COLDBREW_*``) name; migrated on entry, dropped on exit."""
    base = settings or load_settings()
    values = {**base.model_dump(), **BURST_SETTINGS, **overrides}
    values["namespace"] = overrides.get("namespace") or f"cbtest_{secrets.token_hex(4)}"
    values.pop("worker_id", None)
    fresh = load_settings(**values)
    await migrate(fresh.database_url, fresh.namespace)
    try:
        async with Client.connect(fresh, app=app) as client:
            yield Harness(app, fresh, client)
            queues = await client.store.tenants.list_tenant_queues()
    finally:
        await drop_namespace(fresh.database_url, fresh.namespace)
    await _drop_broker_entities(fresh, queues)


async def _drop_broker_entities(settings: Settings, queues: list[tuple[str, str]]) -> None:
    topo = settings.topology()
    connection = await aio_pika.connect(settings.amqp_url.split(",")[0])
    try:
        channel = await connection.channel()
        for queue in topo.every_queue_name(queues):
            await channel.queue_delete(queue)
        for exchange in (topo.jobs_exchange, topo.unrouted_exchange, topo.dead_exchange):
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()


async def run_inline(
    app: App,
    type: str,
    args: Mapping[str, Any] | None = None,
    *,
    job_id: str | None = None,
    tenant: str = "default",
    attempt: int = 1,
    checkpoint: Any = None,
    store: JobStore | None = None,
    settings: Settings | None = None,
) -> InlineRun:
    """Run job ``type``'s function now with a real ``Context``: args checked against its
    signature, ``ctx.submit`` collecting (not writing) children, progress recorded.

    Without ``store`` nothing touches a database: ``ctx.checkpoint`` and ``ctx.once``
    raise ``RuntimeError``. A plain-function (process-pool) job runs in a thread here,
    its ``ctx`` calls bridged to the event loop.
    """
    spec = app.get(type)
    checked = spec.validate_args(dict(args or {}))
    run = InlineRun(None)
    requests = Client(settings or load_settings(), store, None, app)  # type: ignore[arg-type]
    ctx = Context(
        job_id=job_id or f"inline-{secrets.token_hex(6)}",
        type=type,
        queue=spec.queue,
        tenant=tenant,
        attempt=attempt,
        max_attempts=spec.max_attempts or attempt,
        checkpoint_state=checkpoint,
        store=store,
        on_progress=lambda fraction, message: run.progress.append((fraction, message)),
        spawn=requests.child_request,
    )
    if spec.is_coroutine:
        run.result = await spec.func(ctx, **checked)
    else:
        bridge = _ThreadContext(ctx, asyncio.get_running_loop())
        run.result = await asyncio.to_thread(spec.func, bridge, **checked)
    run.children = list(ctx.children.values())
    return run


class _ThreadContext:
    """A plain-function job's ``ctx`` in ``run_inline``: the pool child's synchronous
    calls, made on the event loop's ``Context``."""

    def __init__(self, ctx: Context, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop
        self.job_id, self.type, self.tenant = ctx.job_id, ctx.type, ctx.tenant
        self.queue, self.attempt, self.max_attempts = ctx.queue, ctx.attempt, ctx.max_attempts
        self.snoozes, self.checkpoint_state, self.log = ctx.snoozes, ctx.checkpoint_state, ctx.log

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def progress(self, fraction: float | None = None, message: str | None = None) -> None:
        self._loop.call_soon_threadsafe(self._ctx.progress, fraction, message)

    def checkpoint(self, state: Any) -> None:
        self._call(self._ctx.checkpoint(state))
        self.checkpoint_state = state

    def once(self, name: str) -> bool:
        return bool(self._call(self._ctx.once(name)))

    def submit(
        self, type: str, args: Mapping[str, Any] | None = None, *, name: str, **options: Any
    ) -> str:
        return str(self._call(self._ctx.submit(type, args, name=name, **options)))
