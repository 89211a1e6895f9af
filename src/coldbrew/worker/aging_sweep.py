"""The worker's aging sweeps: look past a starving queue's head (policy in ``aging.py``)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

import structlog

from coldbrew.aging import QueueKey, StarvationWatch
from coldbrew.metrics import Metrics
from coldbrew.topology import Topology
from coldbrew.transport import Broker, Inbound
from coldbrew.worker.lifecycle import Lifecycle
from coldbrew.worker.service import Periodic

log = structlog.get_logger("coldbrew.sweeper")

RETURNED_MEMORY = 10_000

Accept = Callable[[Inbound, float], None]
OnSweep = Callable[[str, str, int], Awaitable[None]]
"""Told (lane, tenant, how many it may take) as a sweep begins (reconcile.py records it)."""


class SweepReturns:
    """Ids of messages a sweep here handed back, so that their redelivery here is
    counted as the sweep's, not as a broker redelivery (bounded, oldest dropped)."""

    def __init__(self) -> None:
        self._returned: dict[str, None] = {}

    def returned_here(self, message_id: str | None) -> bool:
        """Whether a redelivered message is one a sweep here handed back (forgets it)."""
        if message_id is None or message_id not in self._returned:
            return False
        del self._returned[message_id]
        return True

    def remember(self, messages: list[Inbound]) -> None:
        for message in messages:
            if message.message_id is not None:
                self._returned[message.message_id] = None
        excess = len(self._returned) - RETURNED_MEMORY
        if excess > 0:
            for key in list(itertools.islice(self._returned, excess)):
                del self._returned[key]


class QueueSweeper:
    """Sweeps the queues ``watch`` finds due; kept messages go to ``accept``.

    ``accept(message, arrived)`` takes a kept delivery with the monotonic
    instant it counts as having arrived (the scheduler ages it from there).
    """

    name = "aging-sweep"

    def __init__(
        self,
        *,
        watch: StarvationWatch,
        broker: Broker,
        topology: Topology,
        metrics: Metrics,
        accept: Accept,
        returns: SweepReturns,
        lifecycle: Lifecycle,
        limit: int,
        keep_max: int,
        aging_seconds: float,
        on_sweep: OnSweep | None = None,
    ) -> None:
        self.watch = watch
        self.broker = broker
        self.topology = topology
        self.metrics = metrics
        self.accept = accept
        self.returns = returns
        self.lifecycle = lifecycle
        self.limit = limit
        self.keep_max = keep_max
        self.aging_seconds = aging_seconds
        self.on_sweep = on_sweep

    async def run(self, stop: asyncio.Event) -> None:
        # full_batch: never again at once, the due queues were all swept
        window = self.watch.window
        loop = Periodic(self.name, self.sweep_due, interval=window / 4, full_batch=1 << 30)
        await loop.run(stop)

    async def sweep_due(self) -> int:
        """Sweep every queue that is due now; the number swept (``run_periodically`` step)."""
        if self.limit == 0:
            return 0
        due = self.watch.due(time.monotonic())
        for key in due:
            if self.lifecycle.draining:
                break
            await self._sweep(key)  # BrokerUnavailable: Periodic waits the outage out
        return len(due)

    async def _sweep(self, key: QueueKey) -> None:
        started = time.monotonic()
        lane, tenant = key
        on_start = None
        if self.on_sweep is not None:
            on_sweep = self.on_sweep

            async def on_start(taking: int) -> None:
                await on_sweep(lane, tenant, taking)

        sweep = await self.broker.sweep_queue(
            self.topology.job_queue(lane, tenant), limit=self.limit, on_start=on_start
        )
        now = time.monotonic()
        plan = self.watch.plan(
            key,
            [m.priority for m in sweep.messages],
            now=now,
            keep_max=self.keep_max,
            drained=sweep.drained,
            oldest=now - self.aging_seconds,
        )
        self.watch.swept(key, started, plan.cleared)
        if self.lifecycle.draining:
            await self.broker.requeue(sweep.messages)
            return
        for index, arrived in sorted(plan.keep.items()):
            self.accept(sweep.messages[index], arrived)
        back = [m for i, m in enumerate(sweep.messages) if i not in plan.keep]
        self.returns.remember(back)
        await self.broker.requeue(back)
        result = "kept" if plan.keep else ("empty" if not sweep.messages else "none_held_back")
        self.metrics.aging_sweeps.labels(result).inc()
        self.metrics.aging_swept.labels("kept").inc(len(plan.keep))
        self.metrics.aging_swept.labels("returned").inc(len(back))
        (log.info if plan.keep else log.debug)(
            "aging_sweep",
            queue=lane,
            tenant=tenant,
            ready=sweep.ready,
            taken=len(sweep.messages),
            kept=len(plan.keep),
            returned=len(back),
            seconds=round(time.monotonic() - started, 3),
        )
