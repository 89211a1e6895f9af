"""A job for the outage scenarios: its side effects are files, so it needs no database.

Each attempt writes ``<job>.<attempt>.start`` (pid and wall time) when it begins
and ``<job>.<attempt>.done`` when its work is over; a job with two start files
ran twice. Nothing here touches PostgreSQL or RabbitMQ, so the job runs on
through either service's outage, as a long transcode would.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from coldbrew import App, Context

app = App()


def _effect(ctx: Context, what: str) -> None:
    """Write the record under a hidden name, then rename it: a reader never sees it half done."""
    effects = Path(os.environ["FAULT_EFFECTS_DIR"])
    name = f"{ctx.job_id}.{ctx.attempt}.{what}"
    partial = effects / f".{name}.partial"
    partial.write_text(f"{os.getpid()} {time.time():.6f}")
    partial.replace(effects / name)


@app.job(max_attempts=10, timeout=600)
async def long(ctx: Context, seconds: float) -> dict[str, int]:
    """Sleeps ``seconds``, recording when this attempt started and that it finished."""
    _effect(ctx, "start")
    await asyncio.sleep(seconds)
    _effect(ctx, "done")
    return {"attempt": ctx.attempt}
