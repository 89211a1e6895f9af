"""The HTTP API, and the demo."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from coldbrew import logs
from coldbrew.cli.common import (
    EXIT_OK,
    Handler,
    Parser,
    Subparsers,
    add_app_dir,
)
from coldbrew.settings import Settings

if TYPE_CHECKING:
    pass


def add_commands(sub: Subparsers[Parser]) -> None:
    """The HTTP API, and the demo."""
    api = sub.add_parser("api", help="the HTTP API (COLDBREW_API_HOST:COLDBREW_API_PORT)")
    api.add_argument("--host", help="overrides COLDBREW_API_HOST")
    api.add_argument("--port", type=int, help="overrides COLDBREW_API_PORT")
    api.add_argument(
        "--app", metavar="MODULE:APP", help="reject unknown job types and bad args with 422"
    )
    add_app_dir(api)

    demo = sub.add_parser("demo", help="a self-contained tour on the local broker and database")
    demo.add_argument("--keep", action="store_true", help="keep the demo's schema and queues")


async def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.api.server import serve
    from coldbrew.app import load_app

    await serve(settings, app=load_app(args.app, args.app_dir) if args.app else None)
    return EXIT_OK


async def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from coldbrew.demo import run_demo

    if not args.debug:  # the tour prints its own story (the garbage message's rejection too)
        logs.configure("console", "error")
    return await run_demo(settings, keep=args.keep, namespace_given=args.namespace is not None)


HANDLERS: dict[str, Handler] = {
    "api": cmd_api,
    "demo": cmd_demo,
}
