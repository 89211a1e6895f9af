"""The app ``bench/ratelimit.py`` runs: one coroutine job that sleeps ``ms`` milliseconds.

Coroutine only, so a worker running it starts no process pool. The rate is
read from the rows' ``started_at`` (the claim's transaction time, the very
instant the GCRA bucket judged), not from the job.
"""

from __future__ import annotations

import asyncio

from coldbrew import App, Context

app = App()


@app.job()
async def work(ctx: Context, ms: float) -> None:
    """Sleep ``ms`` milliseconds (0: return at once)."""
    if ms > 0:
        await asyncio.sleep(ms / 1000)
