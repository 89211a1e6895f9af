"""The heartbeat: progress flushed every tick, every lease extended every beat.

One UPDATE extends every lease this worker holds (``JobStore.extend_leases``),
and after a failed one it is tried again at every tick, before anything else,
so a worker that reconnects after an outage renews its leases within a tick
(the reaper holds off for a lease meanwhile: reaper.py). Its answer is also
how a worker learns that a job's lease was lost (the reaper or another worker
took it: the job is fenced and stopped) or that a cancel was requested (the
job is stopped, its ``on_cancel`` hook runs).
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
        behind = False  # the last extension failed: try again at every tick until one lands
        failed_since: float | None = None
        while not stop.is_set():
            await sleep_unless(stop, self.tick)
            try:
                now = loop.time()
                if behind or now >= next_beat:
                    if not behind:
                        self.metrics.heartbeat_lag.set(now - next_beat)
                    next_beat = now + self.beat
                    # leases first: after an outage they may have expired, and the reaper
                    # gives a worker that reconnects one lease to renew them (reaper.py)
                    behind = True
                    renewed = await self._extend_leases()
                    if failed_since is not None:
                        log.info(
                            "leases_renewed_after_outage",
                            jobs=renewed,
                            seconds=round(now - failed_since, 1),
                        )
                    behind, failed_since = False, None
                await self._flush_progress()
            except DatabaseUnavailable as exc:
                self.lifecycle.set_database_ok(False)
                if behind and failed_since is None:
                    failed_since = loop.time()
                log.warning("heartbeat_failed", error=str(exc))

    async def _flush_progress(self) -> None:
        updates = self.inflight.take_progress()
        if not updates:
            return
        try:
            await self.store.leases.write_progress(updates)
        except UnstorableData as exc:  # a job's report, never the worker's: drop it, say so
            log.warning("progress_refused", jobs=[u[0] for u in updates], error=str(exc))

    async def _extend_leases(self) -> int:
        """Extend every lease held; return how many this worker still holds."""
        held = self.inflight.held()
        if not held:
            return 0
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
        return len(alive)
