"""``Context``: what a running job may know and do about itself.

It carries the job's identity and offers progress, checkpoints and the
at-most-once guard. Every write it makes is fenced by the attempt number, so a
presumed-dead worker cannot overwrite a newer attempt (guarantee 2). The same
object serves process-pool jobs: the pool relays the child's calls to it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import structlog

from coldbrew import storable
from coldbrew.errors import UnstorableCheckpoint, UnstorableValue
from coldbrew.store import RawJSON

if TYPE_CHECKING:
    import asyncpg

    from coldbrew.batchjobs import BatchHandle
    from coldbrew.breaker import Breakers, CircuitBreaker
    from coldbrew.model import JobFields
    from coldbrew.settings import Settings
    from coldbrew.store import JobRows, JobStore

_log = structlog.get_logger("coldbrew.job")

Spawn = Callable[[str, str, "Mapping[str, Any]", "Mapping[str, Any]"], Awaitable["JobFields"]]
"""Builds a checked child job: ``(parent id, type, args, options) -> JobFields`` (the
runner's, through ``Client.child_request``)."""

MAX_CHILDREN = 1000
"""Most child jobs one attempt may spawn (they are written with its outcome)."""

MAX_PROGRESS_MESSAGE = 500
"""Longest progress message, in characters; a longer one is cut."""


class Context:
    """Handed to every job as its first argument."""

    __slots__ = (
        "_batch",
        "_breakers",
        "_log",
        "_on_progress",
        "_settings",
        "_spawn",
        "_store",
        "attempt",
        "checkpoint_state",
        "children",
        "job_id",
        "max_attempts",
        "queue",
        "snoozes",
        "tenant",
        "type",
    )

    def __init__(
        self,
        *,
        job_id: str,
        type: str,
        queue: str,
        tenant: str,
        attempt: int,
        max_attempts: int,
        checkpoint_state: Any,
        store: JobStore | None,
        on_progress: Callable[[float | None, str | None], None],
        breakers: Breakers | None = None,
        snoozes: int = 0,
        settings: Settings | None = None,
        spawn: Spawn | None = None,
    ) -> None:
        self.job_id = job_id
        self.type = type
        self.queue = queue
        self.tenant = tenant
        self.attempt = attempt
        self.max_attempts = max_attempts
        # times the job snoozed so far; ``attempt`` counts those claims too (it fences writes)
        self.snoozes = snoozes
        self.checkpoint_state = checkpoint_state
        self._store = store
        self._on_progress = on_progress
        self._breakers = breakers
        self._log: Any = None
        self._settings = settings
        self._batch: BatchHandle | None = None
        self._spawn = spawn
        self.children: dict[str, JobFields] = {}
        """The child jobs this attempt spawned so far, by id (``submit``)."""

    @property
    def log(self) -> Any:
        """A structlog logger with job_id, type, tenant and attempt bound (built on first use)."""
        if self._log is None:
            self._log = _log.bind(
                job_id=self.job_id, type=self.type, tenant=self.tenant, attempt=self.attempt
            )
        return self._log

    def progress(self, fraction: float | None = None, message: str | None = None) -> None:
        """Report progress (0..1) and/or a message; written within one progress flush."""
        if fraction is not None:
            if not isinstance(fraction, int | float) or math.isnan(fraction):
                raise ValueError(f"progress must be a number in 0..1, not {fraction!r}")
            fraction = min(max(float(fraction), 0.0), 1.0)
        if message is not None:  # NUL or a lone surrogate would fail the progress write
            message = storable.clean_text(str(message)[:MAX_PROGRESS_MESSAGE])
        self._on_progress(fraction, message)

    async def checkpoint(self, state: Any) -> None:
        """Save JSON state that the next attempt of this job starts from (fenced).

        Raises ``UnstorableCheckpoint`` (a ``Permanent``) for state PostgreSQL
        cannot store -- a NUL, NaN, more than 1 MiB -- and ``TypeError`` for
        state that is not JSON, before anything is written.
        """
        try:
            encoded = RawJSON(storable.dump_json(state, "checkpoint"))
        except UnstorableValue as exc:
            raise UnstorableCheckpoint(exc.field, exc.problem) from None
        await self._jobs().save_checkpoint(self.job_id, self.attempt, encoded)
        self.checkpoint_state = state

    async def once(self, name: str) -> bool:
        """True exactly once per job and ``name``, across attempts and duplicate deliveries.

        The guard is committed before the caller's side effect runs: if the
        worker dies between the two, the effect is skipped on retry (at most
        once, never twice).
        """
        storable.check_text(name, "once name")  # UnstorableValue (a ValueError) for a NUL
        return await self._jobs().claim_once(self.job_id, name, self.attempt)

    def once_in_transaction(
        self, name: str
    ) -> AbstractAsyncContextManager[asyncpg.Connection | None]:
        """Exactly once for effects written to the same PostgreSQL (the outbox pattern).

        ``async with ctx.once_in_transaction("charge") as conn:`` yields a
        connection inside a transaction that also holds the guard, or None when
        the guard was taken before. Whatever the block writes through ``conn``
        commits together with the guard, or not at all.
        """
        storable.check_text(name, "once name")
        return self._jobs().once_transaction(self.job_id, name, self.attempt)

    def _jobs(self) -> JobRows:
        if self._store is None:
            raise RuntimeError(
                "this Context has no job store (coldbrew.testing.run_inline without store=): "
                "checkpoints and once-guards need one; use Harness.run_inline"
            )
        return self._store.jobs

    async def submit(
        self,
        type: str,
        args: Mapping[str, Any] | None = None,
        *,
        name: str,
        **options: Any,
    ) -> str:
        """Spawn a child job; return its id. Nothing is written yet.

        The child is checked now (type, args, options: ``queue``, ``priority``,
        ``tenant`` (this job's by default), ``max_attempts``, ``timeout``) and
        inserted with this attempt's outcome, in its transaction, only if the
        attempt succeeds; the relay publishes it after the commit. Its id is
        derived from this job's id and ``name``, so an attempt that retries and
        spawns again gets the same ids and each child exists once. Submitting the
        same ``name`` twice in one attempt replaces the first.
        """
        if self._spawn is None:
            raise RuntimeError("ctx.submit needs a worker's Context (testing.run_inline has one)")
        storable.check_text(name, "child name")
        options = {"tenant": self.tenant, **options, "name": name}
        child = await self._spawn(self.job_id, type, dict(args or {}), options)
        if child.id not in self.children and len(self.children) >= MAX_CHILDREN:
            raise ValueError(f"a job spawns at most {MAX_CHILDREN} children per attempt")
        self.children[child.id] = child
        return child.id

    @property
    def batch(self) -> BatchHandle:
        """This job's batch: ``await ctx.batch.add(type, args, name=...)`` adds a member
        (see ``BatchHandle.add``); built on first use, so other jobs pay nothing."""
        if self._batch is None:
            from coldbrew.batchjobs import BatchHandle
            from coldbrew.settings import load_settings

            if self._store is None:
                raise RuntimeError(
                    "this Context has no job store (coldbrew.testing.run_inline without "
                    "store=): ctx.batch needs one; use Harness.run_inline"
                )
            self._batch = BatchHandle(
                self._store,
                self._settings or load_settings(),
                job_id=self.job_id,
                attempt=self.attempt,
                tenant=self.tenant,
            )
        return self._batch

    async def add_to_batch(self, member: dict[str, Any]) -> str:
        """A process-pool job's ``ctx.batch.add``, relayed here (``procpool/handle.py``)."""
        return await self.batch.add(
            member["type"],
            member.get("args"),
            name=member["name"],
            queue=member.get("queue"),
            priority=member.get("priority", 0),
            max_attempts=member.get("max_attempts"),
            timeout=member.get("timeout"),
        )

    def breaker(self, name: str) -> CircuitBreaker:
        """The worker's breaker for a named dependency: ``async with ctx.breaker("s3"):``."""
        if self._breakers is None:
            from coldbrew.breaker import Breakers

            self._breakers = Breakers()
        return self._breakers.get(name)
