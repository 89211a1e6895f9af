"""The ``coldbrew`` command: parses flags, builds settings, maps errors to exit codes.

Exit codes: 0 ok, 1 job or operation failed, 2 usage or configuration error,
3 RabbitMQ or PostgreSQL unreachable. Errors are one line on stderr; a
traceback only with ``--debug``.

One module per group of commands; each gives ``add_commands(sub)`` and its
``HANDLERS``. A new group is a new module listed in ``GROUPS``.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from coldbrew import logs
from coldbrew.cli import batch, cron, fleet, inspect, jobs, plan, prune, queues, services, shell
from coldbrew.cli.common import (
    APP_DIR_HELP,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Handler,
    Parser,
    run,
)
from coldbrew.errors import ColdbrewError, ConfigurationError, JobNotFound, ServiceUnavailable
from coldbrew.settings import load_settings

GROUPS = (jobs, inspect, fleet, services, cron, batch, plan, prune, queues, shell)
HANDLERS: dict[str, Handler] = {
    command: handler for group in GROUPS for command, handler in group.HANDLERS.items()
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="coldbrew", description="Long-running jobs over RabbitMQ and PostgreSQL.")
    parser.add_argument("--version", action="version", version=version_line())
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--namespace", help="overrides COLDBREW_NAMESPACE")
    parser.add_argument("--app-dir", metavar="DIR", default=None, help=APP_DIR_HELP)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in GROUPS:
        group.add_commands(sub)
    return parser


def version_line() -> str:
    """``coldbrew X.Y.Z (Python A.B.C)``: the installed distribution's version, as pip sees it."""
    try:
        installed = version("coldbrew")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = "unknown (not installed)"
    return f"coldbrew {installed} (Python {platform.python_version()})"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        overrides = _overrides(args)
        settings = load_settings(**overrides)
        logs.configure(settings.log_format, "debug" if args.debug else settings.log_level)
        return run(HANDLERS[args.command](args, settings))
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


__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNAVAILABLE", "EXIT_USAGE", "JobNotFound", "main"]
