"""Jobs for bench/flow.py: a start stamp, and parents with and without children."""

from __future__ import annotations

import time

from coldbrew import App, Context

app = App()


@app.job()
async def stamp(ctx: Context) -> float:
    """Returns when it started (wall clock): submit-to-start latency."""
    return time.time()


@app.job()
async def parent(ctx: Context, children: int) -> None:
    for n in range(children):
        await ctx.submit("leaf", {}, name=f"c{n}")


@app.job()
async def leaf(ctx: Context) -> None:
    """A child that does nothing."""
