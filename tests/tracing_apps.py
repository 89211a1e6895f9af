"""Jobs for tests/integration/test_tracing.py: each reports the trace_id its log lines carry
(structlog's context vars, which every line of the job merges in)."""

from __future__ import annotations

import structlog

from coldbrew import App, Context, Retry

app = App()


def _trace_id() -> object:
    return structlog.contextvars.get_contextvars().get("trace_id")


@app.job()
async def traced(ctx: Context) -> dict[str, object]:
    ctx.log.debug("traced_job_ran")
    return {"trace_id": _trace_id()}


@app.job(max_attempts=3)
async def fails_once(ctx: Context) -> dict[str, object]:
    """Fails its first attempt (retried after 50 ms), then succeeds."""
    if ctx.attempt == 1:
        raise Retry("first attempt fails", delay=0.05)
    return {"attempt": ctx.attempt, "trace_id": _trace_id()}


@app.job(queue="slow")
def pooled(ctx: Context, n: int) -> int:
    return n * n


@app.job(queue="slow")
def pooled_traced(ctx: Context) -> dict[str, object]:
    """A process-pool job: the trace_id its log lines carry in the child."""
    ctx.log.debug("pooled_traced_job_ran")
    return {"trace_id": _trace_id()}


@app.job(queue="slow")
def pooled_spawns(ctx: Context) -> str:
    """A process-pool job that spawns a child (relayed to the worker)."""
    return ctx.submit("traced", name="child")


@app.job()
async def spawns(ctx: Context) -> str:
    """Spawns one child: its row carries this run span as its parent."""
    return await ctx.submit("traced", name="child")


@app.job()
async def adds(ctx: Context) -> str:
    """A batch member that adds one more member to its batch (``ctx.batch.add``)."""
    return await ctx.batch.add("traced", {}, name="more")


cron_app = App()
"""A schedule of its own (every second), for the cron test alone."""


@cron_app.cron("* * * * * *", name="traced-tick")
@cron_app.job()
async def ticked(ctx: Context) -> dict[str, object]:
    return {"trace_id": _trace_id()}
