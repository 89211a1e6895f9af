"""What every command module shares: the parser that exits 2, exit codes, running a coroutine."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
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


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
MAX_DURATION_SECONDS = 3650 * 86400.0


def parse_duration(text: str, flag: str) -> float:
    """A duration flag (``90s``, ``15m``, ``1h``, ``7d``, ``2w``, ``1h30m``; a bare number is
    seconds) in seconds; anything else is a usage error naming ``flag``."""
    cleaned = text.strip().lower()
    seconds: float | None = None
    try:
        seconds = float(cleaned) if cleaned and cleaned[-1].isdigit() else None
    except ValueError:
        seconds = None
    if seconds is None and cleaned and _DURATION_PART.sub("", cleaned) == "":
        seconds = sum(
            float(number) * _DURATION_UNITS[unit]
            for number, unit in _DURATION_PART.findall(cleaned)
        )
    if seconds is None or not math.isfinite(seconds):
        raise ConfigurationError(
            f"{flag} must be a duration like 90s, 15m, 1h or 7d, not {text!r}"
        )
    if not 0 < seconds <= MAX_DURATION_SECONDS:
        raise ConfigurationError(f"{flag} must be more than 0 s and at most 3650d, not {text!r}")
    return seconds


def format_duration(seconds: float | None) -> str:
    """A duration for a table: ``0.4s``, ``12.3s``, ``4.5m``, ``2.1h``, ``3.0d`` (``-``: none)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def print_empty(what: str) -> None:
    """A command's empty state: one line on stdout in parentheses, never silence."""
    print(f"({what})")
