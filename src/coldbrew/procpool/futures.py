"""Settling futures that something else may have settled first.

Why: a child's boot, exit and job futures are settled from several places
(its frames, its reaping, a timeout, ``close()``); whichever comes first
wins and the others must be no-ops rather than ``InvalidStateError``.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["fail", "ignore_outcome", "resolve"]


def resolve(future: asyncio.Future[Any], value: Any) -> None:
    """Set ``value`` unless ``future`` is already done."""
    if not future.done():
        future.set_result(value)


def fail(future: asyncio.Future[Any], error: BaseException) -> None:
    """Set ``error`` unless ``future`` is already done."""
    if not future.done():
        future.set_exception(error)


def ignore_outcome(future: asyncio.Future[Any]) -> None:
    """Done callback: mark an exception as retrieved when nobody awaits ``future`` any more."""
    if not future.cancelled():
        future.exception()
