"""`coldbrew api` under harm: PostgreSQL, then RabbitMQ, restart while clients submit.

Guarantee 1 over HTTP: every submission the API answered 202 reaches
`succeeded`. While PostgreSQL is down a submission answers 503 (never a
traceback, never a hang past the client's timeout); while only RabbitMQ is
down it still answers 202 (the row is committed; the relay publishes it). A
client that got no 202 retries with the same Idempotency-Key and gets the same
job, not a second one. The API recovers by itself: no restart.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from coldbrew.settings import Settings
from tests.e2e.test_api import start_api, tail
from tests.e2e.test_cli import start_worker_process, stop_process, terminate
from tests.faults.test_faults import postgres_restart, rabbitmqctl
from tests.helpers import make_settings

# exclusive: restarts the machine's PostgreSQL and stops the machine's RabbitMQ
pytestmark = [pytest.mark.slow, pytest.mark.exclusive, pytest.mark.timeout(240)]

KEY = "faults-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class Submissions:
    """What the submitting client saw, by Idempotency-Key."""

    accepted: dict[str, str] = field(default_factory=dict)  # key -> job id
    unanswered: set[str] = field(default_factory=set)  # 503 or no answer: retry with the key
    answers: dict[int, int] = field(default_factory=dict)  # status code -> count
    transport_errors: int = 0

    def saw(self, code: int) -> None:
        self.answers[code] = self.answers.get(code, 0) + 1


async def submit_one(http: httpx.AsyncClient, key: str, seen: Submissions) -> None:
    try:
        response = await http.post(
            "/jobs",
            json={"type": "echo", "args": {"value": key}},
            headers={"Idempotency-Key": key},
        )
    except httpx.TransportError:
        seen.transport_errors += 1
        seen.unanswered.add(key)
        return
    seen.saw(response.status_code)
    assert "Traceback" not in response.text
    if response.status_code == 202:
        seen.accepted[key] = response.json()["id"]
        seen.unanswered.discard(key)
    elif response.status_code == 503:
        assert response.json()["error"]["kind"] == "database_unavailable", response.text
        assert "Retry-After" in response.headers
        seen.unanswered.add(key)
    else:
        raise AssertionError(f"unexpected {response.status_code}: {response.text}")


async def submit_until(
    http: httpx.AsyncClient, stop: asyncio.Event, seen: Submissions, counter: itertools.count[int]
) -> None:
    """About 40 submissions a second until ``stop``."""
    while not stop.is_set():
        await submit_one(http, f"k{next(counter)}", seen)
        await asyncio.sleep(0.025)


async def wait_ready(http: httpx.AsyncClient, within: float) -> float:
    """Seconds until /readyz answers 200 again."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        try:
            if (await http.get("/readyz")).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"the API was not ready again within {within} s")


def our_errors(log: Path) -> list[dict[str, object]]:
    """Error records of coldbrew's own loggers and of uvicorn (an unhandled request error).

    Libraries log their reconnect attempts with tracebacks at warning level
    (asyncpg's pool, aiormq's reader); those are expected during a restart.
    """
    records = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        logger = str(record.get("logger", ""))
        if record.get("level") in {"error", "critical"} and logger.startswith(
            ("coldbrew", "uvicorn")
        ):
            records.append(record)
    return records


@pytest.fixture
def fault_settings(settings: Settings) -> Settings:
    return make_settings(
        settings.namespace,
        lease_seconds=4.0,
        heartbeat_seconds=1.0,
        reaper_interval_seconds=0.5,
        relay_interval_seconds=0.5,
        amqp_heartbeat_seconds=2,
    )


async def test_api_submissions_survive_database_and_broker_restarts(
    fault_settings: Settings, tmp_path: Path
) -> None:
    if shutil.which("rabbitmqctl") is None or not await asyncio.to_thread(
        Path("/etc/postgresql").exists
    ):
        pytest.fail("this test restarts the local PostgreSQL and RabbitMQ")
    log = tmp_path / "api.log"
    api, base = await start_api(fault_settings, KEY, log)
    worker = None
    try:
        worker = await start_worker_process(fault_settings, tmp_path / "worker.log")
        seen, counter, stop = Submissions(), itertools.count(), asyncio.Event()
        async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=10) as http:
            load = asyncio.create_task(submit_until(http, stop, seen, counter))
            await asyncio.sleep(2.0)
            await asyncio.to_thread(postgres_restart)
            database_back = await wait_ready(http, within=30)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(rabbitmqctl, "stop_app")
            try:
                await asyncio.sleep(3.0)  # submissions go on: rows committed, publishes wait
            finally:
                await asyncio.to_thread(rabbitmqctl, "start_app")
            await asyncio.sleep(2.0)
            stop.set()
            await load

            # the client's side of the contract: no 202 yet, so retry with the same key
            for _ in range(60):
                if not seen.unanswered:
                    break
                for key in sorted(seen.unanswered):
                    await submit_one(http, key, seen)
                await asyncio.sleep(0.5)
            assert not seen.unanswered, f"never accepted: {sorted(seen.unanswered)[:5]}"
            assert seen.answers.get(202, 0) >= 200, seen.answers

            # guarantee 1: every accepted job succeeds, once per key
            statuses: dict[str, str] = {}
            deadline = time.monotonic() + 90
            pending = dict(seen.accepted)
            while pending and time.monotonic() < deadline:
                for key, job_id in list(pending.items()):
                    response = await http.get(f"/jobs/{job_id}")
                    assert response.status_code == 200, response.text
                    body = response.json()
                    statuses[key] = body["status"]
                    if body["status"] == "succeeded":
                        assert body["result"]["value"] == key
                        del pending[key]
                if pending:
                    await asyncio.sleep(0.5)
            assert not pending, {k: statuses.get(k) for k in list(pending)[:10]}
            assert len(set(seen.accepted.values())) == len(seen.accepted)  # one job per key
        print(
            f"[fault:api-restarts] accepted={len(seen.accepted)} answers={seen.answers} "
            f"transport_errors={seen.transport_errors} database_ready_again_s="
            f"{database_back:.1f}"
        )
        assert api.poll() is None, tail(log)
        assert not our_errors(log), our_errors(log)[:3]
    finally:
        stop_process(api)
        if worker is not None:
            await terminate(worker)
            stop_process(worker.proc)
