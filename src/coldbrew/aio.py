"""Small asyncio helpers shared by the worker's loops."""

from __future__ import annotations

import asyncio
from contextlib import suppress


async def sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile."""
    with suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
