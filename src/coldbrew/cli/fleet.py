"""The fleet-wide settings: tenants' weights, pauses and caps, lanes' pauses, job types' caps."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from coldbrew.cli.common import (
    EXIT_OK,
    Handler,
    Parser,
    Subparsers,
    print_empty,
    print_json,
)
from coldbrew.errors import ConfigurationError
from coldbrew.operations import check_weight, parse_cap
from coldbrew.settings import Settings, mask_url

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
    _add_rate_options(tenants_set)
    tenants_set.add_argument(
        "--webhook-url",
        metavar="URL|none",
        help="webhook of the tenant's jobs that name none (none: remove it)",
    )
    for verb, text in (("pause", "hold this tenant's jobs"), ("resume", "run them again")):
        tenants_sub.add_parser(verb, help=text).add_argument("name")

    lanes = sub.add_parser("lanes", help="list lanes, pause and resume one fleet-wide")
    lanes_sub = lanes.add_subparsers(dest="lanes_command", required=True, parser_class=Parser)
    lanes_sub.add_parser("list", help="every known lane and its state").add_argument(
        "--json", action="store_true"
    )
    for verb, text in (
        ("pause", "hold this lane's jobs on every worker, for every tenant"),
        ("resume", "run them again"),
    ):
        lanes_sub.add_parser(verb, help=text).add_argument("name", metavar="LANE")

    types = sub.add_parser(
        "types", help="list job types (the workers' registrations, the caps) and cap them"
    )
    types_sub = types.add_subparsers(dest="types_command", required=True, parser_class=Parser)
    types_sub.add_parser(
        "list", help="every job type a worker registered or that has a cap: lane, defaults, cap"
    ).add_argument("--json", action="store_true")
    types_set = types_sub.add_parser("set", help="cap a job type's running jobs fleet-wide")
    types_set.add_argument("name", metavar="TYPE")
    types_set.add_argument("--max-running", metavar="N|none", help="the cap (none: no cap)")
    _add_rate_options(types_set)


def _add_rate_options(parser: Parser) -> None:
    parser.add_argument(
        "--rate",
        metavar="N/s|N/min|N/h|none",
        help="fleet-wide rate limit on starts, e.g. 10/s or 600/min (none: no limit)",
    )
    parser.add_argument(
        "--burst",
        metavar="N",
        help="starts allowed at once beyond the steady rate (default: a tenth of a second's "
        "worth of the rate, at least 1)",
    )


@dataclasses.dataclass(frozen=True)
class RateChange:
    """``--rate``/``--burst`` as given: what to store (``clear``: remove the limit)."""

    per_second: float | None
    burst: int | None
    clear: bool


def parse_rate_options(rate_text: str | None, burst_text: str | None) -> RateChange | None:
    """``--rate`` and ``--burst`` checked (ConfigurationError: exit 2); None: neither given."""
    from coldbrew.ratelimit import MAX_BURST, parse_rate

    if rate_text is None and burst_text is None:
        return None
    burst = None
    if burst_text is not None:
        try:
            burst = int(burst_text)
        except ValueError:
            raise ConfigurationError(
                f"--burst must be a whole number, not {burst_text!r}"
            ) from None
        if not 1 <= burst <= MAX_BURST:
            raise ConfigurationError(f"--burst must be in 1..{MAX_BURST}, not {burst}")
    if rate_text is not None and rate_text.strip().lower() in ("none", "unlimited"):
        if burst is not None:
            raise ConfigurationError("--burst makes no sense with --rate none")
        return RateChange(None, None, clear=True)
    per_second = None
    if rate_text is not None:
        per_second = parse_rate(rate_text, burst or 1, what="--rate").per_second
    return RateChange(per_second, burst, clear=False)


def parse_webhook_option(text: str | None, settings: Settings) -> str | None:
    """``--webhook-url`` checked as a submission's would be (ConfigurationError: exit 2);
    ``none`` removes it; None: not given."""
    from coldbrew.errors import ContractViolation
    from coldbrew.urlguard import check_webhook_url

    if text is None or text.strip().lower() == "none":
        return text
    try:
        check_webhook_url(text, allow_private=settings.webhook_allow_private, what="--webhook-url")
    except ContractViolation as exc:
        raise ConfigurationError(exc.detail) from None
    return text


def _describe_rate(per_second: float | None, burst: int | None) -> str:
    from coldbrew.ratelimit import default_burst, format_rate

    if per_second is None:
        return "no rate limit"
    shown = burst if burst is not None else default_burst(per_second)
    return f"rate {format_rate(per_second)} burst {shown}"


async def cmd_tenants(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.model import NAME_RE
    from coldbrew.store import JobStore
    from coldbrew.topology import Topology

    command = args.tenants_command
    name: str = getattr(args, "name", "")
    if command != "list" and not NAME_RE.match(name):
        raise ConfigurationError(f"tenant name {name!r} must match {NAME_RE.pattern}")
    weight = getattr(args, "weight", None)
    if weight is not None:
        check_weight(weight)
    cap_text = getattr(args, "max_running", None)
    cap = parse_cap(cap_text) if cap_text is not None else None
    rate = parse_rate_options(getattr(args, "rate", None), getattr(args, "burst", None))
    webhook = parse_webhook_option(getattr(args, "webhook_url", None), settings)
    channel = Topology(settings.namespace).tenant_channel
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        if command == "list":
            rows = await store.tenants.list_tenants()
        else:
            paused = {"pause": True, "resume": False}.get(command)
            row = await store.tenants.set_tenant(
                name,
                weight=weight,
                paused=paused,
                max_running=cap,
                uncap=cap_text is not None and cap is None,
                channel=channel,
            )
            if rate is not None:
                row = await store.tenants.set_tenant_rate(
                    name,
                    per_second=rate.per_second,
                    burst=rate.burst,
                    clear=rate.clear,
                    channel=channel,
                )
            if webhook is not None:
                url = None if webhook.strip().lower() == "none" else webhook
                row = await store.tenants.set_tenant_webhook(name, url, channel=channel)
            rows = [row]
    if getattr(args, "json", False):
        print_json([dataclasses.asdict(row) for row in rows])
        return EXIT_OK
    for row in rows:
        state = "paused" if row.paused else "active"
        limit = "no cap" if row.max_running is None else f"max running {row.max_running}"
        rated = _describe_rate(row.rate_per_second, row.rate_burst)
        hook = f" webhook {mask_url(row.webhook_url)}" if row.webhook_url else ""
        print(f"{row.name:<24} weight {row.weight:<6g} {limit:<18} {rated:<26} {state}{hook}")
    if not rows:
        print_empty("no tenants yet: one is recorded when its first job arrives")
    return EXIT_OK


async def cmd_lanes(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.model import NAME_RE
    from coldbrew.store import JobStore
    from coldbrew.topology import Topology

    command = args.lanes_command
    if command != "list" and not NAME_RE.fullmatch(args.name):
        raise ConfigurationError(f"lane name {args.name!r} must match {NAME_RE.pattern}")
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        if command == "list":
            rows = await store.tenants.list_lanes()
        else:
            rows = [
                await store.tenants.set_lane_paused(
                    args.name,
                    command == "pause",
                    channel=Topology(settings.namespace).tenant_channel,
                )
            ]
    if getattr(args, "json", False):
        print_json([dataclasses.asdict(row) for row in rows])
        return EXIT_OK
    for row in rows:
        print(f"{row.name:<24} {'paused' if row.paused else 'active'}")
    if not rows:
        print_empty("no lanes yet: one is known once a worker registers a type on it")
    return EXIT_OK


async def cmd_types(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.app import JOB_TYPE_RE
    from coldbrew.store import JobStore
    from coldbrew.topology import Topology

    if args.types_command == "set" and not JOB_TYPE_RE.match(args.name):
        raise ConfigurationError(f"job type {args.name!r} must match {JOB_TYPE_RE.pattern}")
    setting = args.types_command == "set"
    cap_text = args.max_running if setting else None
    cap = parse_cap(cap_text) if cap_text is not None else None
    rate = parse_rate_options(args.rate, args.burst) if setting else None
    if setting and cap_text is None and rate is None:
        raise ConfigurationError("types set needs --max-running, --rate or --burst")
    channel = Topology(settings.namespace).tenant_channel
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        if not setting:
            caps = {row.name: row for row in await store.tenants.list_job_types()}
            registered = {row.name: row for row in await store.types.list_all()}
            return _list_types(caps, registered, json_out=args.json)
        row = None
        if cap_text is not None:
            row = await store.tenants.set_job_type(args.name, max_running=cap, channel=channel)
        if rate is not None:
            row = await store.tenants.set_job_type_rate(
                args.name,
                per_second=rate.per_second,
                burst=rate.burst,
                clear=rate.clear,
                channel=channel,
            )
    assert row is not None  # one of the two was given (checked above)
    print(f"{row.name:<32} {_describe_limits(row)}")
    return EXIT_OK


def _describe_limits(row: JobTypeSettings | None) -> str:
    """A type's cap and rate limit, as ``types list`` and ``types set`` print them."""
    if row is None:
        return f"{'no cap':<18} {'no rate limit':<26}"
    limit = "no cap" if row.max_running is None else f"max running {row.max_running}"
    return f"{limit:<18} {_describe_rate(row.rate_per_second, row.rate_burst):<26}"


def _list_types(
    caps: dict[str, JobTypeSettings], registered: dict[str, RegisteredType], *, json_out: bool
) -> int:
    """``types list``: each type a worker registered (lane, pool, defaults) or that has a cap
    or a rate limit."""
    names = sorted(caps.keys() | registered.keys())
    if json_out:
        print_json(
            [
                {
                    "name": name,
                    "max_running": caps[name].max_running if name in caps else None,
                    "rate_per_second": caps[name].rate_per_second if name in caps else None,
                    "rate_burst": caps[name].rate_burst if name in caps else None,
                    "registered": registered[name].to_json() if name in registered else None,
                }
                for name in names
            ]
        )
        return EXIT_OK
    if not names:
        print_empty(
            "no job types: no worker has registered one yet and no job type has a cap or a "
            "rate limit (`coldbrew types set TYPE --max-running N | --rate N/s`)"
        )
        return EXIT_OK
    for name in names:
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
        print(f"{name:<24} {_describe_limits(caps.get(name))} {where}")
    return EXIT_OK


HANDLERS: dict[str, Handler] = {
    "tenants": cmd_tenants,
    "lanes": cmd_lanes,
    "types": cmd_types,
}
