"""Pausing a lane fleet-wide (``coldbrew lanes pause``): its jobs wait unclaimed on every
worker, for every tenant, while other lanes run; resumed, they run once."""

from __future__ import annotations

import pytest

from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.helpers import WorkerFactory, status_is, wait_until
from tests.integration.test_cron import cli


async def test_a_paused_lane_holds_its_jobs_and_others_run(
    start_worker: WorkerFactory,
    client: Client,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Given lane slow paused before one job arrives and while another waits, a job of the
    default lane runs and the slow ones stay queued; resumed, each runs once."""
    await start_worker()
    code, out, _ = await cli(capsys, settings, "lanes", "pause", "slow")
    assert (code, out.split()) == (0, ["slow", "paused"])
    held = await client.submit("cpu_sleep", {"seconds": 0.0}, tenant="acme")
    other = await client.submit("cpu_sleep", {"seconds": 0.0}, tenant="globex")
    free = await client.submit("echo", {"value": 1}, tenant="acme")
    assert (await client.wait(free.id, timeout=20)).status == "succeeded"
    await wait_until(lambda: status_is(client, held.id, "queued"), timeout=5)
    code, out, _ = await cli(capsys, settings, "lanes", "list")
    assert "slow" in out and "paused" in out
    assert (await client.get(held.id)).status == "queued"
    assert (await client.get(other.id)).status == "queued"
    code, out, _ = await cli(capsys, settings, "lanes", "resume", "slow")
    assert (code, out.split()) == (0, ["slow", "active"])
    for job in (held, other):
        final = await client.wait(job.id, timeout=30)
        assert (final.status, final.attempt) == ("succeeded", 1)
    code, _, err = await cli(capsys, settings, "lanes", "pause", "no such lane")
    assert code == 2 and "lane name 'no such lane' must match" in err
