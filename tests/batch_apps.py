"""Jobs for the batch tests: members, a member that adds members, and recording callbacks.

Callbacks record each call in ``batch_calls`` (created by ``create_calls_table``) under
their once-guard, so a row is a callback that ran to its effect, at most once per job.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg

from coldbrew import App, Context, Permanent, Retry

app = App()

CALLS_TABLE = (
    "CREATE TABLE batch_calls (job_id text, event text, batch jsonb, attempt int,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())"
)


async def create_calls_table(conn: asyncpg.Connection) -> None:
    await conn.execute(CALLS_TABLE)


@app.job(max_attempts=3)
async def member(ctx: Context, n: int, seconds: float = 0.0) -> dict[str, int]:
    """A member that takes ``seconds`` and returns its number squared."""
    if seconds:
        await asyncio.sleep(seconds)
    return {"n": n, "square": n * n}


@app.job(max_attempts=1)
async def crash(ctx: Context) -> None:
    """A member that dies: its only attempt raises a retryable error."""
    raise RuntimeError("boom")


@app.job()
async def reject(ctx: Context) -> None:
    """A member that fails permanently."""
    raise Permanent("bad input")


@app.job(max_attempts=3)
async def spawner(ctx: Context, children: int) -> str:
    """Adds ``children`` members to its batch, then fails its first attempt (the retry adds
    the same names again: nothing twice)."""
    for i in range(children):
        await ctx.batch.add("member", {"n": 100 + i}, name=f"child-{i}")
    if ctx.attempt == 1:
        raise Retry(delay=0.05)
    return ctx.job_id


@app.job(max_attempts=5, timeout=60)
async def record(ctx: Context, batch: dict[str, Any], tag: str = "") -> dict[str, Any]:
    """A callback: records the call (once per job) and returns what it was given."""
    async with ctx.once_in_transaction("record") as conn:
        if conn is not None:
            await conn.execute(
                "INSERT INTO batch_calls (job_id, event, batch, attempt) VALUES ($1, $2, $3, $4)",
                ctx.job_id,
                batch["event"],
                batch,
                ctx.attempt,
            )
    return {"tag": tag, "event": batch["event"], "at": time.time()}


@app.job(max_attempts=5)
async def total(ctx: Context, batch: dict[str, Any]) -> int:
    """A group's fan-in: sums the members' squares."""
    return sum(result["square"] for result in batch["results"].values())


@app.job(max_attempts=3, timeout=60)
def pool_spawner(ctx: Context, children: int) -> int:
    """A process-pool member that adds members (relayed to the parent's ``Context``)."""
    for i in range(children):
        ctx.batch.add("member", {"n": 200 + i}, name=f"pool-child-{i}")
    return children
