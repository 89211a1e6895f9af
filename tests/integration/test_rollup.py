"""The per-minute rollup of finished jobs (migration 0024): `stats --since` read from it
equals the raw computation (counts exactly, percentiles within the buckets' error) for
windows that start inside a minute or on one, across the fold's frontier; the fold waits
for open transactions; the prune service removes old rollup rows."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import asyncpg
import pytest

from coldbrew.migrate import quote_ident
from coldbrew.settings import Settings
from coldbrew.sql import QUERIES
from coldbrew.store import FinishedStats, JobStore
from coldbrew.store.rollup import FLOOR_SECONDS, RELATIVE_ERROR, bucket_of
from coldbrew.store.stats import read_finished_in
from coldbrew.worker.prune import Pruner, Retention
from coldbrew.worker.rollup import RollupService
from tests.helpers import DATABASE_URL, wait_until

pytestmark = pytest.mark.asyncio

STATUSES = ("succeeded", "succeeded", "succeeded", "failed", "cancelled", "dead")

INSERT = """
INSERT INTO jobs (id, type, queue, tenant, args, status, max_attempts, attempt, created_at,
                  started_at, finished_at, run_at)
SELECT u.id, 'noop', u.queue, u.tenant, '{}'::jsonb, u.status::job_status, 3, 1,
       u.finished_at - make_interval(secs => coalesce(u.run, 0) + u.wait),
       CASE WHEN u.run IS NULL THEN NULL ELSE u.finished_at - make_interval(secs => u.run) END,
       u.finished_at, u.finished_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::float8[],
            $7::float8[]) AS u(id, queue, tenant, status, finished_at, run, wait)
"""


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(DATABASE_URL)
    await conn.execute(f"SET search_path = {quote_ident(settings.namespace)}")
    yield conn
    await conn.close()


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[JobStore]:
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        yield store


def duration(rng: random.Random) -> float:
    """Log-uniform from 10 µs to 2 h, a few exact round values among them."""
    if rng.random() < 0.05:
        return float(rng.choice([0.0, 1.0, 2.0, 60.0]))
    return float(10 ** rng.uniform(-5, math.log10(7200)))


async def insert_jobs(
    db: asyncpg.Connection, finished: list[datetime], seed: int, prefix: str
) -> None:
    """One job per finish time, of random lane, tenant, final status, run and wait times
    (a cancelled job, half the time, never started)."""
    rng = random.Random(seed)
    rows: list[tuple[str, str, str, str, datetime, float | None, float]] = []
    for n, at in enumerate(finished):
        status = rng.choice(STATUSES)
        run = None if status == "cancelled" and rng.random() < 0.5 else duration(rng)
        rows.append(
            (
                f"{prefix}-{n}",
                rng.choice(["default", "reports"]),
                rng.choice(["acme", "globex", "initech"]),
                status,
                at,
                run,
                duration(rng),
            )
        )
    await db.execute(INSERT, *(list(column) for column in zip(*rows, strict=True)))


async def fold_all(store: JobStore, settle: float = 0.0) -> int:
    """Fold every minute due now, step after step; the steps taken."""
    steps = 0
    while True:
        steps += 1
        done = await store.rollup.fold_step(settle, 0.0)
        if not done.more:
            return steps


async def both(
    db: asyncpg.Connection, since: float | str, tenant: str | None = None
) -> tuple[list[FinishedStats], list[FinishedStats]]:
    """The rollup's answer and the raw rows' for the same window in one snapshot (one
    now()); ``since`` is seconds, or an SQL expression of them evaluated at that now()."""
    async with db.transaction(isolation="repeatable_read"):
        seconds = since if isinstance(since, float) else await db.fetchval(f"SELECT {since}")
        rolled = await read_finished_in(db, seconds, tenant)
        raw = await db.fetch(QUERIES["finished_stats"].text, seconds, tenant)
    return rolled, [FinishedStats(**dict(r)) for r in raw]


def close(estimate: float | None, exact: float | None) -> bool:
    """Within the documented error: relative above 0.1 ms, half of 0.1 ms below."""
    if estimate is None or exact is None:
        return estimate is exact
    slack = RELATIVE_ERROR * abs(exact) * (1 + 1e-9) + 1e-9
    return abs(estimate - exact) <= max(slack, FLOOR_SECONDS / 2 + 1e-9)


def assert_same(rolled: list[FinishedStats], raw: list[FinishedStats]) -> None:
    assert [(r.queue, r.tenant) for r in rolled] == [(r.queue, r.tenant) for r in raw]
    for got, want in zip(rolled, raw, strict=True):
        assert (got.succeeded, got.failed, got.cancelled, got.dead) == (
            want.succeeded,
            want.failed,
            want.cancelled,
            want.dead,
        ), (got, want)
        for field in ("run_p50_seconds", "run_p95_seconds", "wait_p50_seconds"):
            assert close(getattr(got, field), getattr(want, field)), (field, got, want)


async def test_duration_bucket_in_sql_is_bucket_of_in_python(db: asyncpg.Connection) -> None:
    """The SQL function that assigns buckets and the Python arithmetic that reads them agree,
    on bucket edges too."""
    values = [-1.0, 0.0, 5e-5, 1e-4, 1.5e-4, 1.0, 2.0, 59.99, 60.0, 3600.0, 1e9]
    values += [1e-4 * 2 ** (k / 8) * f for k in range(0, 330, 7) for f in (0.999999, 1.000001)]
    got = await db.fetch("SELECT v, duration_bucket(v) AS b FROM unnest($1::float8[]) AS v", values)
    assert [(r["v"], r["b"]) for r in got] == [(v, bucket_of(v)) for v in values]


async def test_rollup_equals_raw_computation(db: asyncpg.Connection, store: JobStore) -> None:
    """Three hours of jobs, folded: windows starting inside a minute, on a minute, longer
    than the history, for one tenant and all, give the raw rows' counts exactly and their
    percentiles within the bucket error; so does a window read before any fold."""
    now = await db.fetchval("SELECT now()")
    rng = random.Random(7)
    finished = [now - timedelta(seconds=rng.uniform(1, 3 * 3600)) for _ in range(3000)]
    await insert_jobs(db, finished, seed=1, prefix="gen")
    before = await both(db, 3600.0)
    assert sum(r.total for r in before[1]) > 500
    assert_same(*before)

    assert await fold_all(store) >= 3  # an hour of minutes per step
    assert await db.fetchval("SELECT count(*) FROM finished_minutes") > 0
    for since in (
        3600.0,
        1800.5,
        90.0,
        5 * 3600.0,
        "extract(epoch FROM now() - date_trunc('minute', now() - interval '45 minutes'))",
    ):
        assert_same(*await both(db, since))
    assert_same(*await both(db, 7200.0, "globex"))


async def test_minute_boundaries_and_the_fold_frontier_count_each_job_once(
    db: asyncpg.Connection, store: JobStore
) -> None:
    """Jobs finished a microsecond either side of a minute boundary, and windows that start
    anywhere in a minute (its rows after the start added, or the minute's rollup row taken
    and its rows before the start subtracted), count exactly what the raw rows count; the
    current minute, folded in parts with jobs finishing between the folds, counts each
    job once."""
    now = await db.fetchval("SELECT now()")
    minute = now.replace(second=0, microsecond=0)
    tick = timedelta(microseconds=1)
    edges = [minute - timedelta(minutes=m) for m in (1, 2, 7)]
    finished = [at + d for at in edges for d in (-tick, timedelta(0), tick)]
    # a job every second of the minute 5 minutes ago, for windows starting inside it
    inside = minute - timedelta(minutes=5)
    finished += [inside + timedelta(seconds=n, microseconds=500) for n in range(60)]
    await insert_jobs(db, finished, seed=2, prefix="edge")
    await fold_all(store)
    folded = await store.rollup.folded_to()
    assert folded is not None and folded >= now
    for edge, counted in zip(edges, (2, 5, 68), strict=True):
        start = f"date_part('epoch', now() - '{edge.isoformat()}'::timestamptz)"
        for shift, more in (("", 0), (" + 0.000001", 1), (" - 0.000001", -1)):
            rolled, raw = await both(db, start + shift)
            assert sum(r.total for r in raw) == counted + more, (edge, shift)
            assert_same(rolled, raw)
    for offset in (0.0, 0.0004, 0.0006, 10.0, 29.9, 30.1, 50.0, 59.9995):
        start = f"date_part('epoch', now() - '{inside.isoformat()}'::timestamptz) - {offset}"
        rolled, raw = await both(db, start)
        assert sum(r.total for r in raw) == 6 + 60 - math.ceil(offset - 0.0005), offset
        assert_same(rolled, raw)
    # the current minute in parts: jobs finished after the fold, folded again, and after
    for part in range(3):
        at = await db.fetchval("SELECT now()")
        await insert_jobs(db, [at - tick * n for n in range(40)], seed=10 + part, prefix=f"p{part}")
        rolled, raw = await both(db, 600.0)
        assert sum(r.total for r in raw) == len(finished) + 40 * (part + 1)
        assert_same(rolled, raw)
        await fold_all(store)
        assert_same(*await both(db, 600.0))


async def test_an_open_transaction_holds_the_fold_back(
    settings: Settings, db: asyncpg.Connection, store: JobStore
) -> None:
    """A transaction open since before the fold's frontier may still write a finish time
    behind it: the fold stops at that transaction's start; once it commits, the fold goes
    on and counts its job."""
    other = await asyncpg.connect(DATABASE_URL)
    try:
        await other.execute(f"SET search_path = {quote_ident(settings.namespace)}")
        await fold_all(store)
        async with other.transaction():
            began = await other.fetchval("SELECT now()")
            await asyncio.sleep(1.0)
            done = await store.rollup.fold_step(0.0, 300.0)
            folded_to = await store.rollup.folded_to()
            assert folded_to is not None
            assert folded_to <= began, done
            await other.execute(
                "INSERT INTO jobs (id, type, queue, tenant, args, status, max_attempts, attempt,"
                " created_at, started_at, finished_at, run_at) VALUES ('late', 'noop', 'default',"
                " 'acme', '{}', 'succeeded', 3, 1, now(), now(), now(), now())"
            )
        await fold_all(store)
        assert (await store.rollup.folded_to() or began) > began
        assert await db.fetchval("SELECT sum(succeeded) FROM finished_minutes") == 1
        rolled, raw = await both(db, 600.0)
        assert sum(r.total for r in raw) == 1
        assert_same(rolled, raw)
    finally:
        await other.close()


async def test_the_prune_service_removes_old_rollup_rows(
    db: asyncpg.Connection, store: JobStore
) -> None:
    """Rollup rows of minutes past COLDBREW_RETENTION_ROLLUP go in a prune pass, counted as
    its dry run says; younger ones stay."""
    await db.execute(
        "INSERT INTO finished_minutes SELECT date_trunc('minute', now()) - make_interval("
        " mins => m), 'default', t, 1, 0, 0, 0, '{5}', '{1}', '{7}', '{1}'"
        " FROM generate_series(0, 60 * 24 * 3, 60) AS m, unnest(ARRAY['a', 'b']) AS t"
    )
    retention = Retention(jobs={}, rejected=None, rollup=2 * 86400.0)
    dry = await store.history.count_prunable({}, None, retention.idle_buckets, None, 2 * 86400.0)
    result = await Pruner(store, retention, batch=5).run_pass()
    assert result.complete
    assert dry["finished_minutes", "any"] == result.counts["finished_minutes", "any"] == 2 * 24
    kept_young = await db.fetchval(  # every minute left ended within the retention
        "SELECT min(minute) + interval '1 minute' > now() - interval '2 days' FROM finished_minutes"
    )
    assert kept_young
    assert await store.rollup.rollup_rows() == 2 * (3 * 24 + 1) - 2 * 24


async def test_the_rollup_service_folds_and_stops(db: asyncpg.Connection, store: JobStore) -> None:
    """The worker's service folds what finished up to a moment ago, and returns when told
    to stop."""
    now = await db.fetchval("SELECT now()")
    await insert_jobs(db, [now - timedelta(minutes=m) for m in range(0, 30)], 3, "svc")
    # not held back by other sessions' transactions on the shared server (tested above)
    service = RollupService(store, interval=0.1, settle=0.0, max_wait=0.0)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        await wait_until(lambda: _folded_past(store, now), timeout=20, interval=0.1)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
    assert (
        await db.fetchval("SELECT sum(succeeded + failed + cancelled + dead) FROM finished_minutes")
        == 30
    )


async def _folded_past(store: JobStore, at: datetime) -> bool:
    folded = await store.rollup.folded_to()
    return folded is not None and folded > at
