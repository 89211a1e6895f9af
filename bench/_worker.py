"""Helpers for benchmarks that run a worker on an app of their own (``bench/inflight.py``,
``bench/procpool.py``).

``bench/throughput.py`` hard-wires ``bench.apps:app`` and the no-op body, so
this module generalises the few pieces that differ (app reference, extra
worker settings, message body) and reuses everything else from it and
``bench/_common.py`` by import: its ``Config`` carries the service URLs and
the work directory, ``namespace_for`` migrates and drops a namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
from bench._common import (
    cpu_seconds,
    free_port,
    http_status,
    progress,
    stop_process,
    tail,
)
from bench.throughput import BenchError, Config, summarize_stacks, worker_env

from coldbrew.broker import Broker
from coldbrew.migrate import quote_ident
from coldbrew.topology import Topology

__all__ = [
    "RunningWorker",
    "Spy",
    "cpu_time",
    "declare_default_queue",
    "http_get",
    "install_sigterm",
    "job_body",
    "publish_bodies",
    "render_profile",
    "scrape_metrics",
    "services",
    "start_profile",
    "status_counts",
    "stop_profile",
    "wait_status_count",
    "worker_process",
]

ROUTING_KEY = "default.default"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


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


def install_sigterm(cfg: Config) -> None:
    """SIGTERM cancels the main task, like Ctrl-C, so every ``finally`` cleans up."""
    main_task = asyncio.current_task()
    assert main_task is not None

    def terminate() -> None:
        cfg.terminated = True
        main_task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate)


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


# --- the worker ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunningWorker:
    process: asyncio.subprocess.Process
    port: int
    log_path: Path
    ready_at: float
    """``time.time()`` when ``/readyz`` first answered 200."""

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.asynccontextmanager
async def worker_process(
    cfg: Config,
    namespace: str,
    label: str,
    *,
    app_ref: str,
    settings: Mapping[str, str],
    stop_grace: float = 30.0,
    stop_times: dict[str, float] | None = None,
) -> AsyncIterator[RunningWorker]:
    """``coldbrew worker APP_REF`` with throughput's env plus ``settings``, ready (``/readyz``).

    SIGTERMed on the way out (SIGKILL after ``stop_grace``); the seconds from
    SIGTERM to exit go to ``stop_times["stop_seconds"]`` when given.
    """
    port = free_port()
    log_path = cfg.workdir / f"worker-{namespace}.log"
    env = worker_env(cfg, namespace, port) | dict(settings)
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "coldbrew",
            "worker",
            app_ref,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=cfg.workdir,
            start_new_session=True,
        )
    try:
        started = time.perf_counter()
        while await http_status(port, "/readyz") != 200:
            if process.returncode is not None:
                raise BenchError(f"{label}: worker exited {process.returncode}:\n{tail(log_path)}")
            if time.perf_counter() - started > 90:
                raise BenchError(f"{label}: worker not ready after 90 s:\n{tail(log_path)}")
            await asyncio.sleep(0.02)
        yield RunningWorker(process, port, log_path, time.time())
    finally:
        stopping = time.perf_counter()
        await stop_process(process, grace=stop_grace)
        if stop_times is not None:
            stop_times["stop_seconds"] = time.perf_counter() - stopping
        if process.returncode not in (0, None):
            progress(f"{label}: worker exited {process.returncode}; log tail:\n{tail(log_path)}")


async def http_get(port: int, path: str, timeout: float = 5.0) -> bytes | None:
    """Body of ``GET http://127.0.0.1:<port><path>`` when it answers 200, else None."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                writer.write(request.encode())
                await writer.drain()
                data = await reader.read()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    return body if head.split(b" ", 2)[1:2] == [b"200"] else None


async def scrape_metrics(port: int) -> dict[str, float]:
    """The worker's ``/metrics``, each metric's samples summed over labels (empty on failure)."""
    body = await http_get(port, "/metrics")
    found: dict[str, float] = {}
    if body is None:
        return found
    for line in body.decode().splitlines():
        match = _SAMPLE.match(line)
        if match:
            name = match.group(1)
            found[name] = found.get(name, 0.0) + float(match.group(3))
    return found


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
