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
    print_json,
)
from coldbrew.errors import ConfigurationError
from coldbrew.settings import Settings

if TYPE_CHECKING:
    pass


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

    types = sub.add_parser("types", help="list job types' fleet-wide caps and set them")
    types_sub = types.add_subparsers(dest="types_command", required=True, parser_class=Parser)
    types_sub.add_parser("list", help="every job type with a cap").add_argument(
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
        print("(no tenants yet: one is recorded when its first job arrives)")
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
        print_json([dataclasses.asdict(row) for row in rows])
        return EXIT_OK
    for row in rows:
        limit = "no cap" if row.max_running is None else f"max running {row.max_running}"
        print(f"{row.name:<32} {limit}")
    if not rows:
        print("(no job type has a cap)")
    return EXIT_OK


HANDLERS: dict[str, Handler] = {
    "tenants": cmd_tenants,
    "types": cmd_types,
}
