"""The app of ``bench/inflight.py``: one coroutine job that only sleeps.

A sleeping job holds its slot, its lease and its in-flight state without
using the CPU, so what the worker spends while thousands of them wait is
coldbrew's own bookkeeping: heartbeats, progress ticks, memory per job.
No plain-function jobs, so a worker running it starts no process pool.
"""

from __future__ import annotations

import asyncio

from coldbrew import App, Context

app = App()


@app.job()
async def sleeper(ctx: Context, seconds: float) -> None:
    """Sleep ``seconds`` (longer than the measurement), reporting nothing."""
    await asyncio.sleep(seconds)
