"""A fleet of real worker processes, a mixed job load, and the checks every scenario ends with."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.helpers import DATABASE_URL, free_port, worker_env

REPO = Path(__file__).resolve().parents[2]
FAULT_APP = "tests.faults.apps:app"


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class Fleet:
    """Three (by default) `coldbrew worker` subprocesses that a scenario may kill and restart."""

    settings: Settings
    effects_dir: Path
    logs_dir: Path
    workers: list[WorkerProcess] = field(default_factory=list)
    app: str = FAULT_APP
    events: list[tuple[float, str, int]] = field(default_factory=list)  # (time, what, pid)
    app: str = FAULT_APP

    def env(self, port: int) -> dict[str, str]:
        env = worker_env(
            self.settings,
            COLDBREW_METRICS_PORT=str(port),
            FAULT_EFFECTS_DIR=str(self.effects_dir),
            COLDBREW_LOG_LEVEL="warning",
        )
        env["PYTHONPATH"] = str(REPO)
        return env

    def start_one(self) -> WorkerProcess:
        port = free_port()
        log = self.logs_dir / f"worker-{len(self.events)}-{port}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(  # noqa: S603 - our own CLI
                [sys.executable, "-m", "coldbrew", "worker", self.app],
                env=self.env(port),
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        worker = WorkerProcess(process, port, log)
        self.workers.append(worker)
        self.events.append((time.time(), "start", worker.pid))
        return worker

    async def wait_ready(self, worker: WorkerProcess, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if worker.process.poll() is not None:
                raise AssertionError(
                    f"worker exited {worker.process.returncode}: {worker.log.read_text()[-2000:]}"
                )
            if await asyncio.to_thread(is_ready, worker.port):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"worker {worker.pid} not ready: {worker.log.read_text()[-2000:]}")

    async def start(self, count: int = 3) -> None:
        started = [self.start_one() for _ in range(count)]
        for worker in started:
            await self.wait_ready(worker)

    def kill(self, worker: WorkerProcess, sig: int = signal.SIGKILL) -> None:
        self.events.append((time.time(), signal.Signals(sig).name, worker.pid))
        worker.process.send_signal(sig)
        if sig == signal.SIGKILL:
            worker.process.wait(timeout=10)
            self.workers.remove(worker)

    def stop_all(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGCONT)
                worker.process.terminate()
        for worker in self.workers:
            try:
                worker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(timeout=10)

    async def random_busy_worker(
        self, rng: random.Random, database_url: str = DATABASE_URL
    ) -> WorkerProcess:
        """A random worker among those holding running jobs (any worker if none does).

        A fresh replacement worker often holds nothing yet; killing it would
        do no harm and prove nothing.
        """
        conn = await asyncpg.connect(
            database_url, server_settings={"search_path": self.settings.namespace}
        )
        try:
            rows = await conn.fetch("SELECT DISTINCT worker_id FROM jobs WHERE status = 'running'")
        finally:
            await conn.close()
        busy_pids = {int(r["worker_id"].rsplit("-", 1)[-1]) for r in rows if r["worker_id"]}
        busy = [w for w in self.workers if w.pid in busy_pids]
        return rng.choice(busy or self.workers)


def is_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:  # noqa: S310
            return bool(response.status == 200)
    except OSError:
        return False


async def prepare_tables(namespace: str, database_url: str = DATABASE_URL) -> None:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    try:
        await conn.execute(
            "CREATE TABLE fault_attempts (job_id text, attempt int, pid int,"
            " started_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        await conn.execute(
            "CREATE TABLE fault_effects (job_id text, attempt int,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
    finally:
        await conn.close()


async def submit_load(client: Client, count: int, rng: random.Random) -> list[str]:
    """``count`` jobs of 0.1-5 s: nine coroutine jobs for each process-pool job."""
    ids = []
    for index in range(count):
        if index % 10 == 9:
            job = await client.submit("crunch", {"seconds": round(rng.uniform(0.1, 1.5), 2)})
        else:
            job = await client.submit(
                "work", {"seconds": round(rng.uniform(0.1, 5.0), 2)}, tenant=f"t{index % 7}"
            )
        ids.append(job.id)
    return ids


async def wait_all_terminal(
    namespace: str, ids: list[str], timeout: float, database_url: str = DATABASE_URL
) -> float:
    """Wait until every job is terminal; return how long it took."""
    started = time.monotonic()
    conn = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    try:
        while True:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status IN"
                " ('queued', 'running', 'retrying')",
                ids,
            )
            if waiting == 0:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                rows = await conn.fetch(
                    "SELECT id, type, status, attempt, lease_expires_at, publish_after, run_at"
                    " FROM jobs WHERE id = ANY($1) AND status IN ('queued','running','retrying')"
                    " LIMIT 10",
                    ids,
                )
                raise AssertionError(f"{waiting} jobs not terminal after {timeout} s: {rows}")
            await asyncio.sleep(0.25)
    finally:
        await conn.close()


@dataclass
class Verdict:
    counts: dict[str, int]
    attempts_histogram: dict[int, int]
    recoveries: list[float]
    starts_by_pid: dict[int, int]
    last_start: float


async def check_guarantees(
    namespace: str,
    ids: list[str],
    effects_dir: Path,
    kills: list[tuple[float, int]],
    database_url: str = DATABASE_URL,
) -> Verdict:
    """Every job terminal and succeeded; each effect exactly (coroutine) or at most (pool) once;
    results written by the attempt that holds the row; recovery times after each kill."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    try:
        rows = await conn.fetch(
            "SELECT id, type, status, attempt, result, dead_reason, error_kind, error_message"
            " FROM jobs WHERE id = ANY($1)",
            ids,
        )
        effects = await conn.fetch(
            "SELECT job_id, count(*) AS n FROM fault_effects GROUP BY job_id"
        )
        starts = await conn.fetch(
            "SELECT job_id, attempt, pid, extract(epoch FROM started_at) AS t FROM fault_attempts"
        )
    finally:
        await conn.close()
    assert len(rows) == len(ids), "a submitted job has no row"
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    not_ok = [
        (
            r["id"],
            r["type"],
            r["status"],
            r["attempt"],
            r["dead_reason"],
            r["error_kind"],
            r["error_message"],
        )
        for r in rows
        if r["status"] != "succeeded"
    ]
    assert not not_ok, f"jobs that did not succeed: {not_ok[:10]}"
    for row in rows:
        result = json.loads(row["result"])
        assert result["attempt"] == row["attempt"], f"fenced write leaked: {dict(row)}"
    effect_count = {r["job_id"]: r["n"] for r in effects}
    work_ids = [r["id"] for r in rows if r["type"] == "work"]
    wrong = {job: effect_count.get(job, 0) for job in work_ids if effect_count.get(job, 0) != 1}
    assert not wrong, f"coroutine effects not exactly once: {list(wrong.items())[:10]}"
    files: dict[str, int] = {}
    for path in await asyncio.to_thread(lambda: list(effects_dir.iterdir())):
        job = path.name.rsplit(".", 1)[0]
        files[job] = files.get(job, 0) + 1
    twice = {job: n for job, n in files.items() if n > 1}
    assert not twice, f"pool effects happened twice: {twice}"
    counts["pool_effects_missing"] = sum(
        1 for r in rows if r["type"] == "crunch" and r["id"] not in files
    )
    histogram: dict[int, int] = {}
    for row in rows:
        histogram[row["attempt"]] = histogram.get(row["attempt"], 0) + 1
    by_pid: dict[int, int] = {}
    for row in starts:
        by_pid[row["pid"]] = by_pid.get(row["pid"], 0) + 1
    last_start = max((float(row["t"]) for row in starts), default=0.0)
    return Verdict(counts, histogram, recovery_times(starts, kills), by_pid, last_start)


def recovery_times(starts: list[Any], kills: list[tuple[float, int]]) -> list[float]:
    """For each attempt that ran on a killed (or stopped) worker, the time from that fault
    until the job's next attempt started."""
    by_job: dict[str, dict[int, tuple[int, float]]] = {}
    for row in starts:
        by_job.setdefault(row["job_id"], {})[row["attempt"]] = (row["pid"], float(row["t"]))
    recoveries = []
    for when, pid in kills:
        for attempts in by_job.values():
            for attempt, (ran_on, started) in attempts.items():
                if ran_on == pid and started <= when and attempt + 1 in attempts:
                    recoveries.append(attempts[attempt + 1][1] - when)
    return recoveries
