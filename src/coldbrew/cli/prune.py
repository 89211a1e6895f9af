"""``coldbrew prune [--dry-run] [--json]``: delete finished history past its retention now.

The same pass the workers' prune service runs (worker/prune.py), with the
retention of ``COLDBREW_RETENTION_*``; ``--dry-run`` counts instead, by table
and job status, with the same rule (``job_prunable``), so its counts are what
a prune run at that moment deletes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from coldbrew.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    Handler,
    Parser,
    Subparsers,
    format_duration,
    print_json,
)
from coldbrew.settings import Settings

BUSY_WAIT_SECONDS = 30.0
"""How long a prune waits for a worker's pass that holds the prune lock."""


def add_commands(sub: Subparsers[Parser]) -> None:
    """``coldbrew prune``."""
    prune = sub.add_parser(
        "prune", help="delete finished jobs past their retention (COLDBREW_RETENTION_*) now"
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="count what would go, by table and status"
    )
    prune.add_argument("--json", action="store_true")


async def cmd_prune(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.store import JobStore
    from coldbrew.worker.prune import Retention

    retention = Retention.of(settings)
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        if args.dry_run:
            counts = await store.history.count_prunable(
                retention.jobs,
                retention.rejected,
                retention.idle_buckets,
                retention.audit,
                retention.rollup,
            )
        else:
            pruned = await _prune(store, retention, settings.prune_batch)
            if pruned is None:
                print(
                    f"coldbrew prune: another pruner held the prune lock for "
                    f"{BUSY_WAIT_SECONDS:g} s; try again (a worker's prune service is running)",
                    file=sys.stderr,
                )
                return EXIT_FAILED
            counts = pruned
    return _report(counts, retention, dry_run=args.dry_run, json_out=args.json)


async def _prune(store: Any, retention: Any, batch: int) -> dict[tuple[str, str], int] | None:
    """Passes until one runs to its end (a worker's pass may hold the lock meanwhile)."""
    from coldbrew.worker.prune import Pruner

    counts: dict[tuple[str, str], int] = {}
    pruner = Pruner(store, retention, batch=batch)
    deadline = time.monotonic() + BUSY_WAIT_SECONDS
    while True:
        result = await pruner.run_pass()
        for key, rows in result.counts.items():
            counts[key] = counts.get(key, 0) + rows
        if result.complete:
            return counts
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.2)


def _report(
    counts: dict[tuple[str, str], int], retention: Any, *, dry_run: bool, json_out: bool
) -> int:
    rows: list[dict[str, Any]] = [
        {"table": table, "status": status, "rows": n}
        for (table, status), n in sorted(counts.items())
        if n
    ]
    total = sum(row["rows"] for row in rows if row["table"] == "jobs")
    if json_out:
        print_json(
            {
                "dry_run": dry_run,
                "retention_seconds": dict(retention.jobs),
                "rows": rows,
                "jobs": total,
            }
        )
        return EXIT_OK
    verb = "would delete" if dry_run else "deleted"
    kept = ", ".join(
        f"{status} {format_duration(seconds)}" for status, seconds in retention.jobs.items()
    )
    print(f"retention: {kept or 'off for every status'}")
    if not rows:
        print(f"nothing past its retention: {verb} 0 rows")
        return EXIT_OK
    for row in rows:
        print(f"{verb} {row['rows']:>10}  {row['table']:<18} {row['status']}")
    return EXIT_OK


HANDLERS: dict[str, Handler] = {"prune": cmd_prune}
