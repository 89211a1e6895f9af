"""Jobs for the lost-message scenarios: coroutine jobs only, so a worker starts no process pool."""

from __future__ import annotations

import asyncio

from coldbrew import App, Context

app = App()


@app.job()
async def echo(ctx: Context, value: object = None) -> dict[str, object]:
    return {"value": value, "attempt": ctx.attempt}


@app.job(timeout=60)
async def nap(ctx: Context, seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds
