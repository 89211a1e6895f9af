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
    add_app_dir,
    print_json,
)
from coldbrew.errors import ConfigurationError
from coldbrew.settings import Settings

if TYPE_CHECKING:
    from coldbrew.client import Client

MAX_WAIT_SECONDS = 7 * 86400.0


def add_commands(sub: Subparsers[Parser]) -> None:
    """Run the daemon, create the schema, submit, look at and cancel a job."""
    worker = sub.add_parser("worker", help="run the daemon for the jobs registered on APP")
    worker.add_argument("app", metavar="MODULE:APP")
    worker.add_argument("--concurrency", type=int, help="overrides COLDBREW_CONCURRENCY")
    worker.add_argument("--processes", type=int, help="overrides COLDBREW_PROCESSES")
    worker.add_argument("--queues", help="comma-separated lanes (COLDBREW_QUEUES)")
    add_app_dir(worker)

    sub.add_parser("migrate", help="create or upgrade the schema (idempotent)")

    submit = sub.add_parser("submit", help="submit a job and print its status JSON")
    submit.add_argument("type")
    submit.add_argument("--args", default="{}", help="job arguments as a JSON object")
    submit.add_argument("--tenant", default="default")
    submit.add_argument("--queue")
    submit.add_argument("--priority", type=int, default=0)
    submit.add_argument("--idempotency-key")
    submit.add_argument("--max-attempts", type=int)
    submit.add_argument(
        "--webhook-url", metavar="URL", help="where a signed webhook announces the outcome"
    )
    submit.add_argument("--app", metavar="MODULE:APP", help="validate args and pick the lane")
    add_app_dir(submit)
    submit.add_argument(
        "--unique-for",
        metavar="DURATION",
        help="while a job with the same key is younger than this (90s, 1h, infinity), "
        "return it instead of a new one",
    )
    submit.add_argument(
        "--unique-by", metavar="PARTS", help="what the key covers: args,tenant,queue"
    )
    submit.add_argument("--unique-states", metavar="STATES", help="e.g. queued,running")
    submit.add_argument("--unique-keys", metavar="KEYS", help="the args' keys the key covers")
    submit.add_argument(
        "--wait",
        action="store_true",
        help="follow the job to its end (live progress on stderr), then print its status JSON",
    )
    submit.add_argument("--timeout", type=float, default=300.0, help="how long --wait waits")
    submit.add_argument(
        "--json",
        action="store_true",
        help="with --wait: progress as plain lines on stderr even on a terminal; stdout "
        "has only the final status JSON",
    )
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

    worker = Worker(load_app(args.app, args.app_dir), settings)
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
    if not 0 < args.timeout <= MAX_WAIT_SECONDS:  # also refuses nan
        raise ConfigurationError(f"--timeout must be in (0, {MAX_WAIT_SECONDS:g}] seconds")
    run_at, delay = _schedule_flags(args)
    app = load_app(args.app, args.app_dir) if args.app else None
    # check_schema: before `coldbrew migrate`, one line that says so, not a traceback
    async with Client.connect(settings, app=app, check_schema=True) as client:
        record = await client.submit(
            args.type,
            job_args,
            tenant=args.tenant,
            queue=args.queue,
            priority=args.priority,
            idempotency_key=args.idempotency_key,
            max_attempts=args.max_attempts,
            unique_for=args.unique_for,
            unique_by=args.unique_by,
            unique_states=args.unique_states,
            unique_keys=args.unique_keys,
            run_at=run_at,
            delay=delay,
            webhook_url=args.webhook_url,
        )
        if record.duplicate:
            print(f"coldbrew: a duplicate of job {record.id} (unique)", file=sys.stderr)
        if app is None and args.queue is None and await client.registered_type(args.type) is None:
            print(
                f"coldbrew: type {args.type!r} is not registered by any worker yet; "
                f"submitted on lane {record.queue!r}",
                file=sys.stderr,
            )
        if not args.wait:
            print_json(record.to_status_json())
            return EXIT_OK
        return await _wait_for(client, record.id, args)


async def _wait_for(client: Client, job_id: str, args: argparse.Namespace) -> int:
    """``submit --wait``: progress on stderr (bars on a terminal, else lines), then the
    final status JSON on stdout; exit 0 only when the job succeeded."""
    from rich.console import Console

    from coldbrew.watch import follow, renderer_for

    renderer = renderer_for(Console(stderr=True), plain=args.json)
    try:
        [record] = await follow(client, [job_id], renderer, timeout=args.timeout)
    except TimeoutError as exc:
        print_json((await client.get(job_id)).to_status_json())
        print(
            f"coldbrew: {exc} (--timeout); it goes on: `coldbrew status {job_id}`",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print_json(record.to_status_json())
    return EXIT_OK if record.status.value == "succeeded" else EXIT_FAILED


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

    async with Client.connect(settings, broker=False, check_schema=True) as client:
        print_json(await client.status(args.job_id))
    return EXIT_OK


async def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.client import Client

    async with Client.connect(settings, broker=False, check_schema=True) as client:
        record = await client.cancel(args.job_id, args.reason)
    if record.status.value not in ("cancelled", "running"):  # finished before: an error only
        print(
            f"coldbrew: job {args.job_id} is already {record.status}; nothing to cancel",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print_json(record.to_status_json())
    return EXIT_OK


HANDLERS: dict[str, Handler] = {
    "worker": cmd_worker,
    "migrate": cmd_migrate,
    "submit": cmd_submit,
    "status": cmd_status,
    "cancel": cmd_cancel,
}
