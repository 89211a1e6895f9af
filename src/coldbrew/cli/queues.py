"""``coldbrew queues migrate --to quorum|classic``: switch a namespace's queue layout.

The work is ``queueswitch.py``'s; this module reads the flags, connects with
the target layout and prints what moved. Roll every worker (and submitter) to
the new ``COLDBREW_QUEUE_TYPE`` / ``COLDBREW_PRIORITY_BANDS`` first: the
command refuses while a queue of the old layout has consumers.
"""

from __future__ import annotations

import argparse

from coldbrew.cli.common import EXIT_FAILED, EXIT_OK, Handler, Parser, Subparsers, print_json
from coldbrew.settings import Settings


def add_commands(sub: Subparsers[Parser]) -> None:
    """``coldbrew queues migrate``."""
    queues = sub.add_parser("queues", help="switch the namespace between classic and quorum queues")
    queues_sub = queues.add_subparsers(dest="queues_command", required=True, parser_class=Parser)
    migrate = queues_sub.add_parser(
        "migrate",
        help="declare the target layout, move every waiting message, delete the old queues",
    )
    migrate.add_argument("--to", choices=("classic", "quorum"), required=True)
    migrate.add_argument(
        "--bands",
        type=int,
        choices=range(1, 11),
        metavar="1-10",
        default=None,
        help="the target's priority bands (quorum; default COLDBREW_PRIORITY_BANDS)",
    )
    migrate.add_argument(
        "--from",
        dest="source",
        choices=("classic", "quorum"),
        default=None,
        help="the layout to retire (default: the other type than --to)",
    )
    migrate.add_argument(
        "--from-bands",
        type=int,
        choices=range(1, 11),
        metavar="1-10",
        default=None,
        help="the retired layout's priority bands (quorum; default COLDBREW_PRIORITY_BANDS)",
    )
    migrate.add_argument(
        "--force",
        action="store_true",
        help="retire queues that still have consumers (their workers re-declare them)",
    )
    migrate.add_argument("--json", action="store_true")


async def cmd_queues(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.queueswitch import describe, switch_queues
    from coldbrew.store import JobStore
    from coldbrew.topology import QueueType, Topology
    from coldbrew.transport import Broker

    bands = args.bands or settings.priority_bands
    target = Topology(settings.namespace, args.to, bands)
    source_type: QueueType = args.source or ("classic" if args.to == "quorum" else "quorum")
    source = Topology(settings.namespace, source_type, args.from_bands or settings.priority_bands)
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        await store.check_schema()
        broker = Broker(settings.amqp_url, target, name="coldbrew-queues-migrate")
        await broker.connect()
        try:
            report = await switch_queues(store, broker, source, force=args.force)
        finally:
            await broker.close()
    if args.json:
        print_json(report.as_dict())
    else:
        print(
            f"{describe(source)} -> {describe(target)}: {report.pairs} tenant queue(s) declared, "
            f"{sum(1 for r in report.retired if r.deleted)} old queue(s) deleted, "
            f"{report.moved} message(s) moved"
        )
        for item in report.retired:
            if not item.deleted:
                print(f"not deleted (still refilling): {item.name}; run the command again")
    return EXIT_OK if all(item.deleted for item in report.retired) else EXIT_FAILED


HANDLERS: dict[str, Handler] = {"queues": cmd_queues}
