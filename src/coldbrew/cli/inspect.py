"""What waits and what died: stats per queue and tenant, the workers, the dead letters."""

from __future__ import annotations

import argparse
import asyncio
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
    parse_duration,
    print_empty,
    print_json,
)
from coldbrew.errors import ConfigurationError
from coldbrew.settings import Settings

if TYPE_CHECKING:
    from coldbrew.stats import DrainRates
    from coldbrew.store import QueueStats


def add_commands(sub: Subparsers[Parser]) -> None:
    """What waits and what died: stats per queue and tenant, the dead letters."""
    stats = sub.add_parser(
        "stats",
        help="per queue and tenant: what waits and runs (depth, oldest, drain rate, est. wait) "
        "and what finished in a window (succeeded, failed, cancelled, dead, run times)",
    )
    stats.add_argument("--json", action="store_true")
    stats.add_argument(
        "--since",
        default="1h",
        metavar="DURATION",
        help="the window of finished jobs counted: 90s, 15m, 1h, 7d, ... (default 1h)",
    )
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
    from coldbrew.cli.tables import merge_rows, row_json, stats_lines
    from coldbrew.stats import lane_consumers
    from coldbrew.store import JobStore

    if not 0 <= args.sample <= 600:
        raise ConfigurationError(f"--sample must be in 0..600 seconds, not {args.sample:g}")
    since = parse_duration(args.since, "--since")
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        waiting, rates = await _sample_waiting(store, args.sample)
        finished = await store.stats.finished_stats(since)
        consumers = lane_consumers(
            await store.reconcile.list_queue_looks(), settings.reconcile_seconds
        )
    waits = {
        key: rates.estimated_wait(key, row.queued + row.retrying)
        for row in waiting
        if (key := (row.queue, row.tenant)) in rates.rates
    }
    rows = merge_rows(waiting, finished, rates.rates, waits)
    if args.json:
        print_json([row_json(row, since, consumers) for row in rows])
        return EXIT_OK
    if not rows:
        print_empty(f"no jobs waiting or running, and none finished in the last {args.since}")
        return EXIT_OK
    for line in stats_lines(rows, args.since):
        print(line)
    dead_in_all = sum(row.dead for row in waiting)
    if dead_in_all:
        print(f"{dead_in_all} dead job(s) in the dead letters in all: `coldbrew dlq list`")
    for line in unserved_lanes(waiting, consumers, settings.reconcile_seconds):
        print(line)
    return EXIT_OK


async def _sample_waiting(store: Any, sample: float) -> tuple[list[QueueStats], DrainRates]:
    """The waiting gauges, read twice ``sample`` seconds apart for the drain rate (the change
    of the finished counters); once when ``sample`` is 0."""
    from coldbrew.stats import DrainRates

    rates = DrainRates()
    rows: list[QueueStats] = await store.stats.queue_stats()
    if sample > 0:
        first = time.monotonic()
        for row in rows:
            rates.observe((row.queue, row.tenant), row.finished, first)
        await asyncio.sleep(sample)
        rows = await store.stats.queue_stats()
        now = time.monotonic()
        for row in rows:
            rates.observe((row.queue, row.tenant), row.finished, now)
    return rows, rates


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
    if not rows:
        print_empty(
            "no live workers: start one with `coldbrew worker MODULE:APP`"
            + ("" if args.all else "; --all also lists workers found gone")
        )
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
    return EXIT_OK


async def cmd_dlq(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.store import JobStore

    if not 1 <= args.limit <= 10_000:
        raise ConfigurationError(f"--limit must be in 1..10000, not {args.limit}")
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        if args.dlq_command == "replay":
            return await _dlq_replay(args, settings, store)
        if args.rejected:
            rejected = await store.dead.list_rejected(args.reason_contains, args.limit)
            rows = [dict(r) for r in rejected]
            if args.json:
                print_json(rows)
                return EXIT_OK
            for row in rows:
                print(
                    f"#{row['id']:<6} {row['reason']:<16} {row['routing_key']:<24} "
                    f"{row['size']:>8} B  {row['detail'][:80]}"
                )
            if not rows:
                print_empty(_none_found("rejected messages", args.reason_contains))
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
        print_empty(_none_found("dead jobs", args.reason_contains))
    return EXIT_OK


def _none_found(what: str, contains: str | None) -> str:
    return f"no {what}" + ("" if contains is None else f" whose reason contains {contains!r}")


async def _dlq_replay(args: argparse.Namespace, settings: Settings, store: Any) -> int:
    from coldbrew.operations import check_budget, check_reason_text

    budget = check_budget(args.attempts or settings.max_attempts)
    if args.job_id is None or args.reason_contains is not None:
        check_reason_text(args.reason_contains)  # the dashboard's replay form says the same
    replayed = await store.dead.dlq_replay(args.reason_contains, args.job_id, args.limit, budget)
    if args.job_id and not replayed:
        print(f"coldbrew: job {args.job_id} is not dead; nothing to replay", file=sys.stderr)
        return EXIT_FAILED
    if not replayed:
        print_empty(_none_found("dead jobs", args.reason_contains) + "; nothing replayed")
        return EXIT_OK
    print(
        f"coldbrew: replayed {len(replayed)} dead job(s) with {budget} fresh attempt(s); "
        "a running worker publishes them within a second"
    )
    for job_id in replayed:
        print(job_id)
    return EXIT_OK


HANDLERS: dict[str, Handler] = {
    "stats": cmd_stats,
    "workers": cmd_workers,
    "dlq": cmd_dlq,
}
