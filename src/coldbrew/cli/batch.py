"""``coldbrew batch status|cancel``: a batch's counts, progress and callbacks; cancelling it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from coldbrew.cli.common import EXIT_FAILED, EXIT_OK, Handler, Parser, Subparsers, print_json
from coldbrew.settings import Settings


def add_commands(sub: Subparsers[Parser]) -> None:
    """``coldbrew batch status ID [--json]`` and ``coldbrew batch cancel ID [--reason]``."""
    batch = sub.add_parser("batch", help="a batch's status, or cancel it")
    batch_sub = batch.add_subparsers(dest="batch_command", required=True, parser_class=Parser)
    status = batch_sub.add_parser("status", help="counts by status, progress, callbacks")
    status.add_argument("batch_id")
    status.add_argument("--json", action="store_true", help="the status JSON")
    cancel = batch_sub.add_parser("cancel", help="cancel the batch's unfinished members")
    cancel.add_argument("batch_id")
    cancel.add_argument("--reason", default="batch cancelled from the command line")
    cancel.add_argument("--json", action="store_true", help="the status JSON")


async def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.client import Client

    async with Client.connect(settings, broker=False, check_schema=True) as client:
        record = await client.get_batch(args.batch_id)
        if args.batch_command == "cancel":
            if record.pending == 0:  # finished before: an error only, as `coldbrew cancel`
                print(
                    f"coldbrew: batch {record.id} is already {record.status}; nothing to cancel",
                    file=sys.stderr,
                )
                return EXIT_FAILED
            record = await client.cancel_batch(args.batch_id, args.reason)
    status = record.to_status_json()
    if args.json:
        print_json(status)
    else:
        print(render(status))
    return EXIT_OK


def render(status: dict[str, Any]) -> str:
    """A few lines for people: the state, the counts that are not 0, the callbacks."""
    counts: dict[str, int] = status["counts"]
    shown = ", ".join(f"{name} {n}" for name, n in counts.items() if n) or "no members"
    lines = [
        f"batch {status['id']}  {status['status']}  "
        f"{status['total']} members, {status['pending']} pending  "
        f"progress {status['progress'] * 100:.0f}%",
        f"  {shown}",
    ]
    if status["description"]:
        lines.insert(1, f"  {status['description']}")
    for name, callback in status["callbacks"].items():
        state = callback["status"] or "not enqueued"
        lines.append(f"  {name}: {callback['type']} ({callback['job_id']}: {state})")
    return "\n".join(lines)


HANDLERS: dict[str, Handler] = {"batch": cmd_batch}
