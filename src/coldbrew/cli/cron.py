"""``coldbrew cron``: list the schedules, pause and resume one, run one now, remove one."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from coldbrew.cli.common import EXIT_FAILED, EXIT_OK, Handler, Parser, Subparsers, print_json
from coldbrew.errors import ConfigurationError
from coldbrew.settings import Settings

if TYPE_CHECKING:
    from coldbrew.store import CronListed, JobStore


def add_commands(sub: Subparsers[Parser]) -> None:
    """``coldbrew cron list|pause|resume|trigger|remove``."""
    cron = sub.add_parser("cron", help="list cron schedules, pause, resume or run one now")
    cron_sub = cron.add_subparsers(dest="cron_command", required=True, parser_class=Parser)
    listing = cron_sub.add_parser("list", help="every schedule: next and last tick, status")
    listing.add_argument("--json", action="store_true")
    for verb, text in (
        ("pause", "stop firing a schedule (ticks while paused are not caught up)"),
        ("resume", "fire it again from its next tick"),
        ("trigger", "enqueue one run now, outside the schedule"),
        ("remove", "delete a schedule no release declares any more (an orphaned one)"),
    ):
        cron_sub.add_parser(verb, help=text).add_argument("name")


async def cmd_cron(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.crontab import SCHEDULE_NAME_RE
    from coldbrew.store import JobStore

    command: str = args.cron_command
    name: str = getattr(args, "name", "")
    if command != "list" and not SCHEDULE_NAME_RE.match(name):
        raise ConfigurationError(
            f"cron schedule name {name!r} must match {SCHEDULE_NAME_RE.pattern}"
        )
    if command == "trigger":
        return await _trigger(name, settings)
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        if command == "list":
            return await _list(store, as_json=args.json)
        if command == "remove":
            if not await store.cron.delete(name):
                return _unknown(name)
            print(
                f"coldbrew: cron schedule {name!r} removed (a running worker that still "
                "declares it declares it again, from its next tick)"
            )
            return EXIT_OK
        row = await store.cron.set_paused(name, command == "pause")
    if row is None:
        return _unknown(name)
    state = "paused" if row.paused else "active"
    print(f"coldbrew: cron schedule {name!r} is {state}")
    return EXIT_OK


def _unknown(name: str) -> int:
    print(
        f"coldbrew: no cron schedule named {name!r} (`coldbrew cron list` shows them; a "
        "schedule exists once a worker declaring it has started)",
        file=sys.stderr,
    )
    return EXIT_FAILED


async def _list(store: JobStore, *, as_json: bool) -> int:
    from coldbrew.worker.cron import ORPHAN_SECONDS

    listed = await store.cron.list_schedules(ORPHAN_SECONDS)
    entries = [_entry(item) for item in listed]
    if as_json:
        print_json(entries)
        return EXIT_OK
    if not entries:
        print("(no cron schedules: a schedule appears once a worker that declares it starts)")
        return EXIT_OK
    print(f"{'NAME':<24} {'EXPRESSION':<18} {'TZ':<16} {'STATE':<9} {'NEXT TICK':<21} LAST")
    for entry in entries:
        last = entry["last_job_id"] or "-"
        if entry["last_job_status"]:
            last = f"{last} ({entry['last_job_status']})"
        print(
            f"{entry['name']:<24} {entry['expression']:<18} {entry['tz']:<16} "
            f"{entry['state']:<9} {entry['next_tick'] or '-':<21} {last}"
        )
    return EXIT_OK


def _entry(item: CronListed) -> dict[str, Any]:
    """One schedule as ``--json`` shows it (times in UTC, ISO 8601)."""
    from coldbrew.crontab import make_spec

    row, definition = item.row, item.row.definition
    state = "paused" if row.paused else "orphaned" if item.orphaned else "active"
    try:
        spec = make_spec(
            name=definition.name,
            expression=definition.expression,
            tz=definition.tz,
            type=definition.type,
        )
        next_tick: str | None = _iso(spec.next_tick(max(row.last_tick, item.now)))
    except ConfigurationError:  # a row this release cannot read: shown, not fired
        next_tick = None
    return {
        "name": definition.name,
        "expression": definition.expression,
        "tz": definition.tz,
        "type": definition.type,
        "args": definition.args,
        "queue": definition.queue,
        "tenant": definition.tenant,
        "catch_up": definition.catch_up,
        "max_catch_up": definition.max_catch_up,
        "state": state,
        "next_tick": None if state != "active" else next_tick,
        "last_tick": _iso(row.last_tick),
        "last_job_id": row.last_job_id,
        "last_job_status": item.last_status,
        "seen_at": _iso(row.seen_at),
    }


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _trigger(name: str, settings: Settings) -> int:
    """A manual run with an id of its own (``cron:<name>:manual:<uuid>``), the row's job."""
    from coldbrew.client import Client
    from coldbrew.crontab import manual_job_id

    async with Client.connect(settings) as client:
        await client.store.check_schema()
        row = await client.store.cron.get(name)
        if row is None:
            return _unknown(name)
        definition = row.definition
        record = await client.submit(
            definition.type,
            definition.args,
            tenant=definition.tenant,
            queue=definition.queue,
            priority=definition.priority,
            job_id=manual_job_id(name),
            max_attempts=definition.max_attempts,
            timeout=definition.timeout_seconds,
        )
    print_json(record.to_status_json())
    return EXIT_OK


HANDLERS: dict[str, Handler] = {"cron": cmd_cron}
