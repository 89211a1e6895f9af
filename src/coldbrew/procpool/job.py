"""One job in flight in the pool, as the parent sees it, and the host behind its ``ctx``.

Why a separate record: the pool creates it in ``run()``, the child's handle
settles its future from the child's frames and answers its RPCs through
``host``, and both cancel what is left of it; neither owns the other.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["ContextHost", "PoolJob"]


class ContextHost(Protocol):
    """The parent-side services behind a pool job's ``ProcessContext``."""

    def progress(self, fraction: float | None, message: str | None) -> None: ...

    async def checkpoint(self, state: Any) -> None: ...

    async def once(self, name: str) -> bool: ...

    async def add_to_batch(self, member: dict[str, Any]) -> str: ...

    async def submit(
        self, type: str, args: Mapping[str, Any] | None = None, *, name: str, **options: Any
    ) -> str: ...


@dataclass(eq=False)
class PoolJob:
    """A job handed to a child: its outcome is ``future``, its pending RPC answers ``rpcs``."""

    job_id: str
    job_type: str
    host: ContextHost
    future: asyncio.Future[Any]
    rpcs: set[asyncio.Task[None]] = field(default_factory=set)
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    """The context the job was handed over in (the worker's run span, the job's log
    context): its RPCs are answered in it, so a child ``ctx.submit`` makes names the run
    span as the coroutine job's does. A copy is O(1)."""
    over: Callable[[], None] | None = None
    """Called by the child's handle right after the child's result settled ``future``: the
    pool takes the child back there and then, handing it the next job (roster.py)."""
