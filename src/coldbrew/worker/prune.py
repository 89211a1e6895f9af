"""The prune service: finished history goes once past its retention, so the tables stay bounded.

Nothing deleted the rows of finished jobs before, and a fleet at 500 jobs/s
writes 43M of them a day. Each pass deletes, per final status, the rows older
than ``COLDBREW_RETENTION_<STATUS>`` (with their once-guards, unique keys and
aliases), then rejected messages older than the dead jobs' retention, then
rate-limit buckets idle for an hour (a full bucket is what a missing one is
taken to be), then the finished jobs' per-minute rollup (migration 0024) older
than ``COLDBREW_RETENTION_ROLLUP``. A job that is not finished, or has a publish mark (something is
due), is never deleted whatever its age: the SQL function ``job_prunable``
says which rows may go, in one place. Each pass also folds the dead/failed
tallies the gauges read (migration 0013).

Why batched deletes and not time partitions: ``jobs`` has one primary key on
``id`` for claims, completions and the unique keys' foreign keys, and a row
changes from unfinished to finished in place. Partitioned by finish time, the
key would have to include it, every completion would move its row between
partitions (a delete and an insert), and the foreign keys could no longer
point at the job. Small deletes by an index range cost the hot path nothing
it waits on (``SKIP LOCKED``; no lock a claim takes), and autovacuum reuses
the space they free, which keeps the table's size flat at steady state
(bench/history.py measures both).

One pruner per fleet at a time: every batch is a transaction under the
namespace's prune lock, and a worker that finds it held leaves the pass to the
holder. Between two full batches the service sleeps as long as the batch took,
so it uses at most half of one connection and never crowds the claims.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import structlog

from coldbrew.errors import DatabaseUnavailable, StatementFailed
from coldbrew.metrics import Metrics
from coldbrew.settings import Settings
from coldbrew.store import JobStore
from coldbrew.worker.service import Backoff, sleep_unless

log = structlog.get_logger("coldbrew.prune")

FINAL_STATUSES = ("succeeded", "failed", "dead", "cancelled")
IDLE_BUCKET_SECONDS = 3600.0
"""A rate bucket whose tokens have all been back this long is forgotten (it is full)."""

ANY = "any"
"""The status label of tables whose rows are not a job's."""


@dataclass(frozen=True, slots=True)
class Retention:
    """How long finished rows are kept: seconds per final status (absent: forever)."""

    jobs: Mapping[str, float]
    rejected: float | None
    idle_buckets: float = IDLE_BUCKET_SECONDS
    audit: float | None = None
    """The dashboard's audit log (None: kept forever)."""
    rollup: float | None = None
    """The finished jobs' per-minute rollup, ``coldbrew stats --since`` (None: forever)."""

    @classmethod
    def of(cls, settings: Settings) -> Retention:
        kept = {status: getattr(settings, f"retention_{status}") for status in FINAL_STATUSES}
        return cls(
            jobs={status: seconds for status, seconds in kept.items() if seconds is not None},
            rejected=settings.retention_dead,
            audit=settings.retention_audit,
            rollup=settings.retention_rollup,
        )


@dataclass(slots=True)
class PassResult:
    """What one pass deleted, ``{(table, status): rows}``, and whether it ran to its end
    (False: another pruner held the lock, or the stop came, part way)."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    complete: bool = True

    def add(self, table: str, status: str, rows: int) -> None:
        self.counts[table, status] = self.counts.get((table, status), 0) + rows

    @property
    def total(self) -> int:
        return sum(self.counts.values())


Pause = Callable[[float], Awaitable[bool]]
"""Called after a full batch with the seconds it took; False stops the pass."""


async def no_pause(_seconds: float) -> bool:
    return True


class Pruner:
    """One pass of batched deletes; shared by the service and ``coldbrew prune``."""

    def __init__(
        self,
        store: JobStore,
        retention: Retention,
        *,
        batch: int,
        on_pruned: Callable[[str, str, int], None] = lambda _t, _s, _n: None,
        pause: Pause = no_pause,
    ) -> None:
        self.store = store
        self.retention = retention
        self.batch = batch
        self.on_pruned = on_pruned
        self.pause = pause

    def _count(self, result: PassResult, table: str, status: str, rows: int) -> None:
        if rows:
            result.add(table, status, rows)
            self.on_pruned(table, status, rows)

    async def run_pass(self) -> PassResult:
        """Delete everything past its retention now, batch after batch."""
        history = self.store.history
        result = PassResult()
        await history.compact_tallies()
        for status, seconds in self.retention.jobs.items():
            while True:
                started = time.monotonic()
                batch = await history.prune_jobs(status, seconds, self.batch)
                if batch is None:
                    result.complete = False
                    return result
                for table, rows in batch.by_table().items():
                    self._count(result, table, status, rows)
                if batch.jobs < self.batch:
                    break
                if not await self.pause(time.monotonic() - started):
                    result.complete = False
                    return result
        others: list[tuple[str, Callable[[], Awaitable[int | None]]]] = [
            (
                "rate_buckets",
                lambda: history.prune_rate_buckets(self.retention.idle_buckets, self.batch),
            ),
            ("dashboard_sessions", lambda: history.prune_sessions(self.batch)),
        ]
        if (audit := self.retention.audit) is not None:
            others.append(("audit_log", lambda: history.prune_audit(audit, self.batch)))
        if (rollup := self.retention.rollup) is not None:
            others.append(("finished_minutes", lambda: history.prune_rollup(rollup, self.batch)))
        if (rejected := self.retention.rejected) is not None:
            others.insert(
                0, ("rejected_messages", lambda: history.prune_rejected(rejected, self.batch))
            )
        for table, step in others:
            if not await self._drain(result, table, step):
                return result
        return result

    async def _drain(
        self, result: PassResult, table: str, step: Callable[[], Awaitable[int | None]]
    ) -> bool:
        """Run ``step`` until a batch is short; False if the pass must end here."""
        while True:
            started = time.monotonic()
            rows = await step()
            if rows is None:
                result.complete = False
                return False
            self._count(result, table, ANY, rows)
            if rows < self.batch:
                return True
            if not await self.pause(time.monotonic() - started):
                result.complete = False
                return False


class PruneService:
    """Runs a pass every ``interval``; failures are logged, counted and retried."""

    name = "prune"

    def __init__(
        self,
        store: JobStore,
        metrics: Metrics,
        retention: Retention,
        *,
        interval: float,
        batch: int,
    ) -> None:
        self.metrics = metrics
        self.interval = interval
        self._stop: asyncio.Event | None = None
        self.pruner = Pruner(
            store, retention, batch=batch, on_pruned=self._counted, pause=self._pause
        )

    def _counted(self, table: str, status: str, rows: int) -> None:
        self.metrics.pruned_rows.labels(table=table, status=status).inc(rows)

    async def _pause(self, seconds: float) -> bool:
        """As long as the batch took: half of one connection at most, then on."""
        stop = self._stop
        if stop is None or stop.is_set():
            return False
        await sleep_unless(stop, seconds)
        return not stop.is_set()

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        backoff = Backoff(first=1.0, cap=max(self.interval, 5.0))
        while not stop.is_set():
            started = time.monotonic()
            try:
                result = await self.pruner.run_pass()
            except (DatabaseUnavailable, StatementFailed) as exc:
                self.metrics.prune_failures.inc()
                delay = backoff.next_delay()
                log.warning("prune_failed", error=str(exc), retry_in=delay)
                await sleep_unless(stop, delay)
                continue
            backoff.reset()
            if result.complete:
                self.metrics.prune_last_success.set(time.time())
            if result.total:
                log.info(
                    "pruned",
                    rows=result.total,
                    seconds=round(time.monotonic() - started, 3),
                    complete=result.complete,
                    **{f"{table}.{status}": n for (table, status), n in result.counts.items()},
                )
            await sleep_unless(stop, self.interval)
