"""Guarantee 4: a job that kills its whole worker process is bounded by max_attempts."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.helpers import free_port, make_settings, worker_env

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


async def test_job_that_kills_its_worker_goes_dead(settings: Settings) -> None:
    """Each attempt kills the worker; after max_attempts (2) the job is dead, not retried."""
    fast = make_settings(settings.namespace, lease_seconds=3.0, heartbeat_seconds=1.0)
    env = worker_env(fast, COLDBREW_METRICS_PORT=str(free_port()))
    env["PYTHONPATH"] = str(REPO)
    starts = 0
    async with Client.connect(fast, app=load_app("tests.apps:app")) as client:
        job = await client.submit("suicide", {})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while (record := await client.get(job.id)).status != "dead":
            assert loop.time() < deadline, record
            process = subprocess.Popen(  # noqa: S603 - our own CLI
                [sys.executable, "-m", "coldbrew", "worker", "tests.apps:app"],
                env=env,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            starts += 1
            try:
                while process.poll() is None and (await client.get(job.id)).status != "dead":
                    await asyncio.sleep(0.2)
            finally:
                if process.poll() is None:
                    process.terminate()
                await asyncio.to_thread(process.wait, 30)
        assert record.attempt == 2
        assert record.dead_reason == "max_attempts"
        assert starts >= 2
