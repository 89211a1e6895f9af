"""Helpers for benchmarks that run a worker on an app of their own (``bench/inflight.py``,
``bench/procpool.py``).

``bench/throughput.py`` publishes only the no-op body, so this module adds
the pieces that differ (any message body, precise CPU, status polling,
py-spy) and reuses everything else from it and ``bench/_common.py`` by
import: ``throughput.Config`` carries the service URLs and the work
directory, ``_common.worker_process`` starts a worker on any app with extra
settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
from bench._common import BenchError, RunningWorker, cpu_seconds, tail
from bench.throughput import Config, summarize_stacks

from coldbrew.broker import Broker
from coldbrew.migrate import quote_ident
from coldbrew.topology import Topology

__all__ = [
    "Spy",
    "cpu_time",
    "declare_default_queue",
    "job_body",
    "publish_bodies",
    "render_profile",
    "services",
    "start_profile",
    "status_counts",
    "stop_profile",
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


# --- profiling ------------------------------------------------------------------------------------

PROFILE_RATE = 500


@dataclass(frozen=True, slots=True)
class Spy:
    process: asyncio.subprocess.Process
    folded: Path


async def start_profile(out_dir: Path | None, pid: int, name: str) -> Spy:
    """``py-spy record`` of ``pid`` into the existing ``out_dir``; non-blocking, no pauses."""
    beside = Path(sys.executable).parent / "py-spy"  # the venv's, when it is not on PATH
    py_spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if py_spy is None or out_dir is None:
        raise BenchError("--profile needs py-spy (pip install py-spy)")
    folded = out_dir / f"{name}.folded"
    process = await asyncio.create_subprocess_exec(
        py_spy,
        "record",
        "--pid",
        str(pid),
        "--format",
        "raw",
        "--function",
        "--nonblocking",
        "--rate",
        str(PROFILE_RATE),
        "--output",
        str(folded),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return Spy(process, folded)


async def stop_profile(spy: Spy) -> dict[str, Any] | None:
    """Stop py-spy (it writes on SIGINT) and summarize its stacks like ``throughput --profile``."""
    with contextlib.suppress(ProcessLookupError):
        spy.process.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(spy.process.wait(), timeout=30)
    except TimeoutError:
        spy.process.kill()
        await spy.process.wait()
        return None
    if not spy.folded.exists():
        return None
    summary = summarize_stacks(spy.folded.read_text())
    summary |= {"folded": str(spy.folded), "rate_hz": PROFILE_RATE}
    return summary


def render_profile(profile: dict[str, Any], what: str, top: int = 15) -> list[str]:
    """Text lines for a ``stop_profile`` summary."""
    lines = [
        f"py-spy of {what} ({profile['samples']:,} busy samples at {profile['rate_hz']} Hz; "
        f"{profile['folded']}):",
        "  what the loop was running (first frame under it), %:",
    ]
    lines += [f"    {pct:5.1f}  {name}" for name, pct in profile["entry_percent"][:top]]
    lines.append("  top functions by inclusive %:")
    lines += [f"    {pct:5.1f}  {name}" for name, pct in profile["inclusive_percent"][:top]]
    lines.append("  top functions by self %:")
    lines += [f"    {pct:5.1f}  {name}" for name, pct in profile["self_percent"][:top]]
    return lines
