"""What waits and what died: stats per queue and tenant, the workers, the dead letters."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from coldbrew.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    Handler,
    Parser,
    Subparsers,
    print_json,
)
from coldbrew.errors import ConfigurationError
from coldbrew.settings import Settings

if TYPE_CHECKING:
    from coldbrew.store import QueueStats


def add_commands(sub: Subparsers[Parser]) -> None:
    """What waits and what died: stats per queue and tenant, the dead letters."""
    stats = sub.add_parser(
        "stats", help="depth, oldest age, drain rate and estimated wait per queue and tenant"
    )
    stats.add_argument("--json", action="store_true")
    stats.add_argument(
        "--sample",
        type=float,
        default=1.0,
        help="seconds between the two readings the drain rate comes from (0: skip it)",
    )

    workers = sub.add_parser(
        "workers", help="the live workers: host, pid, version, lanes, jobs in flight, heartbeat"
    )
    workers.add_argument("--json", action="store_true")
    workers.add_argument(
        "--all", action="store_true", help="also rows of workers found gone, not yet removed"
    )

    dlq = sub.add_parser("dlq", help="list and replay dead jobs")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, parser_class=Parser)
    dlq_list = dlq_sub.add_parser("list", help="dead jobs with their reasons, newest first")
    dlq_list.add_argument("--reason-contains")
    dlq_list.add_argument("--limit", type=int, default=50)
    dlq_list.add_argument(
        "--rejected", action="store_true", help="list messages that broke the contract instead"
    )
    dlq_list.add_argument("--json", action="store_true")
    replay = dlq_sub.add_parser("replay", help="give dead jobs a fresh budget and run them again")
    replay.add_argument("--reason-contains")
    replay.add_argument("--job-id")
    replay.add_argument("--limit", type=int, default=100)
    replay.add_argument("--attempts", type=int, help="fresh attempts (COLDBREW_MAX_ATTEMPTS)")


async def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.stats import DrainRates, lane_consumers
    from coldbrew.store import JobStore

    if not 0 <= args.sample <= 600:
        raise ConfigurationError(f"--sample must be in 0..600 seconds, not {args.sample:g}")
    rates = DrainRates()
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        rows = await store.stats.queue_stats()
        consumers = lane_consumers(
            await store.reconcile.list_queue_looks(), settings.reconcile_seconds
        )
        if args.sample > 0:  # the drain rate is the change of the finished counters
            first = time.monotonic()
            for row in rows:
                rates.observe((row.queue, row.tenant), row.finished, first)
            await asyncio.sleep(args.sample)
            rows = await store.stats.queue_stats()
            now = time.monotonic()
            for row in rows:
                rates.observe((row.queue, row.tenant), row.finished, now)
    table = []
    for row in rows:
        key = (row.queue, row.tenant)
        depth = row.queued + row.retrying
        rate = rates.rates.get(key)
        wait = rates.estimated_wait(key, depth) if rate is not None else None
        table.append((row, depth, rate, wait))
    if args.json:
        print_json(
            [
                dataclasses.asdict(row)
                | {
                    "depth": depth,
                    "drain_rate_per_second": rate,
                    "estimated_wait_seconds": None if wait is None or math.isinf(wait) else wait,
                    "lane_consumers": consumers.get(row.queue),
                }
                for row, depth, rate, wait in table
            ]
        )
        return EXIT_OK
    _print_stats_table(table)
    if not rows:
        print("(no jobs)")
    for line in unserved_lanes(rows, consumers, settings.reconcile_seconds):
        print(line)
    return EXIT_OK


def _print_stats_table(table: list[tuple[Any, int, float | None, float | None]]) -> None:
    header = (
        f"{'queue':<12} {'tenant':<20} {'queued':>7} {'running':>7} {'retrying':>8} "
        f"{'scheduled':>9} {'dead':>5} {'failed':>6} {'oldest':>9} {'drain/s':>8} {'est. wait':>9}"
    )
    print(header)
    for row, _depth, rate, wait in table:
        rate_text = "-" if rate is None else f"{rate:.1f}"
        wait_text = "-" if wait is None else ("never" if math.isinf(wait) else f"{wait:.1f}s")
        print(
            f"{row.queue:<12} {row.tenant:<20} {row.queued:>7} {row.running:>7} "
            f"{row.retrying:>8} {row.scheduled:>9} {row.dead:>5} {row.failed:>6} "
            f"{row.oldest_waiting_seconds:>8.1f}s "
            f"{rate_text:>8} {wait_text:>9}"
        )


def unserved_lanes(
    rows: Sequence[QueueStats], consumers: Mapping[str, int], look_age: float
) -> list[str]:
    """A line for each lane with waiting jobs that no worker consumes, or that no worker
    has looked at lately (the reconcile looks count each lane's consumers)."""
    waiting: dict[str, int] = {}
    for row in rows:
        waiting[row.queue] = waiting.get(row.queue, 0) + row.queued + row.retrying
    lines = []
    for lane, count in sorted(waiting.items()):
        if count == 0:
            continue
        if lane not in consumers:
            lines.append(
                f"warning: lane {lane!r} has {count} waiting jobs and no worker looked at its "
                f"queues in the last {look_age:g} s: is any worker running?"
            )
        elif consumers[lane] == 0:
            lines.append(
                f"warning: lane {lane!r} has {count} waiting jobs and no consumer: no running "
                f"worker serves it (COLDBREW_QUEUES, or the app's job queues)"
            )
    return lines


async def cmd_workers(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import UTC

    from coldbrew.store import JobStore

    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        rows = [w for w in await store.liveness.list_workers() if args.all or w.alive]
    if args.json:
        print_json([row.to_json() for row in rows])
        return EXIT_OK
    print(
        f"{'id':<28} {'host':<20} {'pid':>7} {'version':<9} {'started':<20} "
        f"{'lanes':<16} {'in flight':>9} {'heartbeat':>10}"
    )
    for row in rows:
        state = "" if row.alive else "  (gone)"
        print(
            f"{row.id:<28} {row.host:<20} {row.pid:>7} {row.version:<9} "
            f"{row.started_at.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}  {','.join(row.lanes):<16} "
            f"{row.jobs_in_flight:>4}/{row.concurrency:<4} {row.heartbeat_age_seconds:>8.1f}s"
            f"{state}"
        )
    if not rows:
        print("(no live workers)")
    return EXIT_OK


async def cmd_dlq(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.store import JobStore

    if args.limit < 1:
        raise ConfigurationError("--limit must be at least 1")
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        if args.dlq_command == "replay":
            return await _dlq_replay(args, settings, store)
        if args.rejected:
            rejected = await store.dead.list_rejected(args.reason_contains, args.limit)
            rows = [dict(r) for r in rejected]
            if args.json:
                print_json(rows)
            for row in [] if args.json else rows:
                print(
                    f"#{row['id']:<6} {row['reason']:<16} {row['routing_key']:<24} "
                    f"{row['size']:>8} B  {row['detail'][:80]}"
                )
            return EXIT_OK
        jobs = await store.dead.dlq_list(args.reason_contains, args.limit)
    if args.json:
        print_json([job.to_status_json() for job in jobs])
        return EXIT_OK
    for job in jobs:
        print(
            f"{job.id}  {job.type:<16} {job.tenant:<12} attempts {job.attempt}/"
            f"{job.max_attempts}  {job.dead_reason or '-'}: {job.error_kind}: "
            f"{(job.error_message or '')[:80]}"
        )
    if not jobs:
        print("(no dead jobs)")
    return EXIT_OK


async def _dlq_replay(args: argparse.Namespace, settings: Settings, store: Any) -> int:
    budget = args.attempts or settings.max_attempts
    if not 1 <= budget <= 1000:
        raise ConfigurationError("--attempts must be 1..1000")
    if args.job_id is None and args.reason_contains is None:
        raise ConfigurationError("say which dead jobs to replay: --job-id or --reason-contains")
    replayed = await store.dead.dlq_replay(args.reason_contains, args.job_id, args.limit, budget)
    print(
        f"coldbrew: replayed {len(replayed)} dead job(s) with {budget} fresh attempt(s); "
        "a running worker publishes them within a second"
    )
    for job_id in replayed:
        print(job_id)
    if args.job_id and not replayed:
        print(f"coldbrew: job {args.job_id} is not dead", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


HANDLERS: dict[str, Handler] = {
    "stats": cmd_stats,
    "workers": cmd_workers,
    "dlq": cmd_dlq,
}
