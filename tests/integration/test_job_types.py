"""Routing without the app: workers register their app's job types, submitters follow them;
and a finished job's record tells the truth about its progress."""

from __future__ import annotations

import pytest
import structlog

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.model import Status
from coldbrew.settings import Settings
from tests.helpers import WorkerFactory, wait_until


@pytest.fixture
def cliux_app() -> object:
    return load_app("tests.cliux_apps:app")


async def test_client_without_app_routes_by_registration(
    settings: Settings, start_worker: WorkerFactory, cliux_app: object
) -> None:
    """A worker registers `resize` on lane slow; a client without the app submits it: the
    job is routed to slow with the registered max_attempts and runs there."""
    await start_worker(cliux_app)
    async with Client.connect(settings) as client:  # no app
        registered = await client.registered_type("resize")
        assert registered is not None
        assert (registered.queue, registered.max_attempts, registered.timeout) == ("slow", 7, 30)
        job = await client.submit("resize", {"size": 3})
        assert (job.queue, job.max_attempts) == ("slow", 7)
        final = await client.wait(job.id, timeout=20)
        assert final.status is Status.SUCCEEDED, final
        assert final.result == {"size": 3, "max_attempts": 7}
        # an unknown type still goes to default; an explicit queue still wins
        unknown = await client.submit("nobody_has_this", {})
        assert unknown.queue == "default"
        explicit = await client.submit("resize", {}, queue="default")
        assert explicit.queue == "default"
        assert await client.registered_type("nobody_has_this") is None


async def test_conflicting_registrations_newest_wins_and_warns(
    settings: Settings, start_worker: WorkerFactory, cliux_app: object
) -> None:
    """Two workers whose apps disagree about `resize`: the later one's lane wins, and it logs
    what it replaced; a fresh client routes to the new lane."""
    await start_worker(cliux_app)
    with structlog.testing.capture_logs() as logs:
        await start_worker(load_app("tests.cliux_apps:other"))
    replaced = [e for e in logs if e["event"] == "job_type_registration_replaced"]
    assert len(replaced) == 1, logs
    assert (replaced[0]["type"], replaced[0]["lane"], replaced[0]["previous_lane"]) == (
        "resize",
        "fast",
        "slow",
    )
    assert replaced[0]["log_level"] == "warning"
    async with Client.connect(settings) as client:
        job = await client.submit("resize", {})
        assert job.queue == "fast"


async def test_finished_jobs_progress_message_is_final(
    settings: Settings, start_worker: WorkerFactory, cliux_app: object
) -> None:
    """Succeeded after "rendering": progress 1 and no message; failed after progress: the
    fraction kept, the message cleared; retrying keeps both; cancelled then clears the message."""
    await start_worker(cliux_app)
    async with Client.connect(settings) as client:
        ok = await client.submit("render", {})
        failed = await client.submit("half_then_fail", {})
        await wait_until(lambda: progress_is(client, ok.id, "rendering"), timeout=20)
        ok_done = await client.wait(ok.id, timeout=20)
        failed_done = await client.wait(failed.id, timeout=20)
        assert ok_done.status is Status.SUCCEEDED
        assert (ok_done.progress, ok_done.progress_message) == (1.0, None)
        assert failed_done.status is Status.FAILED
        assert failed_done.progress == pytest.approx(0.4)
        assert failed_done.progress_message is None
        pooled = await client.submit("pool_progress", {})  # from the pool, while it runs
        await wait_until(lambda: progress_is(client, pooled.id, "halfway in the pool"))
        pooled_done = await client.wait(pooled.id, timeout=20)
        assert (pooled_done.progress, pooled_done.progress_message) == (1.0, None)
        later = await client.submit("try_later", {})
        await wait_until(lambda: retrying(client, later.id), timeout=20)
        kept = await client.get(later.id)  # a retrying job keeps where its attempt stopped
        assert (kept.progress, kept.progress_message) == (pytest.approx(0.2), "trying")
        cancelled = await client.cancel(later.id, "not needed")
        assert cancelled.status is Status.CANCELLED
        assert (cancelled.progress, cancelled.progress_message) == (pytest.approx(0.2), None)


async def retrying(client: Client, job_id: str) -> bool:
    return (await client.get(job_id)).status is Status.RETRYING


async def progress_is(client: Client, job_id: str, message: str) -> bool:
    """Whether the job's row shows ``message`` as its progress message (it was flushed)."""
    return (await client.get(job_id)).progress_message == message
