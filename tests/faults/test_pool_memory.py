"""Harm: a process-pool job that tries to take 4 GB, in a real worker with a 512 MB limit.

The worker must kill the child long before 4 GB (the measured size is in the
error), record the attempt as a retryable ``memory`` failure, end the job
``dead`` after its two attempts, replace the child each time, keep running
the other jobs meanwhile, and never exit itself. No service is stopped.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.model import JobRecord
from coldbrew.settings import Settings
from tests.faults.harness import is_ready
from tests.helpers import free_port, make_settings, worker_env

REPO = Path(__file__).resolve().parents[2]
APP_REF = "tests.faults.memory_app:app"
LIMIT_MB = 512

# exclusive: it counts the pool children replaced for memory against a limit; beside
# other test processes the count drifted (failed twice in the parallel phase, passes alone)
pytestmark = [pytest.mark.timeout(120), pytest.mark.exclusive]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:  # noqa: S310
        return str(response.read().decode())


async def test_memory_hog_is_killed_and_the_worker_carries_on(
    settings: Settings, tmp_path: Path
) -> None:
    """4 GB asked at a 512 MB limit: two `memory` failures, dead; 2 children; other jobs flow."""
    limited = make_settings(
        settings.namespace, processes=2, process_max_memory_mb=LIMIT_MB, log_level="info"
    )
    port = free_port()
    env = worker_env(limited, COLDBREW_METRICS_PORT=str(port))
    env["PYTHONPATH"] = str(REPO)
    log = tmp_path / "worker.log"
    with log.open("wb") as sink:
        worker = subprocess.Popen(  # noqa: S603 - our own CLI
            [sys.executable, "-m", "coldbrew", "worker", APP_REF],
            env=env,
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not await asyncio.to_thread(is_ready, port):
            assert worker.poll() is None, log.read_text()[-3000:]
            assert loop.time() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.1)

        async with Client.connect(limited, app=load_app(APP_REF)) as client:
            hog = await client.submit("hog", {"mb": 4096})
            others: list[JobRecord] = []

            async def keep_submitting() -> None:
                n = 0
                while not (await client.get(hog.id)).status.terminal:
                    others.append(await client.submit("square", {"x": n}))
                    others.append(await client.submit("ping", {"n": n}))
                    n += 1
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(keep_submitting(), timeout=60)
            record = await client.wait(hog.id, timeout=5)
            assert worker.poll() is None, log.read_text()[-3000:]
            finished = [await client.wait(job.id, timeout=30) for job in others]

        assert (record.status, record.error_kind) == ("dead", "memory"), record
        assert (record.attempt, record.dead_reason) == (2, "max_attempts")
        message = record.error_message or ""
        measured = re.search(rf"reached (\d+) MB, over the limit of {LIMIT_MB} MB", message)
        assert measured is not None, message
        assert LIMIT_MB < int(measured[1]) < 1536, message  # killed long before 4 GB

        assert [job.status for job in finished] == ["succeeded"] * len(finished)
        assert [job.result for job in finished if job.type == "square"] == [
            job.args["x"] ** 2 for job in finished if job.type == "square"
        ]
        assert record.finished_at is not None
        during = [
            job
            for job in finished
            if job.finished_at is not None
            and hog.created_at < job.finished_at < record.finished_at
            and job.type == "square"
        ]
        assert len(during) >= 5, "process-pool jobs stalled while the hog was being killed"

        # The job fails when its child is killed; the replacement is counted when the
        # dead child is reaped, which may come after the job's outcome is written.
        replaced = 'coldbrew_pool_children_replaced_total{reason="memory"} 2.0'
        metrics = await asyncio.to_thread(scrape, port)
        deadline = loop.time() + 10  # the second replacement may still be booting
        while replaced not in metrics or "coldbrew_pool_children 2.0" not in metrics:
            assert loop.time() < deadline, re.findall(r"coldbrew_pool_children.*", metrics)
            await asyncio.sleep(0.1)
            metrics = await asyncio.to_thread(scrape, port)
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.terminate()
        code = await asyncio.to_thread(worker.wait, 30)
    assert code == 0, log.read_text()[-3000:]
    assert log.read_text().count("procpool_child_over_memory") == 2
