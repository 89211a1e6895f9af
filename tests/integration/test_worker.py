"""The worker end to end on the real broker and database."""

from __future__ import annotations

import json
from typing import Any

import aio_pika
import asyncpg
import pytest

from coldbrew.client import Client
from coldbrew.errors import SchemaOutOfDate
from coldbrew.settings import Settings
from coldbrew.store import ClaimRequest
from coldbrew.topology import Topology
from tests.helpers import (
    DATABASE_URL,
    WorkerFactory,
    holds,
    make_settings,
    metric,
    new_namespace,
    publish_raw,
    read_dead_letters,
    status_is,
    wait_until,
)


async def test_coroutine_job_runs_to_success(start_worker: WorkerFactory, client: Client) -> None:
    """A submitted coroutine job is claimed, run and recorded as succeeded with its result."""
    await start_worker()
    job = await client.submit("echo", {"value": [1, "two"]}, tenant="default")
    done = await client.wait(job.id, timeout=20)
    assert done.status == "succeeded"
    assert done.result == {"value": [1, "two"], "attempt": 1, "tenant": "default"}
    assert done.attempt == 1
    assert done.progress == 1.0
    assert done.started_at is not None and done.finished_at is not None


async def test_process_pool_job_runs_with_progress(
    start_worker: WorkerFactory, client: Client
) -> None:
    """A plain-function job runs in the process pool; its last progress report ("summed")
    reaches the row with the outcome, which then makes it final: progress 1, no message
    (progress read while a pool job runs: tests/integration/test_job_types.py)."""
    await start_worker()
    job = await client.submit("cpu", {"n": 1000})
    done = await client.wait(job.id, timeout=30)
    assert done.status == "succeeded", done
    assert done.result == sum(i * i for i in range(1000))
    assert done.queue == "slow"
    assert (done.progress, done.progress_message) == (1.0, None)


async def test_plain_aio_pika_producer_follows_the_contract(
    start_worker: WorkerFactory,
    amqp: aio_pika.abc.AbstractChannel,
    client: Client,
    settings: Settings,
) -> None:
    """A producer with no coldbrew code publishes per the message contract; the job runs."""
    await start_worker()
    body = json.dumps({"type": "echo", "args": {"value": 42}}).encode()
    await publish_raw(
        amqp,
        settings.namespace,
        body,
        "default.default",
        message_id="raw-1",
        priority=5,
        headers={"x-max-attempts": 3},
    )
    await wait_until(lambda: status_is(client, "raw-1", "succeeded"))
    record = await client.get("raw-1")
    assert record.result["value"] == 42
    assert record.priority == 5
    assert record.max_attempts == 3


async def test_same_message_id_twice_makes_one_job(
    start_worker: WorkerFactory,
    amqp: aio_pika.abc.AbstractChannel,
    client: Client,
    settings: Settings,
) -> None:
    """Publishing one message_id twice creates one job that runs once; the copy is a duplicate."""
    worker = await start_worker()
    body = json.dumps({"type": "side_effect", "args": {"seconds": 0.3}}).encode()
    for _ in range(2):
        await publish_raw(amqp, settings.namespace, body, "default.default", message_id="dup-1")
    await wait_until(lambda: status_is(client, "dup-1", "succeeded"))
    await wait_until(
        lambda: holds(metric(worker, "coldbrew_duplicate_deliveries_total", queue="default") >= 1)
    )
    record = await client.get("dup-1")
    assert record.attempt == 1
    assert record.result is True
    assert metric(worker, "coldbrew_jobs_started_total", queue="default", type="side_effect") == 1


async def test_idempotency_key_returns_the_same_job(client: Client) -> None:
    """Two submissions with one idempotency key are one job."""
    first = await client.submit("echo", {"value": 1}, idempotency_key="upload-9931", tenant="acme")
    second = await client.submit("echo", {"value": 2}, idempotency_key="upload-9931", tenant="acme")
    assert first.id == second.id
    assert (await client.get(first.id)).args == {"value": 1}


async def test_retry_then_success(start_worker: WorkerFactory, client: Client) -> None:
    """A transient failure is retried through the relay and then succeeds."""
    await start_worker()
    job = await client.submit("fail_times", {"times": 2})
    done = await client.wait(job.id, timeout=30)
    assert done.status == "succeeded"
    assert done.attempt == 3
    assert done.result == 3


async def test_retry_with_requested_delay(start_worker: WorkerFactory, client: Client) -> None:
    """Retry(delay=…) parks the job as retrying with run_at in the future, then runs it."""
    await start_worker()
    job = await client.submit("retry_later", {"delay": 1.0})
    await wait_until(lambda: status_is(client, job.id, "retrying"))
    parked = await client.get(job.id)
    assert (parked.run_at - parked.created_at).total_seconds() >= 0.9
    done = await client.wait(job.id, timeout=20)
    assert done.status == "succeeded" and done.attempt == 2


async def test_permanent_failure_is_not_retried(
    start_worker: WorkerFactory, client: Client
) -> None:
    """Permanent fails on the first attempt with the error in the row."""
    await start_worker()
    job = await client.submit("permanent", {})
    done = await client.wait(job.id, timeout=20)
    assert done.status == "failed"
    assert done.attempt == 1
    assert done.error_kind == "permanent"
    assert done.error_message == "bad input, never retry"


async def test_budget_spent_goes_dead_with_a_copy(
    start_worker: WorkerFactory,
    client: Client,
    amqp: aio_pika.abc.AbstractChannel,
    settings: Settings,
) -> None:
    """After max_attempts the job is dead in the row and a copy lands on <ns>.dead."""
    await start_worker()
    job = await client.submit("always_fails", {})
    done = await client.wait(job.id, timeout=20)
    assert done.status == "dead"
    assert done.attempt == 2
    assert done.dead_reason == "max_attempts"
    (copy,) = await read_dead_letters(amqp, settings.namespace, 1)
    assert copy.message_id == job.id
    assert copy.headers["x-coldbrew-reason"] == "max_attempts"


async def test_coroutine_timeout_is_retryable(start_worker: WorkerFactory, client: Client) -> None:
    """A coroutine past its timeout is cancelled and the attempt fails as a timeout."""
    await start_worker()
    job = await client.submit("too_slow", {}, max_attempts=2)
    done = await client.wait(job.id, timeout=20)
    assert done.status == "dead"
    assert done.error_kind == "timeout"
    assert done.attempt == 2


async def test_pool_timeout_and_crash_keep_the_pool(
    start_worker: WorkerFactory, client: Client
) -> None:
    """A pool child past its timeout is killed, a crashing child is replaced, others go on."""
    worker = await start_worker()
    slow = await client.submit("spin", {})
    crash = await client.submit("crash", {})
    fine = await client.submit("cpu", {"n": 10})
    assert (await client.wait(fine.id, timeout=30)).status == "succeeded"
    spun = await client.wait(slow.id, timeout=30)
    assert spun.status == "dead" and spun.error_kind == "timeout"
    crashed = await client.wait(crash.id, timeout=30)
    assert crashed.status == "dead" and crashed.error_kind == "crashed"
    pool = worker.parts.runner.pool
    await wait_until(lambda: holds(pool.alive == 2))
    again = await client.submit("cpu", {"n": 10})
    assert (await client.wait(again.id, timeout=30)).status == "succeeded"


async def test_cancel_queued_job_never_runs(start_worker: WorkerFactory, client: Client) -> None:
    """A job cancelled while queued is never run, even when its message is delivered."""
    job = await client.submit("side_effect", {})
    cancelled = await client.cancel(job.id, "changed my mind")
    assert cancelled.status == "cancelled"
    worker = await start_worker()
    await wait_until(
        lambda: holds(metric(worker, "coldbrew_duplicate_deliveries_total", queue="default") >= 1)
    )
    record = await client.get(job.id)
    assert record.status == "cancelled" and record.attempt == 0
    assert record.error_message == "changed my mind"


async def test_cancel_running_job_stops_it(start_worker: WorkerFactory, client: Client) -> None:
    """A running job is stopped within a heartbeat and ends cancelled with the reason."""
    await start_worker()
    job = await client.submit("sleep_for", {"seconds": 30})
    await wait_until(lambda: status_is(client, job.id, "running"))
    await client.cancel(job.id, "operator said stop")
    done = await client.wait(job.id, timeout=10)
    assert done.status == "cancelled"
    assert done.error_message == "operator said stop"


async def test_cancel_running_pool_job_kills_child(
    start_worker: WorkerFactory, client: Client
) -> None:
    """A running process-pool job is cancelled by killing its child."""
    await start_worker()
    job = await client.submit("cpu_sleep", {"seconds": 30})
    await wait_until(lambda: status_is(client, job.id, "running"))
    await client.cancel(job.id, "too long")
    done = await client.wait(job.id, timeout=10)
    assert done.status == "cancelled"


async def test_progress_is_visible_while_running(
    start_worker: WorkerFactory, client: Client
) -> None:
    """Progress reported by a running job shows in its status before it finishes."""
    await start_worker()
    job = await client.submit("progress_steps", {"steps": 4, "pause": 0.5})

    async def partial() -> bool:
        record = await client.get(job.id)
        return (
            record.status == "running" and record.progress is not None and 0 < record.progress < 1
        )

    await wait_until(partial, timeout=10)
    assert (await client.wait(job.id, timeout=10)).progress == 1.0


async def test_relay_publishes_a_commit_that_was_never_published(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """A row committed without its publish (producer crashed) is published by the relay."""
    request = ClaimRequest(
        "orphan-1", "echo", "default", "default", {"value": "x"}, 0, 3, None, None
    )
    await client.store.jobs.insert_job(request, relay_grace=0.0)
    await start_worker()
    done = await client.wait("orphan-1", timeout=20)
    assert done.status == "succeeded"


async def test_new_tenant_is_provisioned_and_the_fleet_consumes_it(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """A job for an unseen tenant provisions its queue; both workers start consuming it."""
    first = await start_worker()
    second = await start_worker()
    job = await client.submit("echo", {"value": 1}, tenant="brand-new")
    assert (await client.wait(job.id, timeout=20)).status == "succeeded"
    for worker in (first, second):
        await wait_until(
            lambda w=worker: holds(w.parts.consumers.consumes("default", "brand-new")), timeout=10
        )
    more = [await client.submit("echo", {"value": i}, tenant="brand-new") for i in range(20)]
    for job in more:
        assert (await client.wait(job.id, timeout=20)).status == "succeeded"


async def test_worker_refuses_an_unmigrated_schema(test_app: Any) -> None:
    """A namespace without the schema makes the worker exit with a `coldbrew migrate` hint."""
    from coldbrew.worker import Worker

    settings = make_settings(new_namespace())
    with pytest.raises(SchemaOutOfDate, match="coldbrew migrate"):
        await Worker(test_app, settings).run()


async def test_graceful_stop_releases_running_jobs(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """On stop, a job that outlives the grace time is released and finishes on another worker."""
    first = await start_worker(shutdown_grace_seconds=0.5)
    # long enough to outlive the second worker's start-up on a loaded machine (3 s did not)
    job = await client.submit("sleep_for", {"seconds": 10})
    await wait_until(lambda: status_is(client, job.id, "running"))
    second = await start_worker()
    assert (await client.status(job.id))["status"] == "running", "still on the first worker"
    first.stop()
    await wait_until(lambda: holds(not first.ready.is_set() and len(first.inflight) == 0))
    done = await client.wait(job.id, timeout=30)
    assert done.status == "succeeded"
    assert metric(second, "coldbrew_jobs_started_total", queue="default", type="sleep_for") == 1
    assert (
        metric(
            first,
            "coldbrew_jobs_finished_total",
            queue="default",
            type="sleep_for",
            outcome="released",
        )
        == 1
    )


async def test_rejected_and_tenants_tables_exist(settings: Settings) -> None:
    """The migrated schema has the tables the worker needs."""
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    try:
        tables = {
            r["tablename"]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = $1", settings.namespace
            )
        }
    finally:
        await conn.close()
    assert {
        "jobs",
        "job_once",
        "tenant_queues",
        "tenants",
        "rejected_messages",
        "schema_migrations",
    } <= tables


async def test_dlq_replay_gives_a_fresh_budget(start_worker: WorkerFactory, client: Client) -> None:
    """A dead job replayed with a fresh budget runs again, with attempt still counting up."""
    await start_worker()
    job = await client.submit("fail_times", {"times": 3}, max_attempts=2)
    dead = await client.wait(job.id, timeout=20)
    assert dead.status == "dead" and dead.attempt == 2
    listed = await client.store.dead.dlq_list("flaky", 10)
    assert [j.id for j in listed] == [job.id]
    assert await client.store.dead.dlq_replay(None, job.id, 10, 3) == [job.id]
    done = await client.wait(job.id, timeout=20)
    assert done.status == "succeeded"
    assert done.attempt == 4  # attempts 3 and 4 of the fresh budget; 4 > times
    assert await client.store.dead.dlq_list(None, 10) == []


async def test_breaker_opens_after_failures(start_worker: WorkerFactory, client: Client) -> None:
    """After consecutive failures the breaker fails calls at once with a retryable error."""
    worker = await start_worker(breaker_failure_threshold=2, breaker_reset_seconds=60)
    jobs = [await client.submit("flaky_dependency", {}, max_attempts=1) for _ in range(3)]
    finals = [await client.wait(j.id, timeout=20) for j in jobs]
    kinds = sorted(f.error_kind or "" for f in finals)
    assert kinds == ["builtins.ConnectionError", "builtins.ConnectionError", "retry_requested"]
    opened = [f for f in finals if f.error_kind == "retry_requested"][0]
    assert "circuit breaker 'storage' is open" in (opened.error_message or "")
    assert metric(worker, "coldbrew_breaker_state", name="storage") == 2


async def test_max_wall_seconds_ends_retries(start_worker: WorkerFactory, client: Client) -> None:
    """A job past its max_wall_seconds is dead even with attempts left."""
    await start_worker(retry_base_seconds=0.4, retry_max_seconds=0.4)
    job = await client.submit("walled", {})
    done = await client.wait(job.id, timeout=20)
    assert done.status == "dead"
    assert done.dead_reason == "max_wall_seconds"
    assert done.attempt < 50


async def test_once_in_transaction_commits_with_the_guard(
    start_worker: WorkerFactory, client: Client
) -> None:
    """The outbox write and the guard commit together; a second attempt writes nothing."""
    await start_worker()
    job = await client.submit("outbox_write", {}, max_attempts=3)
    done = await client.wait(job.id, timeout=20)
    assert done.status == "succeeded" and done.attempt == 2
    rows = await client.store._fetch("get_job", job.id)  # noqa: SLF001 - reuse a pooled fetch
    assert rows
    count = await client.store._run(  # noqa: SLF001
        lambda conn: conn.fetchval("SELECT count(*) FROM outbox WHERE job_id = $1", job.id)
    )
    assert count == 1


async def test_on_cancel_hook_runs(start_worker: WorkerFactory, client: Client) -> None:
    """A cancelled job's cleanup hook runs with the reason."""
    await start_worker()
    job = await client.submit("cancellable", {})
    await wait_until(lambda: status_is(client, job.id, "running"))
    await client.cancel(job.id, "hook please")
    done = await client.wait(job.id, timeout=10)
    assert done.status == "cancelled"
    from tests import apps

    assert apps.CANCELLED.get(job.id) == "hook please"


async def test_checkpoint_lets_the_next_attempt_resume(
    start_worker: WorkerFactory, client: Client
) -> None:
    """A retried job starts from its last checkpoint instead of from scratch."""
    await start_worker()
    job = await client.submit("resumable", {"steps": 6})
    done = await client.wait(job.id, timeout=20)
    assert done.status == "succeeded"
    assert done.attempt == 2
    assert done.result == {"done": [0, 1, 2, 3, 4, 5], "resumed_at": 4}


async def test_paused_tenant_waits_while_others_run(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """A paused tenant's jobs are held, not run; others run; on resume they run."""

    channel = Topology(settings.namespace).tenant_channel
    await client.store.tenants.set_tenant("sleepy", weight=None, paused=True, channel=channel)
    worker = await start_worker()
    held = await client.submit("echo", {"value": 1}, tenant="sleepy")
    other = await client.submit("echo", {"value": 2}, tenant="busy")
    assert (await client.wait(other.id, timeout=20)).status == "succeeded"
    await wait_until(lambda: holds(len(worker.scheduler) == 1), timeout=5)
    assert worker.scheduler.pending_by_tenant() == {"sleepy": 1}
    assert (await client.get(held.id)).status == "queued"
    resumed = await client.store.tenants.set_tenant(
        "sleepy", weight=2.0, paused=False, channel=channel
    )
    assert resumed.weight == 2.0 and not resumed.paused
    assert (await client.wait(held.id, timeout=20)).status == "succeeded"
