"""Jobs for the fault scenarios: each records when each attempt started and its side effect."""

from __future__ import annotations

import asyncio
import os
import time

from coldbrew import App, Context

app = App()


@app.job(max_attempts=10, timeout=60)
async def work(ctx: Context, seconds: float) -> dict[str, int]:
    """A coroutine job: logs its start, sleeps, then performs its effect exactly once."""
    async with ctx.once_in_transaction(f"start-{ctx.attempt}") as conn:
        if conn is not None:
            await conn.execute(
                "INSERT INTO fault_attempts (job_id, attempt, pid) VALUES ($1, $2, $3)",
                ctx.job_id,
                ctx.attempt,
                os.getpid(),
            )
    await asyncio.sleep(seconds)
    async with ctx.once_in_transaction("effect") as conn:
        if conn is not None:
            await conn.execute(
                "INSERT INTO fault_effects (job_id, attempt) VALUES ($1, $2)",
                ctx.job_id,
                ctx.attempt,
            )
    return {"attempt": ctx.attempt}


@app.job(queue="slow", max_attempts=10, timeout=60)
def crunch(ctx: Context, seconds: float) -> dict[str, int]:
    """A process-pool job whose at-most-once effect is a file named after the job."""
    time.sleep(seconds)
    if ctx.once("effect"):
        effects = os.environ["FAULT_EFFECTS_DIR"]
        with open(os.path.join(effects, f"{ctx.job_id}.{ctx.attempt}"), "w") as handle:
            handle.write(str(os.getpid()))
    return {"attempt": ctx.attempt}
