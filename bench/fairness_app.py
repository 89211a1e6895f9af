"""The app ``bench/fairness.py`` runs: one coroutine job that sleeps and says when it ran.

The job reads the wall clock itself, at its first line and after its sleep, so
a start delay is measured against a timestamp the publisher controls
(``published``, in the args) rather than ``created_at``, which coldbrew sets
when it inserts the row at claim time. It is a coroutine, so a worker running
this app starts no process pool.
"""

from __future__ import annotations

import asyncio
import time

from coldbrew import App, Context

app = App()


@app.job()
async def work(ctx: Context, ms: float, published: float) -> dict[str, float]:
    """Sleep ``ms`` milliseconds; return the publish, start and end wall times (``time.time()``)."""
    started = time.time()
    if ms > 0:
        await asyncio.sleep(ms / 1000)
    return {"published": published, "started": started, "finished": time.time()}
