"""The ``coldbrew`` command: parses flags, builds settings, maps errors to exit codes.

Exit codes: 0 ok, 1 job or operation failed, 2 usage or configuration error,
3 RabbitMQ or PostgreSQL unreachable. Errors are one line on stderr; a
traceback only with ``--debug``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import math
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from coldbrew import logs
from coldbrew.errors import (
    ColdbrewError,
    ConfigurationError,
    JobNotFound,
    ServiceUnavailable,
)
from coldbrew.settings import Settings, load_settings

if TYPE_CHECKING:
    from coldbrew.store import QueueStats

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3

Handler = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line, as every other usage error does."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_USAGE, f"coldbrew: {message} (see `coldbrew --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="coldbrew", description="Long-running jobs over RabbitMQ and PostgreSQL.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--namespace", help="overrides COLDBREW_NAMESPACE")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_job_commands(sub)
    _add_inspection_commands(sub)
    _add_fleet_commands(sub)
    _add_service_commands(sub)
    return parser


Subparsers = argparse._SubParsersAction  # the type add_subparsers() returns


def _add_job_commands(sub: Subparsers[_Parser]) -> None:
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

    status = sub.add_parser("status", help="print a job's status JSON")
    status.add_argument("job_id")

    cancel = sub.add_parser("cancel", help="cancel a queued or running job")
    cancel.add_argument("job_id")
    cancel.add_argument("--reason", default="cancelled from the command line")


def _add_inspection_commands(sub: Subparsers[_Parser]) -> None:
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
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, parser_class=_Parser)
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


def _add_fleet_commands(sub: Subparsers[_Parser]) -> None:
    """The fleet-wide settings: tenants' weights, pauses and caps, job types' caps."""
    tenants = sub.add_parser("tenants", help="list tenants, set weights, pause and resume")
    tenants_sub = tenants.add_subparsers(
        dest="tenants_command", required=True, parser_class=_Parser
    )
    tenants_list = tenants_sub.add_parser("list", help="every tenant with its settings")
    tenants_list.add_argument("--json", action="store_true")
    tenants_set = tenants_sub.add_parser("set", help="create or change a tenant")
    tenants_set.add_argument("name")
    tenants_set.add_argument("--weight", type=float, help="share of a worker against others (1)")
    tenants_set.add_argument(
        "--max-running", metavar="N|none", help="fleet-wide cap on running jobs (none: no cap)"
    )
    for verb, text in (("pause", "hold this tenant's jobs"), ("resume", "run them again")):
        tenants_sub.add_parser(verb, help=text).add_argument("name")

    types = sub.add_parser("types", help="list job types' fleet-wide caps and set them")
    types_sub = types.add_subparsers(dest="types_command", required=True, parser_class=_Parser)
    types_sub.add_parser("list", help="every job type with a cap").add_argument(
        "--json", action="store_true"
    )
    types_set = types_sub.add_parser("set", help="cap a job type's running jobs fleet-wide")
    types_set.add_argument("name", metavar="TYPE")
    types_set.add_argument(
        "--max-running", metavar="N|none", required=True, help="the cap (none: no cap)"
    )


def _add_service_commands(sub: Subparsers[_Parser]) -> None:
    """The HTTP API, and the demo."""
    api = sub.add_parser("api", help="the HTTP API (COLDBREW_API_HOST:COLDBREW_API_PORT)")
    api.add_argument("--host", help="overrides COLDBREW_API_HOST")
    api.add_argument("--port", type=int, help="overrides COLDBREW_API_PORT")
    api.add_argument(
        "--app", metavar="MODULE:APP", help="reject unknown job types and bad args with 422"
    )

    demo = sub.add_parser("demo", help="a self-contained tour on the local broker and database")
    demo.add_argument("--keep", action="store_true", help="keep the demo's schema and queues")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        overrides = _overrides(args)
        settings = load_settings(**overrides)
        logs.configure(settings.log_format, "debug" if args.debug else settings.log_level)
        return _run(HANDLERS[args.command](args, settings))
    except KeyboardInterrupt:
        return 130
    except ColdbrewError as exc:
        if args.debug:
            raise
        print(f"coldbrew: {exc}", file=sys.stderr)
        return exit_code(exc)


def exit_code(exc: BaseException) -> int:
    if isinstance(exc, ConfigurationError):
        return EXIT_USAGE
    if isinstance(exc, ServiceUnavailable):
        return EXIT_UNAVAILABLE
    return EXIT_FAILED


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    found = {
        "namespace": args.namespace,
        "concurrency": getattr(args, "concurrency", None),
        "processes": getattr(args, "processes", None),
        "queues": getattr(args, "queues", None),
        "api_host": getattr(args, "host", None),
        "api_port": getattr(args, "port", None),
    }
    return {key: value for key, value in found.items() if value is not None}


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.run(coro)
    return uvloop.run(coro)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


# --- handlers -------------------------------------------------------------------


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
        )
        if args.wait:
            record = await client.wait(record.id, timeout=args.timeout)
        _print_json(record.to_status_json())
        failed = args.wait and record.status.value != "succeeded"
        return EXIT_FAILED if failed else EXIT_OK


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.client import Client

    async with Client.connect(settings, broker=False) as client:
        _print_json(await client.status(args.job_id))
    return EXIT_OK


async def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.client import Client

    async with Client.connect(settings, broker=False) as client:
        record = await client.cancel(args.job_id, args.reason)
        _print_json(record.to_status_json())
        if record.status.value not in ("cancelled", "running"):
            print(f"coldbrew: job {args.job_id} is already {record.status}", file=sys.stderr)
            return EXIT_FAILED
    return EXIT_OK


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
        _print_json(
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
        f"{'dead':>5} {'failed':>6} {'oldest':>9} {'drain/s':>8} {'est. wait':>9}"
    )
    print(header)
    for row, _depth, rate, wait in table:
        rate_text = "-" if rate is None else f"{rate:.1f}"
        wait_text = "-" if wait is None else ("never" if math.isinf(wait) else f"{wait:.1f}s")
        print(
            f"{row.queue:<12} {row.tenant:<20} {row.queued:>7} {row.running:>7} "
            f"{row.retrying:>8} {row.dead:>5} {row.failed:>6} {row.oldest_waiting_seconds:>8.1f}s "
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
        _print_json([row.to_json() for row in rows])
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
                _print_json(rows)
            for row in [] if args.json else rows:
                print(
                    f"#{row['id']:<6} {row['reason']:<16} {row['routing_key']:<24} "
                    f"{row['size']:>8} B  {row['detail'][:80]}"
                )
            return EXIT_OK
        jobs = await store.dead.dlq_list(args.reason_contains, args.limit)
    if args.json:
        _print_json([job.to_status_json() for job in jobs])
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


async def cmd_tenants(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.model import NAME_RE
    from coldbrew.store import JobStore
    from coldbrew.topology import Topology

    command = args.tenants_command
    name: str = getattr(args, "name", "")
    if command != "list" and not NAME_RE.match(name):
        raise ConfigurationError(f"tenant name {name!r} must match {NAME_RE.pattern}")
    weight = getattr(args, "weight", None)
    if weight is not None and not 0 < weight <= 1000:
        raise ConfigurationError(f"--weight must be in (0, 1000], not {weight:g}")
    cap_text = getattr(args, "max_running", None)
    cap = _parse_cap(cap_text) if cap_text is not None else None
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        if command == "list":
            rows = await store.tenants.list_tenants()
        else:
            paused = {"pause": True, "resume": False}.get(command)
            rows = [
                await store.tenants.set_tenant(
                    name,
                    weight=weight,
                    paused=paused,
                    max_running=cap,
                    uncap=cap_text is not None and cap is None,
                    channel=Topology(settings.namespace).tenant_channel,
                )
            ]
    if getattr(args, "json", False):
        _print_json([dataclasses.asdict(row) for row in rows])
        return EXIT_OK
    for row in rows:
        state = "paused" if row.paused else "active"
        limit = "no cap" if row.max_running is None else f"max running {row.max_running}"
        print(f"{row.name:<24} weight {row.weight:<6g} {limit:<18} {state}")
    if not rows:
        print("(no tenants yet: one is recorded when its first job arrives)")
    return EXIT_OK


def _parse_cap(text: str) -> int | None:
    """``--max-running``: a whole number 0..1,000,000, or ``none`` for no cap."""
    if text.strip().lower() in ("none", "unlimited"):
        return None
    try:
        cap = int(text)
    except ValueError:
        raise ConfigurationError(
            f"--max-running must be a whole number or 'none', not {text!r}"
        ) from None
    if not 0 <= cap <= 1_000_000:
        raise ConfigurationError(f"--max-running must be in 0..1000000, not {cap}")
    return cap


async def cmd_types(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.app import JOB_TYPE_RE
    from coldbrew.store import JobStore
    from coldbrew.topology import Topology

    if args.types_command == "set" and not JOB_TYPE_RE.match(args.name):
        raise ConfigurationError(f"job type {args.name!r} must match {JOB_TYPE_RE.pattern}")
    cap = _parse_cap(args.max_running) if args.types_command == "set" else None
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        if args.types_command == "list":
            rows = await store.tenants.list_job_types()
        else:
            rows = [
                await store.tenants.set_job_type(
                    args.name,
                    max_running=cap,
                    channel=Topology(settings.namespace).tenant_channel,
                )
            ]
    if getattr(args, "json", False):
        _print_json([dataclasses.asdict(row) for row in rows])
        return EXIT_OK
    for row in rows:
        limit = "no cap" if row.max_running is None else f"max running {row.max_running}"
        print(f"{row.name:<32} {limit}")
    if not rows:
        print("(no job type has a cap)")
    return EXIT_OK


async def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.api.server import serve
    from coldbrew.app import load_app

    await serve(settings, app=load_app(args.app) if args.app else None)
    return EXIT_OK


async def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.demo import run_demo

    if not args.debug:  # the tour prints its own story; keep the log to warnings
        logs.configure("console", "warning")
    return await run_demo(settings, keep=args.keep, namespace_given=args.namespace is not None)


HANDLERS: dict[str, Handler] = {
    "worker": cmd_worker,
    "migrate": cmd_migrate,
    "submit": cmd_submit,
    "status": cmd_status,
    "cancel": cmd_cancel,
    "stats": cmd_stats,
    "workers": cmd_workers,
    "dlq": cmd_dlq,
    "tenants": cmd_tenants,
    "types": cmd_types,
    "api": cmd_api,
    "demo": cmd_demo,
}

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNAVAILABLE", "EXIT_USAGE", "JobNotFound", "main"]
