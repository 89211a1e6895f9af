"""Job types of the scheduled-jobs and snooze tests (tests/integration/test_scheduled.py)."""

from __future__ import annotations

from typing import Any

from coldbrew import App, Context, Snooze

app = App()
pool_app = App()
"""The process-pool job, apart: a worker of ``app`` then needs no pool (faster to start)."""

SNOOZE_SECONDS = 0.3


@app.job()
async def noop(ctx: Context) -> None:
    """Does nothing: when it starts is what the tests look at."""


@app.job(max_attempts=1)
async def snooze_twice(ctx: Context) -> dict[str, int]:
    """Snoozes on its first two runs (raising, then returning a Snooze), then succeeds; with
    one attempt allowed, it succeeds only if a snooze spends none."""
    if ctx.snoozes == 0:
        raise Snooze(SNOOZE_SECONDS)
    if ctx.snoozes == 1:
        return Snooze(SNOOZE_SECONDS)  # type: ignore[return-value]
    return {"attempt": ctx.attempt, "snoozes": ctx.snoozes}


@pool_app.job(max_attempts=1)
def snooze_twice_in_pool(ctx: Any) -> dict[str, int]:
    """``snooze_twice`` in the process pool: the Snooze crosses the child's pipe."""
    if ctx.snoozes == 0:
        raise Snooze(SNOOZE_SECONDS)
    if ctx.snoozes == 1:
        return Snooze(SNOOZE_SECONDS)  # type: ignore[return-value]
    return {"attempt": ctx.attempt, "snoozes": ctx.snoozes}


@app.job(max_attempts=1, max_wall_seconds=1.0)
async def snooze_forever(ctx: Context) -> None:
    """Snoozes every time: max_wall_seconds must end it."""
    raise Snooze(SNOOZE_SECONDS)
