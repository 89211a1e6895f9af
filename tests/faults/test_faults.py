"""Tests that do harm: kill -9, broker and database restarts, a hung worker, garbage.

Each scenario runs three real worker processes over 500 mixed jobs (0.1-5 s;
coroutine and process-pool), does its harm, and then checks the guarantees:
every job terminal and succeeded, every coroutine job's side effect exactly
once and every pool job's at most once, no outcome written by a fenced
attempt, and recovery within lease + reaper interval + 5 s.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import pytest

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.faults.harness import (
    FAULT_APP,
    Fleet,
    check_guarantees,
    is_ready,
    prepare_tables,
    submit_load,
    wait_all_terminal,
)
from tests.helpers import AMQP_URL, make_settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

JOBS = 500
LEASE = 4.0
REAPER = 0.5
RECOVERY_BOUND = LEASE + REAPER + 5.0


@pytest.fixture
async def fault_settings(settings: Settings) -> Settings:
    await prepare_tables(settings.namespace)
    return make_settings(
        settings.namespace,
        lease_seconds=LEASE,
        heartbeat_seconds=1.0,
        reaper_interval_seconds=REAPER,
        concurrency=100,
        processes=2,
        shutdown_grace_seconds=2.0,
        amqp_heartbeat_seconds=2,
    )


@pytest.fixture
async def fleet(fault_settings: Settings, tmp_path: Path) -> AsyncIterator[Fleet]:
    effects = tmp_path / "effects"
    effects.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    running = Fleet(fault_settings, effects, logs)
    try:
        yield running
    finally:
        running.stop_all()


def report(capsys: pytest.CaptureFixture[str], name: str, **figures: object) -> None:
    with capsys.disabled():
        print(f"\n[fault:{name}] " + json.dumps(figures, default=str))


async def run_load(fleet: Fleet, rng: random.Random) -> list[str]:
    # with the app, jobs carry their own max_attempts (10), not COLDBREW_MAX_ATTEMPTS (5)
    async with Client.connect(fleet.settings, app=load_app(FAULT_APP)) as client:
        return await submit_load(client, JOBS, rng)


async def test_kill_9_random_workers(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """kill -9 a random worker every 2.5 s (and start a new one): nothing lost, effects once."""
    rng = random.Random(7)
    await fleet.start(3)
    ids = await run_load(fleet, rng)
    kills: list[tuple[float, int]] = []
    for _ in range(5):
        await asyncio.sleep(2.5)
        victim = await fleet.random_busy_worker(rng)
        kills.append((time.time(), victim.pid))
        fleet.kill(victim)
        await fleet.wait_ready(fleet.start_one())
    took = await wait_all_terminal(fleet.settings.namespace, ids, timeout=120)
    verdict = await check_guarantees(fleet.settings.namespace, ids, fleet.effects_dir, kills)
    report(
        capsys,
        "kill-9",
        kills=len(kills),
        drained_after_last_kill_s=round(took, 1),
        statuses=verdict.counts,
        attempts=verdict.attempts_histogram,
        recoveries=len(verdict.recoveries),
        max_recovery_s=round(max(verdict.recoveries, default=0), 2),
        starts_by_pid=verdict.starts_by_pid,
        killed=[pid for _, pid in kills],
        last_start_after_first_kill_s=round(verdict.last_start - kills[0][0], 2),
    )
    assert verdict.recoveries, "no job was running on a killed worker: the scenario did no harm"
    assert max(verdict.recoveries) <= RECOVERY_BOUND


async def test_hung_worker_is_fenced(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGSTOP a worker past its lease, then SIGCONT: its jobs re-run elsewhere, writes fenced."""
    rng = random.Random(11)
    await fleet.start(3)
    ids = await run_load(fleet, rng)
    await asyncio.sleep(1.5)
    victim = await fleet.random_busy_worker(rng)
    stopped_at = time.time()
    fleet.kill(victim, signal.SIGSTOP)
    await asyncio.sleep(LEASE + 4.0)
    fleet.kill(victim, signal.SIGCONT)
    took = await wait_all_terminal(fleet.settings.namespace, ids, timeout=120)
    verdict = await check_guarantees(
        fleet.settings.namespace, ids, fleet.effects_dir, [(stopped_at, victim.pid)]
    )
    report(
        capsys,
        "sigstop",
        statuses=verdict.counts,
        attempts=verdict.attempts_histogram,
        recoveries=len(verdict.recoveries),
        drained_after_cont_s=round(took, 1),
        max_recovery_s=round(max(verdict.recoveries, default=0), 2),
    )
    assert verdict.recoveries, "no job was running on the stopped worker"
    assert max(verdict.recoveries) <= RECOVERY_BOUND
    assert victim.process.poll() is None, "the woken worker should carry on, not crash"


def assert_all_alive(fleet: Fleet) -> None:
    """No worker died of the fault: each rode it out and reconnected by itself."""
    for worker in fleet.workers:
        code = worker.process.poll()
        assert code is None, f"worker exited {code}: {worker.log.read_text()[-3000:]}"


async def run_more(fleet: Fleet) -> None:
    """After the fault, fresh jobs on every lane still run: consumers were restored."""
    rng = random.Random(23)
    async with Client.connect(fleet.settings) as client:
        ids = await submit_load(client, 40, rng)
    await wait_all_terminal(fleet.settings.namespace, ids, timeout=60)


async def _becomes_unready(port: int, within: float) -> bool:
    """Poll /readyz for ``within`` seconds; True once it answers not-ready."""
    unready = False
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        unready = unready or not await asyncio.to_thread(is_ready, port)
        await asyncio.sleep(0.2)
    return unready


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, timeout=120, capture_output=True)


@pytest.mark.exclusive  # stops and starts the machine's RabbitMQ
async def test_rabbitmq_restart(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """stop_app / start_app mid-run: workers reconnect and every job still succeeds once."""
    if shutil.which("rabbitmqctl") is None:
        pytest.fail("rabbitmqctl is needed for this test (apt-get install rabbitmq-server)")
    rng = random.Random(13)
    await fleet.start(3)
    ids = await run_load(fleet, rng)
    await asyncio.sleep(2.0)
    down_at = time.time()
    await asyncio.to_thread(rabbitmqctl, "stop_app")
    try:
        reported_down = await _becomes_unready(fleet.workers[0].port, within=3.0)
    finally:
        await asyncio.to_thread(rabbitmqctl, "start_app")
    up_at = time.time()
    for worker in list(fleet.workers):
        await fleet.wait_ready(worker, timeout=60)
    ready_at = time.time()
    took = await wait_all_terminal(fleet.settings.namespace, ids, timeout=150)
    verdict = await check_guarantees(fleet.settings.namespace, ids, fleet.effects_dir, [])
    report(
        capsys,
        "rabbitmq-restart",
        broker_down_s=round(up_at - down_at, 1),
        workers_ready_again_s=round(ready_at - up_at, 1),
        drained_after_restart_s=round(took, 1),
        statuses=verdict.counts,
        attempts=verdict.attempts_histogram,
    )
    assert_all_alive(fleet)
    await run_more(fleet)
    assert reported_down, "/readyz kept saying ready while RabbitMQ was down"


def postgres_restart() -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        timeout=120,
        capture_output=True,
    )


@pytest.mark.exclusive  # restarts the machine's PostgreSQL
async def test_postgres_restart(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """Restart PostgreSQL mid-run: workers ride it out and every job still succeeds once."""
    if not await asyncio.to_thread(Path("/etc/postgresql").exists):
        pytest.fail("this test restarts the local PostgreSQL cluster (pg_ctlcluster)")
    rng = random.Random(17)
    await fleet.start(3)
    ids = await run_load(fleet, rng)
    await asyncio.sleep(2.0)
    started = time.time()
    await asyncio.to_thread(postgres_restart)
    restarted = time.time()
    took = await wait_all_terminal(fleet.settings.namespace, ids, timeout=150)
    verdict = await check_guarantees(fleet.settings.namespace, ids, fleet.effects_dir, [])
    report(
        capsys,
        "postgres-restart",
        restart_s=round(restarted - started, 1),
        drained_after_restart_s=round(took, 1),
        statuses=verdict.counts,
        attempts=verdict.attempts_histogram,
    )
    assert_all_alive(fleet)
    await run_more(fleet)


GARBAGE = [
    (b"\x00\xffnot json", "default.t1", {}),
    (b"[]", "default.t2", {}),
    (b'{"args": {}}', "default.t3", {}),
    (b'{"type": "nope"}', "default.t4", {}),
    (b'{"type": "work", "args": {"seconds": "soon"}}', "default.t5", {}),
    (b'{"type": "work", "args": {"seconds": 1, "extra": 1}}', "default.t6", {}),
    (b'{"type": "work", "args": {}}', "default.Bad!", {}),
    (
        b'{"type": "work", "args": {"seconds": 0.1}}',
        "default.t1",
        {"headers": {"x-max-attempts": "lots"}},
    ),
    (b'{"type": "work", "args": {"seconds": "' + b"9" * 300_000 + b'"}}', "default.t2", {}),
]


async def test_garbage_interleaved(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """Garbage of every kind mixed into the load: all rejected with reasons, all jobs succeed."""
    rng = random.Random(19)
    await fleet.start(3)
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(f"{fleet.settings.namespace}.jobs")
        ids: list[str] = []
        async with Client.connect(fleet.settings) as client:
            for round_ in range(10):
                ids += await submit_load(client, JOBS // 10, rng)
                for body, key, props in GARBAGE:
                    await exchange.publish(
                        aio_pika.Message(
                            body, message_id=f"junk-{round_}-{len(ids)}-{key}", **props
                        ),
                        routing_key=key,
                    )
    finally:
        await connection.close()
    took = await wait_all_terminal(fleet.settings.namespace, ids, timeout=120)
    verdict = await check_guarantees(fleet.settings.namespace, ids, fleet.effects_dir, [])
    async with Client.connect(fleet.settings, broker=False) as client:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while sum((await client.store.dead.rejected_counts()).values()) < 10 * len(GARBAGE):
            assert loop.time() < deadline, await client.store.dead.rejected_counts()
            await asyncio.sleep(0.2)
        rejected = await client.store.dead.rejected_counts()
    report(capsys, "garbage", drained_s=round(took, 1), statuses=verdict.counts, rejected=rejected)
    assert sum(rejected.values()) == 10 * len(GARBAGE)
