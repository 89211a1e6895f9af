"""Cron across three worker processes: kill -9 the one that fired last, just after a tick.

The killed worker may die holding the firing transaction open (PostgreSQL
rolls it back) or just after committing it (the job exists, the relay or the
direct publish already sent it); either way every tick from the first to the
last has exactly one job, and the survivors keep firing without a pause.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from coldbrew.settings import Settings
from tests.e2e.test_cli import get
from tests.faults.harness import Fleet, WorkerProcess
from tests.integration.test_cron import assert_every_tick_once, tick_jobs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LAST_TICK = re.compile(
    r'^coldbrew_cron_last_tick_timestamp_seconds\{schedule="every-second"\} (\S+)$', re.M
)


@pytest.fixture
async def fleet(settings: Settings, tmp_path: Path) -> AsyncIterator[Fleet]:
    (tmp_path / "effects").mkdir()
    (tmp_path / "logs").mkdir()
    running = Fleet(settings, tmp_path / "effects", tmp_path / "logs", app="tests.cron_apps:app")
    try:
        yield running
    finally:
        running.stop_all()


async def last_tick_of(worker: WorkerProcess) -> float:
    """The latest tick this worker decided (0 if none), from its /metrics."""
    answer = await get(worker.port, "/metrics")
    if answer is None:
        return 0.0
    match = LAST_TICK.search(answer[1])
    return float(match.group(1)) if match else 0.0


async def test_kill_9_of_the_worker_that_fired_last_loses_and_doubles_no_tick(
    fleet: Fleet, settings: Settings
) -> None:
    await fleet.start(3)
    await asyncio.sleep(2.0)
    await asyncio.sleep(1 - time.time() % 1 + 0.008)  # as the tick is being fired
    marks = {worker.pid: await last_tick_of(worker) for worker in fleet.workers}
    victim = max(fleet.workers, key=lambda w: marks[w.pid])
    assert marks[victim.pid] > 0, "no worker reported a fired tick"
    fleet.kill(victim, signal.SIGKILL)
    await asyncio.sleep(1.5)
    await fleet.wait_ready(fleet.start_one())
    await asyncio.sleep(1.5)
    fleet.stop_all()
    ticks = [tick for tick, _, _ in await tick_jobs(settings.namespace, "every-second")]
    assert len(ticks) >= 6
    assert_every_tick_once(ticks)
