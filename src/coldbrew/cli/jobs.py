"""Run the daemon, create the schema, submit, look at and cancel a job."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING

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
    pass


def add_commands(sub: Subparsers[Parser]) -> None:
    """Run the daemon, create the schema, submit, look at and cancel a job."""
    worker = sub.add_parser("worker", help="run the daemon for the jobs registered on APP")
    worker.add_argument("app", metavar="MODULE:APP")
    worker.add_argument("--concurrency", type=int, help="overrides COLDBREW_CONCURRENCY")
    worker.add_argument("--processes", type=int, help="overrides COLDBREW_PROCESSES")
    worker.add_argument("--queues", help="comma-separated lanes (COLDBREW_QUEUES)")

    sub.add_parser("migrate", help="create or upgrade the schema (idempotent)")

    submit = sub.add_parser("submit", help="submit a job and print its status JSON")
    submit.add_argument("type")
    submit.add_argument("--args", default="{}", help="job arguments as a JSON object")
    submit.add_argument("--tenant", default="default")
    submit.add_argument("--queue")
    submit.add_argument("--priority", type=int, default=0)
    submit.add_argument("--idempotency-key")
    submit.add_argument("--max-attempts", type=int)
    submit.add_argument("--app", metavar="MODULE:APP", help="validate args and pick the lane")
    submit.add_argument("--wait", action="store_true", help="wait for a terminal status")
    submit.add_argument("--timeout", type=float, default=300.0, help="how long --wait waits")
    when = submit.add_mutually_exclusive_group()
    when.add_argument(
        "--at", metavar="ISO8601", help="run at this time, with its offset (2026-12-01T20:00:00Z)"
    )
    when.add_argument("--delay", metavar="DURATION", help="run after this long: 90s, 15m, 2h, 1d")

    status = sub.add_parser("status", help="print a job's status JSON")
    status.add_argument("job_id")

    cancel = sub.add_parser("cancel", help="cancel a queued, scheduled or running job")
    cancel.add_argument("job_id")
    cancel.add_argument("--reason", default="cancelled from the command line")


async def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.app import load_app
    from coldbrew.signals import on_stop_signals
    from coldbrew.worker import Worker

    worker = Worker(load_app(args.app), settings)
    # What start-up imported lives as long as the process: keep it out of the
    # collector's full passes, which otherwise walk it again and again while
    # thousands of jobs are in flight (and it stays shared after a fork).
    gc.freeze()
    with on_stop_signals(worker.stop):
        await worker.run()
    return EXIT_OK


async def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.migrate import migrate

    applied = await migrate(settings.database_url, settings.namespace)
    state = f"applied {applied}" if applied else "already up to date"
    print(f"coldbrew: schema {settings.namespace!r} {state}")
    return EXIT_OK


async def cmd_submit(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.app import load_app
    from coldbrew.client import Client

    try:
        job_args = json.loads(args.args)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past ~1000 levels
        raise ConfigurationError(f"--args is not JSON: {exc}") from None
    if not isinstance(job_args, dict):
        raise ConfigurationError("--args must be a JSON object")
    run_at, delay = _schedule_flags(args)
    app = load_app(args.app) if args.app else None
    async with Client.connect(settings, app=app) as client:
        record = await client.submit(
            args.type,
            job_args,
            tenant=args.tenant,
            queue=args.queue,
            priority=args.priority,
            idempotency_key=args.idempotency_key,
            max_attempts=args.max_attempts,
            run_at=run_at,
            delay=delay,
        )
        if args.wait:
            record = await client.wait(record.id, timeout=args.timeout)
        print_json(record.to_status_json())
        failed = args.wait and record.status.value != "succeeded"
        return EXIT_FAILED if failed else EXIT_OK


def _schedule_flags(args: argparse.Namespace) -> tuple[datetime | None, float | None]:
    """``--at`` / ``--delay`` read with the one parser (durations.py); bad text: exit 2."""
    from coldbrew.durations import DurationError, parse_duration, parse_instant

    try:
        run_at = parse_instant(args.at) if args.at is not None else None
        delay = parse_duration(args.delay) if args.delay is not None else None
    except DurationError as exc:
        flag = "--at" if args.at is not None else "--delay"
        raise ConfigurationError(f"{flag}: {exc}") from None
    return run_at, delay


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.client import Client

    async with Client.connect(settings, broker=False) as client:
        print_json(await client.status(args.job_id))
    return EXIT_OK


async def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.client import Client

    async with Client.connect(settings, broker=False) as client:
        record = await client.cancel(args.job_id, args.reason)
        print_json(record.to_status_json())
        if record.status.value not in ("cancelled", "running"):
            print(f"coldbrew: job {args.job_id} is already {record.status}", file=sys.stderr)
            return EXIT_FAILED
    return EXIT_OK


HANDLERS: dict[str, Handler] = {
    "worker": cmd_worker,
    "migrate": cmd_migrate,
    "submit": cmd_submit,
    "status": cmd_status,
    "cancel": cmd_cancel,
}
