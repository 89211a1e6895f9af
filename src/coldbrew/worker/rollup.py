"""The rollup service: folds finished minutes into the per-minute rollup `stats --since` reads.

Off the hot path on purpose: a trigger or an extra statement per finished job
would cost every completion; folding a minute once, in one statement, costs
the fleet one short transaction per interval. Every worker runs the service;
the namespace's rollup lock lets one of them fold at a time (the others find
it held and wait for the next interval), and the fold's frontier is stored,
so a worker that stops mid-way loses nothing: the next step starts where the
last committed one ended. A step that leaves minutes due (a first fold over
the kept history, or one after an outage) runs again at once, an hour of
minutes per step. Which minutes are due, and why a folded minute never
changes, is ``RollupStore.fold_step``'s docstring.
"""

from __future__ import annotations

import asyncio

import structlog

from coldbrew.store import JobStore
from coldbrew.worker.service import Periodic

log = structlog.get_logger("coldbrew.rollup")

MAX_WAIT_SECONDS = 300.0
"""An open transaction holds the fold back at most this long (then its minute is folded;
a finishing write it commits later is not counted)."""


class RollupService:
    """Runs ``fold_step`` every ``interval`` seconds, at once again while minutes are due."""

    name = "rollup"

    def __init__(
        self,
        store: JobStore,
        *,
        interval: float,
        settle: float,
        max_wait: float = MAX_WAIT_SECONDS,
    ) -> None:
        self.store = store
        self.settle = settle
        self.max_wait = max_wait
        self._loop = Periodic(self.name, self.step, interval=interval, full_batch=1)

    async def step(self) -> int:
        """One fold step; 1 when more minutes are due at once (a full batch), else 0."""
        done = await self.store.rollup.fold_step(self.settle, self.max_wait)
        if done.start is not None and done.more:
            log.info("rollup_catching_up", folded_to=str(done.end), rows=done.rows)
        return 1 if done.more else 0

    async def run(self, stop: asyncio.Event) -> None:
        await self._loop.run(stop)
