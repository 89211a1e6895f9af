"""The job of bench/flow.py: a start stamp."""

from __future__ import annotations

import time

from coldbrew import App, Context

app = App()


@app.job()
async def stamp(ctx: Context) -> float:
    """Returns when it started (wall clock): submit-to-start latency."""
    return time.time()
