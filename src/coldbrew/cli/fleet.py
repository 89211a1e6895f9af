"""The fleet-wide settings: tenants' weights, pauses and caps, job types' caps."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from coldbrew.cli.common import (
    EXIT_OK,
    Handler,
    Parser,
    Subparsers,
    parse_cap,
    print_empty,
    print_json,
)
from coldbrew.errors import ConfigurationError
from coldbrew.settings import Settings

if TYPE_CHECKING:
    from coldbrew.store import JobTypeSettings, RegisteredType


def add_commands(sub: Subparsers[Parser]) -> None:
    """The fleet-wide settings: tenants' weights, pauses and caps, job types' caps."""
    tenants = sub.add_parser("tenants", help="list tenants, set weights, pause and resume")
    tenants_sub = tenants.add_subparsers(dest="tenants_command", required=True, parser_class=Parser)
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

    types = sub.add_parser(
        "types", help="list job types (the workers' registrations, the caps) and cap them"
    )
    types_sub = types.add_subparsers(dest="types_command", required=True, parser_class=Parser)
    types_sub.add_parser(
        "list", help="every job type a worker registered or that has a cap: lane, defaults, cap"
    ).add_argument(
        "--json", action="store_true"
    )
    types_set = types_sub.add_parser("set", help="cap a job type's running jobs fleet-wide")
    types_set.add_argument("name", metavar="TYPE")
    types_set.add_argument(
        "--max-running", metavar="N|none", required=True, help="the cap (none: no cap)"
    )


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
    cap = parse_cap(cap_text) if cap_text is not None else None
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
        print_json([dataclasses.asdict(row) for row in rows])
        return EXIT_OK
    for row in rows:
        state = "paused" if row.paused else "active"
        limit = "no cap" if row.max_running is None else f"max running {row.max_running}"
        print(f"{row.name:<24} weight {row.weight:<6g} {limit:<18} {state}")
    if not rows:
        print_empty("no tenants yet: one is recorded when its first job arrives")
    return EXIT_OK


async def cmd_types(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.app import JOB_TYPE_RE
    from coldbrew.store import JobStore
    from coldbrew.topology import Topology

    if args.types_command == "set" and not JOB_TYPE_RE.match(args.name):
        raise ConfigurationError(f"job type {args.name!r} must match {JOB_TYPE_RE.pattern}")
    cap = parse_cap(args.max_running) if args.types_command == "set" else None
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        if args.types_command == "list":
            caps = {row.name: row for row in await store.tenants.list_job_types()}
            registered = {row.name: row for row in await store.types.list_all()}
            return _list_types(caps, registered, json_out=args.json)
        row = await store.tenants.set_job_type(
            args.name, max_running=cap, channel=Topology(settings.namespace).tenant_channel
        )
    limit = "no cap" if row.max_running is None else f"max running {row.max_running}"
    print(f"{row.name:<32} {limit}")
    return EXIT_OK


def _list_types(
    caps: dict[str, JobTypeSettings], registered: dict[str, RegisteredType], *, json_out: bool
) -> int:
    """``types list``: each type a worker registered (lane, pool, defaults) or that has a cap."""
    names = sorted(caps.keys() | registered.keys())
    if json_out:
        print_json(
            [
                {
                    "name": name,
                    "max_running": caps[name].max_running if name in caps else None,
                    "registered": registered[name].to_json() if name in registered else None,
                }
                for name in names
            ]
        )
        return EXIT_OK
    if not names:
        print_empty(
            "no job types: no worker has registered one yet and no job type has a cap "
            "(`coldbrew types set TYPE --max-running N`)"
        )
        return EXIT_OK
    for name in names:
        cap = caps.get(name)
        limit = "no cap" if cap is None or cap.max_running is None else (
            f"max running {cap.max_running}"
        )
        reg = registered.get(name)
        if reg is None:
            where = "not registered by any worker"
        else:
            pool = "process pool" if reg.is_process else "coroutine"
            attempts = "-" if reg.max_attempts is None else str(reg.max_attempts)
            timeout = "-" if reg.timeout is None else f"{reg.timeout:g}s"
            where = (
                f"lane {reg.queue:<10} {pool:<12} attempts {attempts:<3} timeout {timeout:<7} "
                f"by {reg.worker_id}"
            )
        print(f"{name:<24} {limit:<16} {where}")
    return EXIT_OK


HANDLERS: dict[str, Handler] = {
    "tenants": cmd_tenants,
    "types": cmd_types,
}
