"""The heartbeat: progress flushed every tick, every lease extended every beat.

One UPDATE extends every lease this worker holds (``JobStore.extend_leases``),
and its answer is also how a worker learns that a job's lease was lost (the
reaper or another worker took it: the job is fenced and stopped) or that a
cancel was requested (the job is stopped, its ``on_cancel`` hook runs).
Progress reported by jobs is flushed every ``COLDBREW_PROGRESS_FLUSH_SECONDS``
in one statement, never per report.
"""

from __future__ import annotations

import asyncio

import structlog

from coldbrew.errors import DatabaseUnavailable, UnstorableData
from coldbrew.jobstate import InFlight, Stop
from coldbrew.metrics import Metrics
from coldbrew.settings import Settings
from coldbrew.store import JobStore
from coldbrew.worker.lifecycle import Lifecycle
from coldbrew.worker.runner import JobRunner
from coldbrew.worker.service import sleep_unless

log = structlog.get_logger("coldbrew.worker")


class Heartbeat:
    """Extends the leases of the jobs in flight; stops those whose lease is lost."""

    name = "heartbeat"

    def __init__(
        self,
        *,
        settings: Settings,
        store: JobStore,
        inflight: InFlight,
        runner: JobRunner,
        metrics: Metrics,
        lifecycle: Lifecycle,
    ) -> None:
        self.store = store
        self.inflight = inflight
        self.runner = runner
        self.metrics = metrics
        self.lifecycle = lifecycle
        self.beat = settings.heartbeat_seconds
        self.lease_seconds = settings.lease_seconds
        self.tick = min(settings.progress_flush_seconds, settings.heartbeat_seconds)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self.beat
        while not stop.is_set():
            await sleep_unless(stop, self.tick)
            try:
                await self._flush_progress()
                now = loop.time()
                if now >= next_beat:
                    self.metrics.heartbeat_lag.set(now - next_beat)
                    next_beat = now + self.beat
                    await self._extend_leases()
            except DatabaseUnavailable as exc:
                self.lifecycle.set_database_ok(False)
                log.warning("heartbeat_failed", error=str(exc))

    async def _flush_progress(self) -> None:
        updates = self.inflight.take_progress()
        if not updates:
            return
        try:
            await self.store.leases.write_progress(updates)
        except UnstorableData as exc:  # a job's report, never the worker's: drop it, say so
            log.warning("progress_refused", jobs=[u[0] for u in updates], error=str(exc))

    async def _extend_leases(self) -> None:
        held = self.inflight.held()
        if not held:
            return
        alive = await self.store.leases.extend_leases(held, self.lease_seconds)
        self.metrics.lease_extensions.inc(len(alive))
        for job_id, attempt in held:
            state = self.inflight.get(job_id)
            if state is None or state.attempt != attempt:
                continue  # finished while the heartbeat was in flight
            if job_id not in alive:
                self.metrics.leases_lost.inc()
                log.warning("lease_lost", job_id=job_id, attempt=attempt)
                self.runner.stop(state, Stop.FENCED)
            elif (reason := alive[job_id]) is not None:
                log.info("job_cancel_requested", job_id=job_id, reason=reason)
                self.runner.stop(state, Stop.CANCELLED, reason)
