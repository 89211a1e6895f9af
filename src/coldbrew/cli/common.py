"""What every command module shares: the parser that exits 2, exit codes, running a coroutine."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

from coldbrew.errors import ConfigurationError
from coldbrew.settings import Settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3

Handler = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]


class Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line, as every other usage error does."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_USAGE, f"coldbrew: {message} (see `coldbrew --help`)\n")


Subparsers = argparse._SubParsersAction  # the type add_subparsers() returns


APP_DIR_HELP = "import MODULE from DIR first (default: the current directory, as uvicorn does)"


def add_app_dir(parser: argparse.ArgumentParser) -> None:
    """``--app-dir`` on a command that takes ``MODULE:APP``, as well as before the command.

    ``SUPPRESS``: a sub-command's default would overwrite the global flag's value.
    """
    parser.add_argument("--app-dir", metavar="DIR", default=argparse.SUPPRESS, help=APP_DIR_HELP)


def run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.run(coro)
    return uvloop.run(coro)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def parse_cap(text: str) -> int | None:
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
