"""Throughput benchmark: coldbrew against a plain aio-pika consume-and-ack loop, same broker.

Each repetition runs two sides, alternating, each on ``--jobs`` messages
pre-published (confirms pipelined, ~256 in flight) before its consumer starts:

* **raw loop**: a subprocess (uvloop, like the worker) that consumes a fresh
  durable classic priority queue and acks each message after receiving it,
  doing no work, at ``--raw-prefetch`` (300, the best plain consumer here,
  issue #19; the ratio against it is the target), and again at coldbrew's
  prefetch cap (``hold_cap``, 1000 by default: the same-prefetch ratio, a
  second line). Timed from "go" until the last
  ack has been followed by a round trip on the same channel (so the broker
  has processed every ack).
* **coldbrew**: one ``coldbrew worker bench.apps:app`` subprocess on a fresh
  namespace. The jobs are published per the message contract to
  ``<ns>.jobs`` with routing key ``default.default``; the worker inserts and
  claims each job row, runs the no-op, writes the outcome and acks. Timed
  from ``/readyz`` answering 200 until N jobs succeeded, polled every 50 ms
  (the namespace's finished-job counters, then one ``count(*)`` to confirm).

Then an idle worker's memory (VmRSS after ``--idle-seconds``) is read. The
results table goes to stdout (or JSON with ``--json``), progress to stderr.
Everything created (schemas, queues, exchanges, processes) is removed, on
errors and Ctrl-C too.

    python bench/throughput.py --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aio_pika
import asyncpg
from bench._common import (
    REPO_ROOT,
    BenchError,
    MachineCPU,
    Spread,
    add_claim_commit_argument,
    child_env,
    claim_commit_env,
    cpu_by_command,
    cpu_delta,
    cpu_seconds,
    delete_broker_entities,
    drop_namespace,
    machine_info,
    memory_kib,
    progress,
    publish_noops,
    run_main,
    stop_process,
    worker_env,
    worker_process,
)
from bench._profile import render_profile, start_profile, stop_profile

from coldbrew import logs
from coldbrew.migrate import connect_creating_database, quote_ident
from coldbrew.settings import Settings
from coldbrew.topology import MAX_PRIORITY, QueueType, Topology
from coldbrew.transport import Broker

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_DATABASE_URL = "postgresql://127.0.0.1:5432/coldbrew_bench"
SERVICE_COMMANDS = ("postgres", "beam.smp")
SCRIPT = Path(__file__).resolve()
POLL_SECONDS = 0.05
PUBLISH_WINDOW = 256
RAW_PREFETCH = 300
"""The raw loop's prefetch: the best plain aio-pika consumer here (issue #19)."""
PROFILE_RATE = 250


@dataclass
class Config:
    jobs: int
    repeat: int
    concurrency: int
    prefetch: int  # the raw loop's (--raw-prefetch)
    idle_seconds: float
    amqp_url: str
    database_url: str
    workdir: Path
    profile_dir: Path | None = None
    claim_commit: str | None = None  # COLDBREW_CLAIM_COMMIT of the worker (None: its default)
    coldbrew_prefetch: int = 0  # COLDBREW_PREFETCH of the worker (0: its default)
    queue_type: QueueType = "classic"  # COLDBREW_QUEUE_TYPE of the worker, and the raw loop's queue
    otel: str = "off"  # --otel: the worker's tracing (absent, off, on)
    same_prefetch: int = 0  # coldbrew's prefetch cap: the raw loop's second run (0: none)
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """CPU readings at one instant: the consumer process, the services, the whole machine."""

    at: float
    consumer: float
    services: dict[int, tuple[str, float]]
    machine: MachineCPU

    @classmethod
    def take(cls, pid: int) -> Snapshot:
        return cls(
            time.perf_counter(),
            cpu_seconds(pid),
            cpu_by_command(SERVICE_COMMANDS),
            MachineCPU.read(),
        )


@dataclass
class Drain:
    """One side's drain of ``jobs`` messages."""

    side: str
    jobs: int
    seconds: float
    consumer_cpu_seconds: float
    publish_seconds: float
    postgres_cpu_seconds: float
    rabbitmq_cpu_seconds: float
    machine_busy_cores: float
    machine_steal_cores: float
    peak_rss_kib: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def measured(
        cls,
        side: str,
        jobs: int,
        publish_seconds: float,
        start: Snapshot,
        end: Snapshot,
        **more: Any,
    ) -> Drain:
        seconds = more.pop("seconds", end.at - start.at)
        services = cpu_delta(start.services, end.services)
        machine = end.machine - start.machine
        return cls(
            side,
            jobs,
            seconds,
            end.consumer - start.consumer,
            publish_seconds,
            postgres_cpu_seconds=services.get("postgres", 0.0),
            rabbitmq_cpu_seconds=services.get("beam.smp", 0.0),
            machine_busy_cores=machine.busy / (end.at - start.at),
            machine_steal_cores=machine.steal / (end.at - start.at),
            **more,
        )

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    @property
    def cpu_us_per_job(self) -> float:
        return self.consumer_cpu_seconds / self.jobs * 1e6


# --- raw loop ---------------------------------------------------------------------------


def raw_queue_arguments(queue_type: str = "classic") -> dict[str, Any]:
    """Like a coldbrew job queue (classic with priorities, or quorum: one band's queue),
    minus the dead-letter exchange."""
    if queue_type == "quorum":
        return {"x-queue-type": "quorum"}
    return {"x-queue-type": "classic", "x-max-priority": MAX_PRIORITY}


async def raw_consumer(amqp_url: str, queue_name: str, count: int, prefetch: int) -> None:
    """The raw side's subprocess: wait for "go", consume-and-ack ``count``, report, wait for EOF."""
    loop = asyncio.get_running_loop()
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.declare_queue(queue_name, passive=True)
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        started = time.perf_counter()
        acked = 0
        async with queue.iterator() as messages:
            async for message in messages:
                await message.ack()
                acked += 1
                if acked >= count:
                    break
        # a synchronous round trip on the same channel: every ack before it has been processed
        left = await channel.declare_queue(queue_name, passive=True)
        elapsed = time.perf_counter() - started
        result = {"acked": acked, "seconds": elapsed, "left": left.declaration_result.message_count}
        print(json.dumps(result), flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # the parent reads our CPU first
    finally:
        await connection.close()


async def run_raw(cfg: Config, index: int, prefetch: int) -> Drain:
    queue_name = f"cbbench_{cfg.run_id}.raw{prefetch}.{index}"
    process: asyncio.subprocess.Process | None = None
    try:
        connection = await aio_pika.connect(cfg.amqp_url)
        try:
            channel = await connection.channel(publisher_confirms=True)
            await channel.declare_queue(
                queue_name, durable=True, arguments=raw_queue_arguments(cfg.queue_type)
            )
            publish_seconds = await publish_noops(
                channel.default_exchange,
                queue_name,
                cfg.jobs,
                id_prefix=f"raw{prefetch}-{cfg.run_id}-{index}",
                window=PUBLISH_WINDOW,
            )
        finally:
            await connection.close()
        progress(f"raw #{index + 1}: published {cfg.jobs} in {publish_seconds:.1f} s; consuming")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            "--raw-consumer",
            queue_name,
            "--jobs",
            str(cfg.jobs),
            "--prefetch",
            str(prefetch),
            "--amqp-url",
            cfg.amqp_url,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=child_env({}),
            start_new_session=True,
        )
        assert process.stdin is not None
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout=60)
        if line.strip() != b"ready":
            raise BenchError(f"raw consumer did not start (said {line!r})")
        start = Snapshot.take(process.pid)
        process.stdin.write(b"go\n")
        await process.stdin.drain()
        line = await asyncio.wait_for(process.stdout.readline(), timeout=max(120, cfg.jobs / 50))
        end = Snapshot.take(process.pid)
        peak = memory_kib(process.pid).get("VmHWM")
        if not line:
            raise BenchError("raw consumer exited before reporting")
        report = json.loads(line)
        if report["acked"] != cfg.jobs or report["left"] != 0:
            raise BenchError(f"raw consumer drained wrongly: {report}")
        process.stdin.close()
        await asyncio.wait_for(process.wait(), timeout=30)
        return Drain.measured(
            "raw",
            cfg.jobs,
            publish_seconds,
            start,
            end,
            seconds=report["seconds"],
            peak_rss_kib=peak,
        )
    finally:
        if process is not None:
            await stop_process(process, grace=10)
        await delete_broker_entities(cfg.amqp_url, [queue_name], [])


# --- coldbrew -------------------------------------------------------------------------------


async def coldbrew_cli(cfg: Config, namespace: str, *args: str) -> None:
    """Run ``python -m coldbrew ARGS`` to completion; raise with its output if it fails."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "coldbrew",
        *args,
        env=worker_env(cfg, namespace, 0),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cfg.workdir,
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise BenchError(f"coldbrew {' '.join(args)} exited {process.returncode}: {out.decode()}")


@contextlib.asynccontextmanager
async def namespace_for(cfg: Config, label: str) -> Any:
    """A fresh migrated namespace, dropped (schema, queues, exchanges) on the way out."""
    namespace = f"cbbench_{secrets.token_hex(4)}"
    try:
        await coldbrew_cli(cfg, namespace, "migrate")
        progress(f"{label}: namespace {namespace} migrated")
        yield namespace
    finally:
        await drop_namespace(cfg.amqp_url, cfg.database_url, namespace)


async def prepublish(cfg: Config, namespace: str, index: int) -> float:
    """Declare the namespace's topology as a worker would, then publish the jobs; return seconds."""
    topology = Topology(namespace, cfg.queue_type)
    broker = Broker(cfg.amqp_url, topology, name="coldbrew-bench-declare")
    await broker.connect()
    try:
        await broker.declare_job_queue("default", "default")
    finally:
        await broker.close()
    connection = await aio_pika.connect(cfg.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(topology.jobs_exchange)
        seconds = await publish_noops(
            exchange,
            "default.default",
            cfg.jobs,
            id_prefix=f"{namespace}-{index}",
            window=PUBLISH_WINDOW,
        )
        ready = 0
        for name in topology.job_queues("default", "default"):  # quorum: the bands' queues
            queue = await channel.declare_queue(name, passive=True)
            ready += queue.declaration_result.message_count
    finally:
        await connection.close()
    if ready != cfg.jobs:
        raise BenchError(f"expected {cfg.jobs} messages in the job queue, found {ready}")
    return seconds


async def wait_succeeded(
    cfg: Config,
    conn: asyncpg.Connection,
    namespace: str,
    process: asyncio.subprocess.Process,
    label: str,
) -> tuple[int, float]:
    """Poll every 50 ms until ``cfg.jobs`` rows succeeded; return (polls, seconds spent in them).

    Polls read the finished-job counters the completion batches update in
    their own transaction (a few rows) rather than ``count(*)`` over the
    growing job table, whose scans cost PostgreSQL ~12 µs of CPU per job in a
    20,000-job drain: measurement overhead that was charged to coldbrew. Once
    the counters reach N, one ``count(*)`` confirms every row succeeded.
    """
    finished_sql = f"SELECT coalesce(sum(finished), 0) FROM {quote_ident(namespace)}.queue_counters"
    count_sql = f"SELECT count(*) FROM {quote_ident(namespace)}.jobs WHERE status = 'succeeded'"
    deadline = time.perf_counter() + max(120.0, cfg.jobs / 100)
    next_poll = time.perf_counter()
    polls, polling = 0, 0.0
    while True:
        before = time.perf_counter()
        done = await conn.fetchval(finished_sql)
        if done >= cfg.jobs:
            done = await conn.fetchval(count_sql)
        polls += 1
        polling += time.perf_counter() - before
        if done >= cfg.jobs:
            return polls, polling
        now = time.perf_counter()
        if process.returncode is not None or now > deadline:
            raise BenchError(f"{label}: {done}/{cfg.jobs} succeeded when it stopped")
        next_poll += POLL_SECONDS
        await asyncio.sleep(max(0.0, next_poll - now))


async def run_coldbrew(cfg: Config, index: int) -> Drain:
    label = f"coldbrew #{index + 1}"
    async with namespace_for(cfg, label) as namespace:
        publish_seconds = await prepublish(cfg, namespace, index)
        progress(f"{label}: published {cfg.jobs} in {publish_seconds:.1f} s; starting the worker")
        conn = await asyncpg.connect(cfg.database_url)
        try:
            commits0 = await conn.fetchval(COMMITS_SQL)
            claim_env = claim_commit_env(cfg.claim_commit)
            if cfg.coldbrew_prefetch:
                claim_env["COLDBREW_PREFETCH"] = str(cfg.coldbrew_prefetch)
            claim_env["COLDBREW_QUEUE_TYPE"] = cfg.queue_type
            app_ref = "bench.otel_apps:app" if cfg.otel == "on" else "bench.apps:app"
            if cfg.otel == "absent":  # import opentelemetry fails, as without the extra
                hidden = SCRIPT.parent / "no_otel"
                claim_env["PYTHONPATH"] = f"{hidden}{os.pathsep}{REPO_ROOT}"
            async with worker_process(
                cfg, namespace, label, extra_env=claim_env, app_ref=app_ref
            ) as worker:
                start = Snapshot.take(worker.pid)
                polls, polling = await wait_succeeded(cfg, conn, namespace, worker.process, label)
                end = Snapshot.take(worker.pid)
                peak = memory_kib(worker.pid).get("VmHWM")
            extra = await drain_facts(conn, namespace, cfg.jobs, commits0, polls)
            extra["poll_ms_mean"] = polling / polls * 1000
        finally:
            await conn.close()
    return Drain.measured(
        "coldbrew", cfg.jobs, publish_seconds, start, end, peak_rss_kib=peak, extra=extra
    )


COMMITS_SQL = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


async def drain_facts(
    conn: asyncpg.Connection, namespace: str, jobs: int, commits0: int, polls: int
) -> dict[str, Any]:
    """After the worker stopped: final statuses, retries, and PostgreSQL's own counters.

    Commits per job come from ``pg_stat_database`` for the whole bench database
    (the worker's batches, its periodic loops and start-up; our polls are
    subtracted), so about 2 / (commits per job) jobs went in each claim and
    completion batch. Tuple counters come from ``pg_stat_user_tables``.
    """
    table = f"{quote_ident(namespace)}.jobs"
    statuses = dict(await conn.fetch(f"SELECT status::text, count(*) FROM {table} GROUP BY 1"))
    retried = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE attempt > 1")
    await asyncio.sleep(0.6)  # exited backends' statistics are flushed at exit; give it a moment
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    commits = await conn.fetchval(COMMITS_SQL) - commits0 - polls
    tuples = await conn.fetchrow(
        "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE schemaname = $1 AND relname = 'jobs'",
        namespace,
    )
    facts: dict[str, Any] = {
        "statuses": statuses,
        "attempt_gt_1": retried,
        "commits_per_job": commits / jobs,
    }
    if tuples is not None:
        facts |= {
            "inserts_per_job": tuples["n_tup_ins"] / jobs,
            "updates_per_job": tuples["n_tup_upd"] / jobs,
            "hot_update_share": tuples["n_tup_hot_upd"] / max(1, tuples["n_tup_upd"]),
        }
    return facts


async def idle_memory(cfg: Config) -> dict[str, Any]:
    """RSS of a ready worker after ``idle_seconds`` with nothing to do."""
    async with (
        namespace_for(cfg, "idle") as namespace,
        worker_process(cfg, namespace, "idle") as worker,
    ):
        progress(f"idle: worker ready (pid {worker.pid}); idling {cfg.idle_seconds:g} s")
        cpu0 = cpu_seconds(worker.pid)
        await asyncio.sleep(cfg.idle_seconds)
        cpu1 = cpu_seconds(worker.pid)
        memory = memory_kib(worker.pid)
        children = _child_pids(worker.pid)
    return {
        "rss_kib": memory["VmRSS"],
        "peak_rss_kib": memory["VmHWM"],
        "idle_cpu_percent": (cpu1 - cpu0) / cfg.idle_seconds * 100,
        "child_processes": children,
    }


async def profile_drain(cfg: Config, out_dir: Path) -> dict[str, Any]:
    """One more, unmeasured coldbrew drain with py-spy sampling the worker (collapsed stacks)."""
    label = "profile"
    async with namespace_for(cfg, label) as namespace:
        await prepublish(cfg, namespace, cfg.repeat)
        conn = await asyncpg.connect(cfg.database_url)
        try:
            async with worker_process(cfg, namespace, label) as worker:
                spy = await start_profile(out_dir, worker.pid, "worker", rate=PROFILE_RATE)
                try:
                    started = time.perf_counter()
                    await wait_succeeded(cfg, conn, namespace, worker.process, label)
                    seconds = time.perf_counter() - started
                finally:
                    summary = await stop_profile(spy)
        finally:
            await conn.close()
    if summary is None:
        raise BenchError(f"py-spy wrote no profile to {spy.folded}")
    summary["rate"] = cfg.jobs / seconds
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(part) for part in text.split()]


# --- the run --------------------------------------------------------------------------------


async def run(cfg: Config) -> dict[str, Any]:
    logs.configure("json", "warning")  # coldbrew's own log lines stay off stdout
    conn = await connect_creating_database(cfg.database_url)  # fail fast, create it if missing
    await conn.close()
    machine = await machine_info(cfg.amqp_url, cfg.database_url)
    progress(
        f"{cfg.jobs} jobs x {cfg.repeat} repeats, concurrency {cfg.concurrency}, "
        f"prefetch {cfg.prefetch}, claim commit {cfg.claim_commit or 'default'}, "
        f"{cfg.queue_type} queues; "
        f"RabbitMQ {machine['rabbitmq']}, "
        f"PostgreSQL {machine['postgresql']}, {machine['nproc']} CPUs"
    )
    raw: list[Drain] = []
    same: list[Drain] = []
    cold: list[Drain] = []
    for index in range(cfg.repeat):
        raw.append(await run_raw(cfg, index, cfg.prefetch))
        progress(f"raw #{index + 1}: {raw[-1].rate:,.0f} msg/s ({raw[-1].seconds:.2f} s)")
        cold.append(await run_coldbrew(cfg, index))
        progress(f"coldbrew #{index + 1}: {cold[-1].rate:,.0f} jobs/s ({cold[-1].seconds:.2f} s)")
        if cfg.same_prefetch and cfg.same_prefetch != cfg.prefetch:
            same.append(await run_raw(cfg, index, cfg.same_prefetch))
            progress(f"raw@{cfg.same_prefetch} #{index + 1}: {same[-1].rate:,.0f} msg/s")
    idle = await idle_memory(cfg)
    progress(f"idle: VmRSS {idle['rss_kib'] / 1024:.1f} MiB")
    result = summarize(cfg, machine, raw, cold, idle, same or raw)
    if cfg.profile_dir is not None:
        cfg.profile_dir.mkdir(parents=True, exist_ok=True)
        result["profile"] = await profile_drain(cfg, cfg.profile_dir)
        progress(f"profile: written to {cfg.profile_dir}")
    return result


def summarize(
    cfg: Config,
    machine: dict[str, Any],
    raw: list[Drain],
    cold: list[Drain],
    idle: dict[str, Any],
    same: list[Drain],
) -> dict[str, Any]:
    ratios = [c.rate / r.rate for r, c in zip(raw, cold, strict=True)]
    same_ratios = [c.rate / r.rate for r, c in zip(same, cold, strict=True)]

    def side(drains: list[Drain]) -> dict[str, Any]:
        def per_job(values: list[float]) -> float:
            return statistics.median(values) / cfg.jobs * 1e6

        return {
            "rate": Spread.of([d.rate for d in drains]).as_dict(),
            "seconds": Spread.of([d.seconds for d in drains]).as_dict(),
            "cpu_us_per_job": Spread.of([d.cpu_us_per_job for d in drains]).as_dict(),
            "postgres_cpu_us_per_job": per_job([d.postgres_cpu_seconds for d in drains]),
            "rabbitmq_cpu_us_per_job": per_job([d.rabbitmq_cpu_seconds for d in drains]),
            "machine_busy_cores": Spread.of([d.machine_busy_cores for d in drains]).as_dict(),
            "machine_steal_cores": Spread.of([d.machine_steal_cores for d in drains]).as_dict(),
            "runs": [asdict(d) | {"rate": d.rate} for d in drains],
        }

    return {
        "config": {
            "jobs": cfg.jobs,
            "repeat": cfg.repeat,
            "concurrency": cfg.concurrency,
            "prefetch": cfg.prefetch,
            "same_prefetch": cfg.same_prefetch,
            "claim_commit": cfg.claim_commit or "default",
            "queue_type": cfg.queue_type,
            "otel": cfg.otel,
            "poll_seconds": POLL_SECONDS,
            "publish_window": PUBLISH_WINDOW,
        },
        "machine": machine,
        "raw": side(raw),
        "raw_same_prefetch": side(same),
        "coldbrew": side(cold),
        "ratio": {"median": statistics.median(ratios), "per_pair": ratios, "target": 0.8},
        "same_prefetch_ratio": {"median": statistics.median(same_ratios), "per_pair": same_ratios},
        "idle": idle | {"target_mib": 80},
    }


def render(result: dict[str, Any]) -> str:
    cfg, raw, cold = result["config"], result["raw"], result["coldbrew"]
    ratio, idle = result["ratio"], result["idle"]
    same = result["same_prefetch_ratio"]

    def row(name: str, side: dict[str, Any]) -> str:
        rate, secs, cpu = side["rate"], side["seconds"], side["cpu_us_per_job"]
        spread = f"{rate['min']:,.0f}-{rate['max']:,.0f}"
        return (
            f"{name:<10} {rate['median']:>10,.0f} {spread:>13} {secs['median']:>7.2f} "
            f"{cpu['median']:>9,.0f} {side['postgres_cpu_us_per_job']:>6,.0f} "
            f"{side['rabbitmq_cpu_us_per_job']:>6,.0f} "
            f"{side['machine_busy_cores']['median']:>6.2f} "
            f"{side['machine_steal_cores']['median']:>6.2f}"
        )

    ratio_ok = "met" if ratio["median"] >= ratio["target"] else "MISSED"
    rss_mib = idle["rss_kib"] / 1024
    rss_ok = "met" if rss_mib < idle["target_mib"] else "MISSED"
    pairs = ", ".join(f"{r:.2f}" for r in ratio["per_pair"])
    machine = result["machine"]
    dirty = " + uncommitted src changes" if machine.get("src_modified") else ""
    lines = [
        f"coldbrew throughput: {cfg['jobs']:,} no-op jobs, {cfg['repeat']} repeats, "
        f"concurrency {cfg['concurrency']}, prefetch {cfg['prefetch']}, "
        f"claim commit {cfg.get('claim_commit', 'default')}, "
        f"{cfg.get('queue_type', 'classic')} queues",
        f"coldbrew {machine.get('coldbrew_commit') or '?'}{dirty}; {machine['nproc']} x "
        f"{machine['cpu_model']}, {machine['ram_gib']} GiB; RabbitMQ {machine['rabbitmq']}, "
        f"PostgreSQL {machine['postgresql']}, Python {machine['python']}",
        "",
        f"{'':<10} {'jobs/s':>10} {'jobs/s':>13} {'drain':>7} "
        f"{'---- CPU us/job ----':>23} {'machine cores':>13}",
        f"{'side':<10} {'median':>10} {'min-max':>13} {'s':>7} "
        f"{'consumer':>9} {'pg':>6} {'rmq':>6} {'busy':>6} {'steal':>6}",
        row(f"raw@{cfg['prefetch']}", raw),
        *(
            [row(f"raw@{cfg['same_prefetch']}", result["raw_same_prefetch"])]
            if cfg["same_prefetch"] != cfg["prefetch"]
            else []
        ),
        row("coldbrew", cold),
        "(medians; consumer = the raw loop or worker process; pg, rmq = all postgres and",
        " beam.smp processes; busy, steal = whole machine, from /proc/stat, during the drain)",
        "",
        f"ratio coldbrew/raw@{cfg['prefetch']} (median of pairs): {ratio['median']:.2f}  "
        f"[pairs: {pairs}]  target >= {ratio['target']}: {ratio_ok}",
        f"ratio coldbrew/raw@{cfg['same_prefetch']} (coldbrew's prefetch cap): "
        f"{same['median']:.2f}  [pairs: {', '.join(f'{r:.2f}' for r in same['per_pair'])}]",
        f"idle worker VmRSS: {rss_mib:.1f} MiB (peak {idle['peak_rss_kib'] / 1024:.1f} MiB, "
        f"{idle['idle_cpu_percent']:.1f}% CPU idle, {len(idle['child_processes'])} child "
        f"processes)  target < {idle['target_mib']} MB: {rss_ok}",
    ]
    peaks = [r["peak_rss_kib"] for r in cold["runs"] if r["peak_rss_kib"]]
    if peaks:
        lines.append(f"worker peak RSS during the drains: {max(peaks) / 1024:.1f} MiB")
    facts = [r["extra"] for r in cold["runs"]]
    if facts and "commits_per_job" in facts[0]:
        commits = statistics.median(f["commits_per_job"] for f in facts)
        line = (
            f"coldbrew in PostgreSQL (median): {commits:.3f} commits/job "
            f"(~{2 / commits:.0f} jobs per claim or completion batch: each batch is one "
            "commit on a connection of its own)"
        )
        if "updates_per_job" in facts[0]:
            line += (
                f", {statistics.median(f['updates_per_job'] for f in facts):.2f} updates/job, "
                f"{statistics.median(f['hot_update_share'] for f in facts) * 100:.0f}% HOT"
            )
        poll = statistics.median(f["poll_ms_mean"] for f in facts)
        lines.append(line + f"; the 50 ms completion poll took {poll:.1f} ms on average")
        odd = [f for f in facts if f["attempt_gt_1"] or set(f["statuses"]) != {"succeeded"}]
        if odd:
            lines.append(f"WARNING: runs with retries or other statuses: {odd}")
    if "profile" in result:
        profile = result["profile"]
        lines.append("")
        lines.extend(
            render_profile(profile, f"one more drain ({profile['rate']:,.0f} jobs/s while sampled)")
        )
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--jobs", type=int, default=None, help="messages per drain (20000; --quick 5000)"
    )
    parser.add_argument("--repeat", type=int, default=None, help="pairs of drains (3; --quick 1)")
    parser.add_argument(
        "--quick", action="store_true", help="5,000 jobs, 1 pair, 1 s idle: for development"
    )
    parser.add_argument(
        "--concurrency", type=int, default=100, help="COLDBREW_CONCURRENCY of the worker (100)"
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=None, help="idle time before reading RSS (5)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        type=Path,
        help="after the measured runs, one more coldbrew drain sampled by py-spy into DIR",
    )
    parser.add_argument("--amqp-url", default=DEFAULT_AMQP_URL)
    parser.add_argument(
        "--database-url",
        default=DEFAULT_DATABASE_URL,
        help=f"created if missing (default {DEFAULT_DATABASE_URL})",
    )
    add_claim_commit_argument(parser)
    parser.add_argument(
        "--coldbrew-prefetch",
        type=int,
        default=0,
        help="COLDBREW_PREFETCH of the worker, its prefetch cap (0: coldbrew's default, 1000)",
    )
    parser.add_argument(
        "--raw-prefetch",
        type=int,
        default=RAW_PREFETCH,
        help=f"the raw loop's prefetch (the ratio's reference; {RAW_PREFETCH})",
    )
    parser.add_argument(
        "--queue-type",
        choices=("classic", "quorum"),
        default="classic",
        help="COLDBREW_QUEUE_TYPE of the worker, and the raw loop's queue type (classic)",
    )
    parser.add_argument(
        "--otel",
        choices=("absent", "off", "on"),
        default="off",
        help="the worker's tracing: absent (opentelemetry hidden, as without the otel extra),"
        " off (default: as installed here, no tracer provider), on (an SDK provider, spans"
        " batched and dropped)",
    )
    parser.add_argument("--raw-consumer", metavar="QUEUE", help=argparse.SUPPRESS)
    parser.add_argument("--prefetch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    for name, full, short in (
        ("jobs", 20_000, 5_000),
        ("repeat", 3, 1),
        ("idle_seconds", 5.0, 1.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    if args.jobs < 1 or args.repeat < 1 or args.concurrency < 1:
        parser.error("--jobs, --repeat and --concurrency must be positive")
    if not 0 <= args.coldbrew_prefetch <= 65_535:
        parser.error("--coldbrew-prefetch must be in 0..65535")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    claim_commit = {"claim_commit": args.claim_commit} if args.claim_commit else {}
    same_prefetch = Settings.model_construct(
        concurrency=args.concurrency, prefetch=args.coldbrew_prefetch, **claim_commit
    ).hold_cap
    if args.raw_consumer:
        import uvloop

        uvloop.run(raw_consumer(args.amqp_url, args.raw_consumer, args.jobs, args.prefetch))
        return 0

    def config(workdir: Path) -> Config:
        return Config(
            jobs=args.jobs,
            repeat=args.repeat,
            concurrency=args.concurrency,
            prefetch=args.raw_prefetch,
            same_prefetch=same_prefetch,
            idle_seconds=args.idle_seconds,
            amqp_url=args.amqp_url,
            database_url=args.database_url,
            workdir=workdir,
            profile_dir=args.profile,
            claim_commit=args.claim_commit,
            coldbrew_prefetch=args.coldbrew_prefetch,
            queue_type=args.queue_type,
            otel=args.otel,
        )

    return run_main(config, run, render, json_output=args.json, workdir_prefix="cbbench-")


if __name__ == "__main__":
    sys.exit(main())
