"""Pausing a lane fleet-wide (``coldbrew lanes pause``): its jobs wait unclaimed on every
worker, for every tenant, while other lanes run; resumed, they run once."""

from __future__ import annotations

import asyncio

import pytest

from coldbrew.client import Client
from coldbrew.settings import Settings
from coldbrew.topology import Topology
from tests.helpers import WorkerFactory, metric, status_is, wait_until
from tests.integration.test_cron import cli


def said(out: str) -> list[str]:
    """The CLI's line among captured stdout: the in-process worker's console log lines
    (``... [info ] paused_lanes ...``) land in the same capture when they race it."""
    lines = [line.split() for line in out.splitlines() if "[info" not in line and line.strip()]
    return lines[-1] if lines else []


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
    assert (code, said(out)) == (0, ["slow", "paused"])
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
    assert (code, said(out)) == (0, ["slow", "active"])
    for job in (held, other):
        final = await client.wait(job.id, timeout=30)
        assert (final.status, final.attempt) == ("succeeded", 1)
    code, _, err = await cli(capsys, settings, "lanes", "pause", "no such lane")
    assert code == 2 and "lane name 'no such lane' must match" in err


async def test_start_latency_counts_from_when_the_job_became_due(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """A job held 1.5 s by its paused lane is observed in coldbrew_job_start_latency_seconds
    with at least that wait (from its creation), a job that starts at once with less."""
    worker = await start_worker()
    channel = Topology(settings.namespace).tenant_channel
    await client.store.tenants.set_lane_paused("slow", True, channel=channel)
    held = await client.submit("cpu_sleep", {"seconds": 0.0})
    quick = await client.submit("echo", {"value": 1})
    assert (await client.wait(quick.id, timeout=20)).status == "succeeded"
    await asyncio.sleep(1.5)  # the wait being measured, not a wait for a condition
    await client.store.tenants.set_lane_paused("slow", False, channel=channel)
    assert (await client.wait(held.id, timeout=30)).status == "succeeded"
    name = "coldbrew_job_start_latency_seconds"
    assert metric(worker, f"{name}_count", queue="slow", type="cpu_sleep") == 1
    waited = metric(worker, f"{name}_sum", queue="slow", type="cpu_sleep")
    assert waited >= 1.5
    assert metric(worker, f"{name}_count", queue="default", type="echo") == 1
    assert metric(worker, f"{name}_sum", queue="default", type="echo") < waited
