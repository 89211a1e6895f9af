"""Helpers for benchmarks that run a worker on an app of their own (``bench/inflight.py``,
``bench/procpool.py``).

``bench/throughput.py`` publishes only the no-op body, so this module adds
the pieces that differ (any message body, precise CPU, status polling,
py-spy in ``_profile.py``) and reuses everything else from it and ``bench/_common.py`` by
import: ``throughput.Config`` carries the service URLs and the work
directory, ``_common.worker_process`` starts a worker on any app with extra
settings.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
from bench._common import BenchError, RunningWorker, cpu_seconds, tail
from bench.throughput import Config

from coldbrew.migrate import quote_ident
from coldbrew.topology import Topology
from coldbrew.transport import Broker

__all__ = [
    "cpu_time",
    "declare_default_queue",
    "job_body",
    "publish_bodies",
    "services",
    "status_counts",
    "wait_status_count",
]

ROUTING_KEY = "default.default"


def services(amqp_url: str, database_url: str, workdir: Path) -> Config:
    """A ``throughput.Config`` used only for its URLs and work directory (the helpers take it)."""
    return Config(
        jobs=0,
        repeat=0,
        concurrency=1,
        prefetch=1,
        idle_seconds=0.0,
        amqp_url=amqp_url,
        database_url=database_url,
        workdir=workdir,
    )


# --- CPU ------------------------------------------------------------------------------


def cpu_time(pid: int) -> float:
    """CPU seconds of a process (all live threads) with microsecond resolution.

    ``/proc/<pid>/stat`` counts in 10 ms ticks, too coarse for a heartbeat
    round of a few tens of ms; ``se.sum_exec_runtime`` in each thread's
    ``sched`` file is the scheduler's own ns-precise total (shown in ms).
    Falls back to the ticks when the file is missing. Threads that already
    exited are not counted (the worker's threads live as long as it does).
    """
    total = 0.0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        for task in tasks:
            for line in (task / "sched").read_text().splitlines():
                if line.startswith("se.sum_exec_runtime"):
                    total += float(line.rsplit(":", 1)[1]) / 1000.0
                    break
            else:
                raise ValueError("no se.sum_exec_runtime")
    except (OSError, ValueError):
        return cpu_seconds(pid)
    return total


# --- publishing ----------------------------------------------------------------------------


def job_body(job_type: str, args: Mapping[str, Any]) -> bytes:
    """A message body per the contract."""
    return json.dumps({"type": job_type, "args": dict(args)}, separators=(",", ":")).encode()


async def declare_default_queue(amqp_url: str, namespace: str) -> None:
    """Declare the namespace's exchanges and ``default.default`` queue with coldbrew's Broker."""
    broker = Broker(amqp_url, Topology(namespace), name="coldbrew-bench-declare")
    await broker.connect()
    try:
        await broker.declare_job_queue("default", "default")
    finally:
        await broker.close()


async def publish_bodies(
    amqp_url: str, namespace: str, body: bytes, count: int, *, id_prefix: str, window: int = 256
) -> float:
    """Publish ``count`` copies of ``body`` to ``<ns>.jobs`` per the contract; return seconds.

    Like ``_common.publish_noops`` (persistent, JSON, unique ``message_id``,
    confirms pipelined ``window`` deep), with any body.
    """
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(Topology(namespace).jobs_exchange)
        limit = asyncio.Semaphore(window)
        started = time.perf_counter()

        async def one(index: int) -> None:
            message = aio_pika.Message(
                body,
                message_id=f"{id_prefix}-{index}",
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            try:
                await exchange.publish(message, routing_key=ROUTING_KEY, timeout=60)
            finally:
                limit.release()

        tasks: list[asyncio.Task[None]] = []
        try:
            for index in range(count):
                await limit.acquire()
                tasks.append(asyncio.create_task(one(index)))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return time.perf_counter() - started
    finally:
        await connection.close()


# --- the jobs table --------------------------------------------------------------------------


async def status_counts(conn: asyncpg.Connection, namespace: str) -> dict[str, int]:
    rows = await conn.fetch(
        f"SELECT status::text, count(*) FROM {quote_ident(namespace)}.jobs GROUP BY 1"
    )
    return {row[0]: row[1] for row in rows}


async def wait_status_count(
    conn: asyncpg.Connection,
    namespace: str,
    status: str,
    target: int,
    worker: RunningWorker,
    *,
    poll: float,
    timeout: float,
    label: str,
    polls: list[int] | None = None,
) -> float:
    """Poll until ``target`` rows have ``status``; return ``time.time()`` when a poll saw it.

    Each poll appends 1 to ``polls`` when given (its transactions are subtracted from counts).
    """
    sql = f"SELECT count(*) FROM {quote_ident(namespace)}.jobs WHERE status = $1"
    deadline = time.perf_counter() + timeout
    while True:
        count = await conn.fetchval(sql, status)
        if polls is not None:
            polls.append(1)
        if count >= target:
            return time.time()
        if worker.process.returncode is not None:
            raise BenchError(
                f"{label}: worker exited {worker.process.returncode} with {count}/{target} "
                f"{status}:\n{tail(worker.log_path)}"
            )
        if time.perf_counter() > deadline:
            counts = await status_counts(conn, namespace)
            raise BenchError(f"{label}: {count}/{target} {status} after {timeout:g} s: {counts}")
        await asyncio.sleep(poll)
