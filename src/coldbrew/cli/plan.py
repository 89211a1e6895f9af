"""``coldbrew plan``: per lane, Little's law, utilisation and Erlang C from live figures.

The arithmetic is `coldbrew.capacity`'s; this module reads the window's
figures from PostgreSQL (the job table for λ and W, the ``workers`` table
for c = Σ concurrency of the live workers serving each lane) and prints them.
"""

from __future__ import annotations

import argparse
import math

from coldbrew.cli.common import (
    EXIT_OK,
    Handler,
    Parser,
    Subparsers,
    format_duration,
    parse_duration,
    print_empty,
    print_json,
)
from coldbrew.settings import Settings


def add_commands(sub: Subparsers[Parser]) -> None:
    """``coldbrew plan``."""
    plan = sub.add_parser(
        "plan",
        help="capacity per lane: arrival rate, service time, load (Little's law), utilisation, "
        "Erlang C wait and the slots/workers needed for --target-wait",
    )
    plan.add_argument(
        "--window", default="1h", metavar="DURATION", help="how far back to measure (default 1h)"
    )
    plan.add_argument(
        "--target-wait",
        default="p95<=5s",
        metavar="TARGET",
        help="the wait to plan for: p95<=5s (default), p99<=500ms, mean<=2s",
    )
    plan.add_argument(
        "--what-if-rate",
        metavar="RATE",
        help="plan for other arrivals: a multiplier (2x) or a rate per lane (30/s, 600/m)",
    )
    plan.add_argument(
        "--prometheus",
        metavar="URL",
        help="take λ and W from this Prometheus (the fleet's counters over --window) "
        "instead of the job table; c still comes from the workers table",
    )
    plan.add_argument("--queue", action="append", help="only this lane (repeatable)")
    plan.add_argument("--json", action="store_true")


async def cmd_plan(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.capacity import LaneSample, parse_rate_change, parse_target, plan_lane
    from coldbrew.store import JobStore

    window = parse_duration(args.window, "--window")
    target = parse_target(args.target_wait)
    change = parse_rate_change(args.what_if_rate) if args.what_if_rate else None
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        figures = await store.capacity.lane_figures(window)
        workers = [w for w in await store.liveness.list_workers() if w.alive]
    if args.prometheus:
        from coldbrew.cli.promfigures import lane_figures

        figures = await lane_figures(args.prometheus, window, figures)
    plans = []
    for lane in figures:
        if args.queue and lane.queue not in args.queue:
            continue
        serving = [w for w in workers if lane.queue in w.lanes]
        sample = LaneSample(
            window_seconds=window,
            slots=sum(w.concurrency for w in serving),
            workers=len(serving),
            **{k: getattr(lane, k) for k in lane.__dataclass_fields__},
        )
        plans.append(plan_lane(sample, target, change))
    if args.json:
        print_json(
            {
                "window_seconds": window,
                "target_wait": str(target),
                "what_if_rate": args.what_if_rate,
                "source": "prometheus" if args.prometheus else "postgresql",
                "lanes": [p.to_json() for p in plans],
            }
        )
        return EXIT_OK
    if not plans:
        print_empty(f"no lane had jobs submitted, finished or waiting in the last {args.window}")
        return EXIT_OK
    for plan in plans:
        print("\n".join(_lines(plan, str(target))))
    return EXIT_OK


def _lines(plan: object, target: str) -> list[str]:
    """One lane's figures as a few readable lines."""
    from coldbrew.capacity import LanePlan

    assert isinstance(plan, LanePlan)
    head = (
        f"lane {plan.queue}: λ {plan.arrival_rate:.3g}/s arriving, {plan.finish_rate:.3g}/s "
        f"finishing; {plan.waiting} waiting; c = {plan.slots} slots on {plan.workers} worker(s)"
    )
    if plan.status == "insufficient_data":
        return [head, f"  not enough data: needs {plan.needs}"]
    cv = "-" if plan.service_cv is None else f"{plan.service_cv:.2f}"
    lines = [
        head,
        f"  W {format_duration(plan.service_mean_seconds)} mean service (spread cv {cv}); "
        f"L = λW = {plan.load:.3g} jobs in service",
    ]
    if plan.status == "no_workers":
        lines.append(f"  {plan.needs}")
    else:
        assert plan.utilisation is not None
        assert plan.wait_probability is not None
        statistic = target.split("<")[0]
        lines.append(
            f"  rho = λW/c = {plan.utilisation:.1%}; P(wait) {plan.wait_probability:.1%}; "
            f"mean wait {_wait(plan.mean_wait_seconds)}; "
            f"{statistic} wait {_wait(plan.predicted_wait_seconds)}"
        )
    if plan.slots_needed is None:
        lines.append(f"  for {target}: {plan.needs}")
        return lines
    lines.append(
        f"  for {target}: {plan.slots_needed} slots"
        + (f" = {plan.workers_needed} worker(s) like these" if plan.workers_needed else "")
    )
    return lines


def _wait(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "unbounded (rho ≥ 1)"
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else format_duration(seconds)


HANDLERS: dict[str, Handler] = {"plan": cmd_plan}
