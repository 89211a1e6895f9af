"""Jobs for the flow tests (issue #16): parents that spawn children, chain steps.

Children and steps append a line to ``$FLOW_EFFECTS_DIR/<job id>`` when they run
(if set), so a test counts executions, not only rows.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from coldbrew import App, Context, Permanent

app = App()


def _effect(ctx: Any) -> None:
    folder = os.environ.get("FLOW_EFFECTS_DIR")
    if folder:
        with (Path(folder) / ctx.job_id).open("a") as sink:
            sink.write(f"{ctx.attempt}\n")


@app.job()
async def leaf(ctx: Context, n: int) -> dict[str, int]:
    """A child: runs and reports which it was."""
    _effect(ctx)
    return {"n": n}


@app.job(max_attempts=5)
async def spawner(
    ctx: Context,
    count: int,
    fail_first: bool = False,
    permanent: bool = False,
    hold: float = 0,
    hold_first: float = 0,
) -> int:
    """Spawns ``count`` leaf children; may fail its first attempt after spawning them
    (or fail for good), or hold a while after spawning (every attempt, or the first:
    for kill and fence tests)."""
    for n in range(count):
        await ctx.submit("leaf", {"n": n}, name=f"leaf-{n}")
    if hold or (hold_first and ctx.attempt == 1):
        await asyncio.sleep(hold or hold_first)
    if permanent:
        raise Permanent("this parent fails for good")
    if fail_first and ctx.attempt == 1:
        raise RuntimeError("the first attempt fails after spawning")
    return count


@app.job(max_attempts=3)
def pool_spawner(ctx: Any, count: int) -> int:
    """A process-pool parent: ctx.submit is relayed to the worker."""
    ids = [ctx.submit("leaf", {"n": n}, name=f"leaf-{n}") for n in range(count)]
    return len(set(ids))


@app.job(max_attempts=5)
async def add(ctx: Context, x: int, previous: int | None = None) -> int:
    """A chain step: previous + x (x alone for the first step)."""
    _effect(ctx)
    return (previous or 0) + x


@app.job(max_attempts=5)
async def flaky_add(ctx: Context, x: int, previous: int | None = None) -> int:
    """A middle chain step that fails its first attempt."""
    _effect(ctx)
    if ctx.attempt == 1:
        raise RuntimeError("the middle step fails once")
    return (previous or 0) + x


@app.job()
async def refuse(ctx: Context, previous: Any = None) -> None:
    """A chain step that fails for good."""
    raise Permanent("this step refuses")


@app.job()
async def stamp(ctx: Context, tag: str) -> float:
    """Reports when it started (the transactional-submit latency test)."""
    return time.time()


@app.job(max_attempts=1)
async def bad_parent(ctx: Context) -> None:
    """Spawns a child whose args fail the child's signature: the parent's attempt fails."""
    await ctx.submit("leaf", {"n": "not a number"}, name="x")
