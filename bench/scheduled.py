"""Scheduled jobs (issue #15): how precisely they start, and what waiting ones cost the relay.

Two measurements, printed as a table (or JSON):

1. **Precision.** ``--jobs`` no-op jobs (10,000) are scheduled for the same
   second, ``--lead`` seconds ahead, through ``Client.submit(run_at=)``'s own
   statement (``insert_job``, sent by a pool of connections); one worker
   subprocess runs them. From the rows: ``started_at - run_at`` per job (the
   claim's time minus the scheduled time; p50/p90/p99/max), and how long the
   last one took to finish.
2. **Relay cost of waiting jobs.** The relay's tick (``take_due_publishes`` with
   its ``clear_stale_publish_marks``, then ``next_publish_due``) timed
   ``--ticks`` times with no rows, then with ``--future`` rows (100,000)
   scheduled over the next day; and the EXPLAIN (ANALYZE, BUFFERS) of the
   tick's row selection with them, to show it reads the ``jobs_publish_due``
   index and touches ~0 rows.

Every schema, queue and exchange the run makes is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg
from bench._common import drop_namespace, progress, worker_process
from bench.throughput import Config

from coldbrew.migrate import migrate, quote_ident
from coldbrew.sql import QUERIES
from coldbrew.store import ClaimRequest, JobStore

RELAY_SELECT = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT)
SELECT id, status AS was FROM jobs
WHERE publish_after <= now() AND status IN ('queued', 'retrying', 'scheduled')
ORDER BY publish_after
LIMIT 500
FOR UPDATE SKIP LOCKED
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs due in the same second")
    parser.add_argument("--lead", type=float, default=20.0, help="seconds ahead they are due")
    parser.add_argument("--concurrency", type=int, default=200, help="COLDBREW_CONCURRENCY")
    parser.add_argument("--relay-batch", type=int, default=500, help="COLDBREW_RELAY_BATCH")
    parser.add_argument("--future", type=int, default=100_000, help="rows due over the next day")
    parser.add_argument("--ticks", type=int, default=300, help="relay ticks timed per case")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--database-url", default="postgresql://127.0.0.1:5432/coldbrew_bench")
    return parser.parse_args()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def schedule(store: JobStore, count: int, run_at: datetime) -> float:
    """Schedule ``count`` no-op jobs for ``run_at`` with insert_job (as Client.submit does);
    return the seconds it took."""
    started = time.perf_counter()
    pending: set[asyncio.Task[Any]] = set()
    for index in range(count):
        request = ClaimRequest(
            f"s{index}", "noop", "default", "default", {}, 0, 3, None, None, run_at=run_at
        )
        pending.add(asyncio.create_task(store.jobs.insert_job(request, relay_grace=10.0)))
        if len(pending) >= 32:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
    for task in pending:
        await task
    return time.perf_counter() - started


async def precision(args: argparse.Namespace, cfg: Config, namespace: str) -> dict[str, Any]:
    env = {"COLDBREW_LOG_LEVEL": "warning", "COLDBREW_RELAY_BATCH": str(args.relay_batch)}
    async with (
        worker_process(cfg, namespace, "scheduled", extra_env=env),
        JobStore.open(args.database_url, namespace, pool_size=8) as store,
    ):
        run_at = (datetime.now(UTC) + timedelta(seconds=args.lead)).replace(microsecond=0)
        took = await schedule(store, args.jobs, run_at)
        progress(f"scheduled {args.jobs} jobs for {run_at.isoformat()} in {took:.1f} s")
        if datetime.now(UTC) >= run_at:
            raise SystemExit(f"scheduling took longer than --lead {args.lead:g} s; raise it")
        conn = await asyncpg.connect(args.database_url)
        try:
            table = f"{quote_ident(namespace)}.jobs"
            while True:
                left = await conn.fetchval(
                    f"SELECT count(*) FROM {table} WHERE status <> 'succeeded'"
                )
                if left == 0:
                    break
                await asyncio.sleep(0.2)
            rows = await conn.fetch(
                f"SELECT extract(epoch FROM started_at - run_at)::float8 AS late,"
                f" extract(epoch FROM finished_at - run_at)::float8 AS done,"
                f" extract(epoch FROM finished_at)::float8 AS finished_epoch,"
                f" extract(epoch FROM started_at)::float8 AS started_epoch"
                f" FROM {table}"
            )
        finally:
            await conn.close()
    late = [row["late"] for row in rows]
    return {
        "jobs": len(rows),
        "schedule_seconds": round(took, 2),
        "early": sum(1 for value in late if value < 0),
        "late_p50": round(percentile(late, 0.50), 3),
        "late_p90": round(percentile(late, 0.90), 3),
        "late_p99": round(percentile(late, 0.99), 3),
        "late_max": round(max(late), 3),
        "last_finished_after": round(max(row["done"] for row in rows), 3),
        # the drain rate meanwhile: how fast this machine ran them, once they were due
        "jobs_per_second": round(
            len(rows)
            / max(
                1e-9,
                max(r["finished_epoch"] for r in rows) - min(r["started_epoch"] for r in rows),
            ),
            1,
        ),
    }


async def relay_ticks(store: JobStore, ticks: int) -> dict[str, float]:
    """Time ``ticks`` relay ticks that find nothing due (ms per tick)."""
    times = []
    for _ in range(ticks):
        started = time.perf_counter()
        due = await store.outbox.take_due_publishes(500, 30.0)
        await store.outbox.next_due_in(1.0)
        times.append((time.perf_counter() - started) * 1000)
        if due:
            raise SystemExit("a relay tick found rows due: nothing should be")
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p99_ms": round(percentile(times, 0.99), 3),
        "mean_ms": round(statistics.fmean(times), 3),
    }


async def relay_cost(args: argparse.Namespace, namespace: str) -> dict[str, Any]:
    async with JobStore.open(args.database_url, namespace, pool_size=2) as store:
        empty = await relay_ticks(store, args.ticks)
        conn = await asyncpg.connect(args.database_url)
        try:
            await conn.execute(f"SET search_path = {quote_ident(namespace)}")
            started = time.perf_counter()
            # the rows Client.submit(delay=...) writes, spread over the next day
            await conn.execute(
                "INSERT INTO jobs (id, type, queue, tenant, max_attempts, status, run_at,"
                " publish_after)"
                " SELECT 'f' || g, 'noop', 'default', 'default', 3, 'scheduled', t, t"
                " FROM generate_series(1, $1) AS g,"
                " LATERAL (SELECT now() + make_interval(secs => 60 + random() * 86400) AS t) AS r",
                args.future,
            )
            await conn.execute("ANALYZE jobs")
            progress(f"{args.future} future rows in {time.perf_counter() - started:.1f} s")
            loaded = await relay_ticks(store, args.ticks)
            async with conn.transaction():
                plan = [row[0] for row in await conn.fetch(RELAY_SELECT)]
                wake_plan = [
                    row[0]
                    for row in await conn.fetch(
                        "EXPLAIN (ANALYZE, BUFFERS) " + QUERIES["next_publish_due"].text, 1.0
                    )
                ]
        finally:
            await conn.close()
    return {"empty": empty, "with_future_rows": loaded, "plan": plan, "wake_plan": wake_plan}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    namespace = f"bench_sched_{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="coldbrew-bench-scheduled-"))
    cfg = Config(
        jobs=args.jobs,
        repeat=1,
        concurrency=args.concurrency,
        prefetch=min(args.concurrency, 1000),
        idle_seconds=0.0,
        amqp_url=args.amqp_url,
        database_url=args.database_url,
        workdir=workdir,
    )
    try:
        await migrate(args.database_url, namespace)
        result = {"precision": await precision(args, cfg, namespace)}
        await drop_namespace(args.amqp_url, args.database_url, namespace)
        await migrate(args.database_url, namespace)
        result["relay"] = await relay_cost(args, namespace)
        return result
    finally:
        await drop_namespace(args.amqp_url, args.database_url, namespace)


def report(result: dict[str, Any]) -> None:
    p = result["precision"]
    print(f"precision: {p['jobs']} jobs due in the same second, one worker, no-op job")
    print(f"  scheduled in {p['schedule_seconds']} s; started early: {p['early']}")
    print(
        f"  started_at - run_at: p50 {p['late_p50']} s, p90 {p['late_p90']} s, "
        f"p99 {p['late_p99']} s, max {p['late_max']} s"
    )
    print(f"  last one finished {p['last_finished_after']} s after run_at")
    print(f"  drain rate once due: {p['jobs_per_second']} jobs/s")
    r = result["relay"]
    for case in ("empty", "with_future_rows"):
        t = r[case]
        print(
            f"relay tick ({case}): p50 {t['p50_ms']} ms, p99 {t['p99_ms']} ms, "
            f"mean {t['mean_ms']} ms"
        )
    print("plan of the tick's row selection with the future rows:")
    for line in r["plan"]:
        print("  " + line)
    print("plan of the relay's wake-up probe (next_publish_due):")
    for line in r["wake_plan"]:
        print("  " + line)


def main() -> int:
    args = parse_args()
    result = asyncio.run(run(args))
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
