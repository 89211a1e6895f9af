"""The cron service: enqueue each schedule's ticks once across the fleet, on PostgreSQL's clock.

Every worker that declares a schedule runs this loop; none is a leader. Each
look reads the declared schedules' watermarks together with ``now()``, asks
``crontab.plan`` what is due (on time, or missed and handled by the
``catch_up`` policy), and fires the ticks in one transaction: a
compare-and-swap on the watermark plus the jobs' inserts (store/cron.py). Of
several workers looking at once, one wins the swap and the others find the
watermark moved and do nothing; should two ever insert the same tick anyway
(they cannot, but the id is the backstop), the job id -- derived from the
schedule and the tick -- is the primary key, so it stays one job.

Why no leader lease: a lease adds a failover delay (the lease's length) to
every deploy and crash, exactly the moments users report ticks missed; the
swap costs one small read per second per worker and decides instantly.

The loop sleeps until the earliest next tick, at most
``COLDBREW_CRON_POLL_SECONDS``, so a tick is enqueued within milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from datetime import datetime

import structlog

from coldbrew import tracing
from coldbrew.app import App
from coldbrew.client import Client
from coldbrew.crontab import CronSpec, Plan, plan, tick_job_id
from coldbrew.errors import ConfigurationError, InvalidArguments
from coldbrew.metrics import Metrics
from coldbrew.settings import Settings
from coldbrew.store import ClaimRequest, CronDefinition, JobStore, Watermark
from coldbrew.worker.service import UNAVAILABLE, Backoff, sleep_unless

log = structlog.get_logger("coldbrew.cron")

SEEN_SECONDS = 30.0
"""How often a worker tells the table it still declares its schedules."""
ORPHAN_SECONDS = 4 * SEEN_SECONDS
"""A schedule no live worker declared for this long is shown as orphaned."""


def declared_schedules(app: App, settings: Settings) -> dict[str, CronSpec]:
    """The app's ``@app.cron`` schedules and ``COLDBREW_CRON``'s, checked against the app."""
    schedules = dict(app.schedules)
    for spec in settings.cron_schedules:
        if spec.name in schedules:
            raise ConfigurationError(
                f"COLDBREW_CRON: schedule {spec.name!r} is also declared with @app.cron"
            )
        if spec.type not in app.jobs:
            raise ConfigurationError(
                f"COLDBREW_CRON: schedule {spec.name!r}: job type {spec.type!r} is not "
                "registered on this worker's app"
            )
        try:
            app.jobs[spec.type].validate_args(spec.args)
        except InvalidArguments as exc:
            raise ConfigurationError(
                f"COLDBREW_CRON: schedule {spec.name!r}: args do not fit the job: {exc}"
            ) from None
        schedules[spec.name] = spec
    return schedules


class CronService:
    """Fires the ticks of this worker's declared schedules (see the module docstring)."""

    name = "cron"

    def __init__(
        self,
        *,
        app: App,
        settings: Settings,
        store: JobStore,
        client: Client,
        metrics: Metrics,
        schedules: Mapping[str, CronSpec],
    ) -> None:
        self.app = app
        self.settings = settings
        self.store = store
        self.client = client
        self.metrics = metrics
        self.schedules = dict(schedules)
        self._seen_at = 0.0
        self._foreign: set[str] = set()  # schedules redefined by another deploy (logged once)

    async def declare(self) -> None:
        """Upsert every declared schedule (at start-up, before the first look)."""
        for spec in self.schedules.values():
            await self._declare_one(spec)
        self._seen_at = time.monotonic()

    async def _declare_one(self, spec: CronSpec) -> None:
        job = self.app.get(spec.type)
        declared = await self.store.cron.declare(
            CronDefinition(
                spec.name,
                spec.expression,
                spec.tz,
                spec.type,
                dict(spec.args),
                job.queue,
                spec.tenant,
                spec.priority,
                job.max_attempts or self.settings.max_attempts,
                job.timeout,
                spec.catch_up,
                spec.max_catch_up,
            )
        )
        if declared.created or declared.edited:
            log.info(
                "cron_schedule_declared",
                schedule=spec.name,
                expression=spec.expression,
                tz=spec.tz,
                edited=declared.edited,
                next_tick=spec.next_tick(declared.row.last_tick).isoformat(),
            )

    async def run(self, stop: asyncio.Event) -> None:
        backoff = Backoff(first=0.2, cap=5.0)
        declared = False
        while not stop.is_set():
            try:
                if not declared:
                    await self.declare()
                    declared = True
                delay = await self.look()
            except UNAVAILABLE as exc:
                delay = backoff.next_delay()
                log.warning("cron_look_failed", error=str(exc), retry_in=delay)
                await sleep_unless(stop, delay)
                continue
            backoff.reset()
            await sleep_unless(stop, delay)

    async def look(self) -> float:
        """Fire what is due now; return how long to sleep (until the next tick, capped)."""
        names = list(self.schedules)
        marks = await self.store.cron.watermarks(names)
        for name in set(names) - {mark.name for mark in marks}:  # a row deleted by hand
            await self._declare_one(self.schedules[name])
        if time.monotonic() - self._seen_at >= SEEN_SECONDS:
            await self.store.cron.seen(names)
            self._seen_at = time.monotonic()
        delay = self.settings.cron_poll_seconds
        for mark in marks:
            spec = self.schedules[mark.name]
            if mark.paused or not self._ours(spec, mark):
                self._forget_next_tick(spec.name)  # a paused schedule misses nothing
                continue
            decided = plan(spec, mark.last_tick, mark.now, self.settings.cron_grace_seconds)
            if decided is not None:
                await self._fire(spec, mark, decided)
                mark_after = decided.watermark
            else:
                mark_after = mark.last_tick
            next_tick = spec.next_tick(mark_after)
            self.metrics.cron_next_tick.labels(schedule=spec.name).set(next_tick.timestamp())
            until_next = (spec.next_tick(max(mark_after, mark.now)) - mark.now).total_seconds()
            delay = min(delay, until_next + 0.005)  # just past the tick on the server's clock
        return max(delay, 0.005)

    def _forget_next_tick(self, schedule: str) -> None:
        """Drop the schedule's next-tick series: no tick of it is due from this worker."""
        with contextlib.suppress(KeyError):  # never set, or already dropped
            self.metrics.cron_next_tick.remove(schedule)

    def _ours(self, spec: CronSpec, mark: Watermark) -> bool:
        """Whether the row still holds this worker's definition (a newer deploy may have
        changed it; then that deploy's workers fire it, not this one)."""
        ours = (mark.expression, mark.tz) == (spec.expression, spec.tz)
        if not ours and spec.name not in self._foreign:
            self._foreign.add(spec.name)
            log.warning(
                "cron_schedule_redefined_elsewhere",
                schedule=spec.name,
                ours=spec.expression,
                table=mark.expression,
                tz=mark.tz,
            )
        elif ours:
            self._foreign.discard(spec.name)
        return ours

    async def _fire(self, spec: CronSpec, mark: Watermark, decided: Plan) -> None:
        """One transaction: the watermark's swap and the jobs; then publish and count."""
        requests = [self._request(spec, tick) for tick, _ in decided.fire]
        # a tick's jobs start a trace of their own, rooted in this span (tracing.py)
        with tracing.span("coldbrew cron", {"coldbrew.cron.schedule": spec.name}):
            tracing.stamp(requests)
            inserted = await self.store.cron.fire(
                mark, decided.watermark, requests, relay_grace=self.settings.relay_grace_seconds
            )
            if inserted is None:  # another worker decided these ticks first
                return
            self._count(spec, decided)
            await self._publish(inserted)

    def _request(self, spec: CronSpec, tick: datetime) -> ClaimRequest:
        return self.client.prepare(
            spec.type,
            spec.args,
            job_id=tick_job_id(spec.name, tick),
            tenant=spec.tenant,
            priority=spec.priority,
        )

    async def _publish(self, inserted: Sequence[tuple[ClaimRequest, datetime]]) -> None:
        for request, publish_mark in inserted:
            try:
                await self.client.publish(request, publish_mark)
            except UNAVAILABLE as exc:  # the row is committed: the relay publishes it
                log.warning("cron_publish_deferred_to_relay", job_id=request.id, error=str(exc))

    def _count(self, spec: CronSpec, decided: Plan) -> None:
        ticks = self.metrics.cron_ticks
        fired = len(decided.fire) - decided.caught_up
        ticks.labels(schedule=spec.name, outcome="fired").inc(fired)
        ticks.labels(schedule=spec.name, outcome="caught_up").inc(decided.caught_up)
        ticks.labels(schedule=spec.name, outcome="skipped").inc(decided.skipped)
        self.metrics.cron_last_tick.labels(schedule=spec.name).set(decided.watermark.timestamp())
        if decided.missed:
            log.warning(
                "cron_ticks_missed",
                schedule=spec.name,
                catch_up=spec.catch_up,
                missed=f"{decided.missed}+" if decided.skipped_more else decided.missed,
                caught_up=decided.caught_up,
                skipped=f"{decided.skipped}+" if decided.skipped_more else decided.skipped,
                on_time=fired,
                latest_tick=decided.watermark.isoformat(),
            )
        for tick, outcome in decided.fire:
            log.info("cron_tick", schedule=spec.name, tick=tick.isoformat(), outcome=outcome)
