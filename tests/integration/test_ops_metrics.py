"""The series the alerts need that a worker did not export before issue #17: ready,
database and broker reachability, slots, and each cron schedule's next undecided tick."""

from __future__ import annotations

import time

from coldbrew.app import load_app
from coldbrew.settings import Settings
from tests.helpers import WorkerFactory, metric, wait_until

SCHEDULE = "every-second"


async def test_a_ready_worker_exports_its_state_and_slots(
    start_worker: WorkerFactory, settings: Settings
) -> None:
    worker = await start_worker(concurrency=7)
    assert metric(worker, "coldbrew_worker_ready") == 1.0
    assert metric(worker, "coldbrew_database_up") == 1.0
    assert metric(worker, "coldbrew_broker_up") == 1.0
    assert metric(worker, "coldbrew_worker_slots") == 7.0
    worker.lifecycle.set_database_ok(False)  # what the health loop records when a probe fails
    assert metric(worker, "coldbrew_database_up") == 0.0
    assert metric(worker, "coldbrew_worker_ready") == 0.0, "readiness follows the database"
    worker.lifecycle.set_database_ok(True)
    worker.stop()
    await wait_until(lambda: _not_ready(worker), timeout=30)


async def _not_ready(worker: object) -> bool:
    return metric(worker, "coldbrew_worker_ready") == 0.0


async def test_cron_next_tick_is_ahead_while_firing_and_dropped_while_paused(
    start_worker: WorkerFactory, settings: Settings
) -> None:
    worker = await start_worker(load_app("tests.cron_apps:app"))
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
