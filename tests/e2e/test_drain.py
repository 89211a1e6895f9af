"""Guarantee 6 with real processes: SIGTERM drains a worker and hands the rest over at once."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import datetime
from pathlib import Path

import asyncpg

from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.e2e.test_cli import WorkerProcess, get, start_worker_process, stop_process
from tests.helpers import DATABASE_URL, make_settings, wait_until

GRACE = 2.0
LEASE = 30.0  # a lease-based recovery would take this long: the hand-over must not
SHORT, LONG = 0.5, 20.0


async def test_sigterm_finishes_short_jobs_and_releases_long_ones(
    settings: Settings, tmp_path: Path
) -> None:
    """SIGTERM lets short jobs finish, releases long ones to another worker at once, exits 0."""
    drain = make_settings(
        settings.namespace,
        lease_seconds=LEASE,
        heartbeat_seconds=5.0,
        shutdown_grace_seconds=GRACE,
    )
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    workers: list[WorkerProcess] = []

    async def jobs(ids: list[str]) -> dict[str, asyncpg.Record]:
        rows = await conn.fetch(
            "SELECT id, status::text AS status, attempt, worker_id, finished_at FROM jobs"
            " WHERE id = any($1::text[])",
            ids,
        )
        return {row["id"]: row for row in rows}

    async def all_running_on(ids: list[str], worker_id: str) -> bool:
        rows = await jobs(ids)
        return len(rows) == len(ids) and all(
            r["status"] == "running" and r["worker_id"] == worker_id for r in rows.values()
        )

    try:
        # A serves lanes default and short; B (started later) only default, so the short
        # jobs can only run on A, and the long ones are A's until it lets them go.
        a = await start_worker_process(
            drain, tmp_path / "a.log", COLDBREW_WORKER_ID="drain-a", COLDBREW_QUEUES="default,short"
        )
        workers.append(a)
        async with Client.connect(drain) as client:
            long_ids = [
                job.id
                for job in await asyncio.gather(
                    *(client.submit("sleep_for", {"seconds": LONG}) for _ in range(3))
                )
            ]
            await wait_until(lambda: all_running_on(long_ids, "drain-a"), timeout=20)
            b = await start_worker_process(
                drain, tmp_path / "b.log", COLDBREW_WORKER_ID="drain-b", COLDBREW_QUEUES="default"
            )
            workers.append(b)
            short_ids = [
                job.id
                for job in await asyncio.gather(
                    *(
                        client.submit("sleep_for", {"seconds": SHORT}, queue="short")
                        for _ in range(5)
                    )
                )
            ]
        every = long_ids + short_ids
        await wait_until(lambda: all_running_on(every, "drain-a"), timeout=SHORT, interval=0.01)

        signalled_at: datetime = await conn.fetchval("SELECT clock_timestamp()")
        started = time.monotonic()
        a.proc.send_signal(signal.SIGTERM)

        async def not_ready() -> bool:
            answer = await get(a.port, "/readyz")
            return answer is not None and answer[0] == 503

        await wait_until(not_ready, timeout=GRACE)
        code = await asyncio.to_thread(a.proc.wait, GRACE + 15)
        exited = time.monotonic()
        assert code == 0, a.output()
        assert exited - started <= GRACE + 15

        short = await jobs(short_ids)
        for row in short.values():  # seen running on A above; a finished row keeps no worker
            assert (row["status"], row["attempt"]) == ("succeeded", 1)
        assert any(row["finished_at"] > signalled_at for row in short.values()), (
            "no short job was still in flight at SIGTERM: the drain was not exercised"
        )

        await wait_until(lambda: all_running_on(long_ids, "drain-b"), timeout=LEASE)
        handed_over = time.monotonic() - exited
        assert handed_over < 3.0, f"released jobs restarted {handed_over:.1f} s after A exited"
        assert all(row["attempt"] == 2 for row in (await jobs(long_ids)).values())

        async def long_jobs_succeeded() -> bool:
            return all(row["status"] == "succeeded" for row in (await jobs(long_ids)).values())

        await wait_until(long_jobs_succeeded, timeout=LONG + 15, interval=0.2)

        b.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(b.proc.wait, GRACE + 15) == 0, b.output()
    finally:
        await conn.close()
        for worker in workers:
            stop_process(worker.proc)
