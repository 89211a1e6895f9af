"""The series the alerts need that a worker did not export before issue #17: ready,
database and broker reachability, slots, and each cron schedule's next undecided tick."""

from __future__ import annotations

import time

from coldbrew.app import load_app
from coldbrew.settings import Settings
from coldbrew.worker import Worker
from tests.helpers import WorkerFactory, metric, wait_until

SCHEDULE = "every-second"


async def test_worker_state_slots_and_cron_next_tick(
    start_worker: WorkerFactory, settings: Settings
) -> None:
    """One worker (starting one costs seconds): its state series, then the cron series."""
    worker = await start_worker(load_app("tests.cron_apps:app"), concurrency=7)
    assert metric(worker, "coldbrew_worker_ready") == 1.0
    assert metric(worker, "coldbrew_database_up") == 1.0
    assert metric(worker, "coldbrew_broker_up") == 1.0
    assert metric(worker, "coldbrew_worker_slots") == 7.0
    worker.lifecycle.set_database_ok(False)  # what the health loop records when a probe fails
    assert metric(worker, "coldbrew_database_up") == 0.0
    assert metric(worker, "coldbrew_worker_ready") == 0.0, "readiness follows the database"
    worker.lifecycle.set_database_ok(True)
    assert metric(worker, "coldbrew_worker_ready") == 1.0
    await _check_cron_next_tick(worker)
    worker.stop()
    await wait_until(lambda: _not_ready(worker), timeout=30)


async def _not_ready(worker: object) -> bool:
    return metric(worker, "coldbrew_worker_ready") == 0.0


async def _check_cron_next_tick(worker: Worker) -> None:
    """Just ahead of the clock while the schedule fires; dropped while it is paused."""
    await wait_until(lambda: _next_tick_set(worker), timeout=10)
    for _ in range(3):  # the loop keeps it just ahead of the clock: never overdue
        next_tick = metric(worker, "coldbrew_cron_next_tick_timestamp_seconds", schedule=SCHEDULE)
        assert time.time() - 1.5 < next_tick <= time.time() + 1.5
        await wait_until(lambda t=next_tick: _moved_past(worker, t), timeout=5)
    await worker.parts.store.cron.set_paused(SCHEDULE, True)
    await wait_until(lambda: _dropped(worker), timeout=10)


async def _next_tick_set(worker: object) -> bool:
    return (
        worker.metrics.registry.get_sample_value(  # type: ignore[attr-defined, no-any-return]
            "coldbrew_cron_next_tick_timestamp_seconds", {"schedule": SCHEDULE}
        )
        is not None
    )


async def _moved_past(worker: object, tick: float) -> bool:
    return metric(worker, "coldbrew_cron_next_tick_timestamp_seconds", schedule=SCHEDULE) > tick


async def _dropped(worker: object) -> bool:
    return not await _next_tick_set(worker)
