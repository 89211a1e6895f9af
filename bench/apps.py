"""The app the benchmarks run: one no-op coroutine job, so only coldbrew's machinery is measured.

It has no plain-function jobs, so a worker running it starts no process pool.
"""

from __future__ import annotations

from coldbrew import App, Context

app = App()


@app.job()
async def noop(ctx: Context) -> None:
    """Does nothing: the cost measured is the claim, the completion and the ack around it."""
