"""Job apps for the CLI-experience tests: a type on lane ``slow``, the same type declared on
another lane by a second app (two apps that disagree), progress that then fails."""

from __future__ import annotations

import asyncio
import time

from coldbrew import App, Context, Permanent, Retry

app = App()


@app.job(queue="slow", max_attempts=7, timeout=30)
async def resize(ctx: Context, size: int = 1) -> dict[str, object]:
    """Declared on lane ``slow``: a submitter without this app must still route it there."""
    ctx.progress(0.5, "resizing")
    await asyncio.sleep(0.3)
    return {"size": size, "max_attempts": ctx.max_attempts}


@app.job()
async def render(ctx: Context) -> str:
    """Reports "rendering", waits for it to be flushed, then succeeds."""
    ctx.progress(0.5, "rendering")
    await asyncio.sleep(0.5)
    return "rendered"


@app.job()
async def half_then_fail(ctx: Context) -> None:
    """Reports progress, waits for it to be flushed, then fails permanently."""
    ctx.progress(0.4, "halfway")
    await asyncio.sleep(0.5)
    raise Permanent("gave up halfway")


@app.job(max_attempts=3)
async def try_later(ctx: Context) -> None:
    """Reports "trying", waits for it to be flushed, then asks for a retry in a minute."""
    ctx.progress(0.2, "trying")
    await asyncio.sleep(0.5)
    raise Retry("come back in a minute", delay=60)


@app.job()
def pool_progress(ctx: Context) -> str:
    """In the process pool: reports progress, then works on long enough to be seen."""
    ctx.progress(0.5, "halfway in the pool")
    time.sleep(1.0)
    return "done"


other = App()


@other.job("resize", queue="fast")
async def resize_elsewhere(ctx: Context, size: int = 1) -> None:
    """``resize`` as another app declares it: on lane ``fast`` (the two apps disagree)."""
