"""Fairness benchmark (issue #4): who starts when, under one tenant's burst, priorities and caps.

Five scenarios, each on fresh namespaces with ``coldbrew worker
bench.fairness_app:app`` subprocesses (one coroutine job, ``work``, that
sleeps ``ms`` and returns its publish, start and end wall times):

* **burst**: tenant ``a`` has 10,000 jobs of 20 ms queued; the worker starts,
  and 0.5 s later (every slot busy) 20 other tenants publish one job each.
  Their start delay under coldbrew, against the same load through one shared
  FIFO queue drained by a plain aio-pika consumer of the same concurrency
  (coroutine sleep of 20 ms per message, late ack). Target: all 20 start
  within 1 s under coldbrew.
* **priority**: a priority-9 job published behind 5,000 priority-0 jobs of
  the same tenant, 0.5 s after the worker started. Target: starts within 0.5 s.
* **aging**: a feeder keeps tenant ``s``'s queue stocked with priority-9 jobs
  of 1 s +-50% (a stream that alone fills every slot); then one priority-0 job,
  (a) of another tenant, (b) of ``s`` itself. Target: it starts within
  ``COLDBREW_AGING_SECONDS`` + 1 s while the stream still runs.
* **caps**: ``coldbrew tenants set b --max-running 3`` and two workers. The
  other tenants' jobs/s without ``b``, then with ``b``'s backlog waiting; ``b``'s
  running rows sampled every 15 ms, and its exact overlap from the jobs' own
  start and end times. Target: never more than 3, others' rate >= 0.9x.
* **scale**: a worker consuming 1,000 tenant queues: start-up, idle RSS and
  CPU, and how fast it drains one job from each tenant (against the same
  worker with one queue, and 1,000 jobs on one tenant's queue).

The report (or JSON with ``--json``) goes to stdout, progress to stderr; every
namespace, queue and process created is removed, on errors and Ctrl-C too.

    flock /tmp/coldbrew-heavy.lock python bench/fairness.py   # everything, ~5.5 minutes
    python bench/fairness.py --quick --scenarios burst,priority
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aio_pika
import asyncpg
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from bench._common import (
    SERVICE_ERRORS,
    BenchError,
    RunningWorker,
    Spread,
    child_env,
    cpu_seconds,
    delete_broker_entities,
    drop_namespace,
    machine_info,
    memory_kib,
    progress,
    run_main,
    scrape_metrics,
    stop_process,
    worker_process,
)
from bench.throughput import (
    DEFAULT_AMQP_URL,
    DEFAULT_DATABASE_URL,
    coldbrew_cli,
    namespace_for,
    raw_queue_arguments,
)
from bench.throughput import Config as BaseConfig

from coldbrew import logs
from coldbrew.migrate import connect_creating_database, quote_ident
from coldbrew.settings import Settings
from coldbrew.store import JobStore
from coldbrew.topology import Topology
from coldbrew.transport import Broker

SCRIPT = Path(__file__).resolve()
APP = "bench.fairness_app:app"
SCENARIOS = ("burst", "priority", "aging", "caps", "scale")
JOB_MS = 20.0
STREAM_JOB_MS = 1000.0  # mean; each stream job draws its length from +-50% of it
CAP = 3
CAPPED_JOB_MS = 100.0
CAPS_HEAD_START = 1.0
CAP_WAITS = "coldbrew_cap_waits_total"
AGING_WARMUP = 2.0
AGING_MARGIN = 5.0
SAMPLE_SECONDS = 0.015
POLL_SECONDS = 0.05
PUBLISH_WINDOW = 256
PROBE = "probe-"
LINE_LIMIT = 64 * 1024 * 1024
RETRIES = 2
DECLARE_CONNECTIONS = 8
RETRY_PAUSE = 10.0


@dataclass(frozen=True, slots=True)
class Sizes:
    burst_backlog: int
    burst_tenants: int
    priority_backlog: int
    caps_tenants: int
    caps_jobs_per_tenant: int
    caps_b_jobs: int
    scale_tenants: int
    idle_seconds: float


FULL = Sizes(10_000, 20, 5_000, 4, 2_500, 450, 1_000, 10.0)
QUICK = Sizes(2_000, 20, 2_000, 4, 500, 150, 200, 3.0)


@dataclass
class Bench:
    base: BaseConfig  # throughput's config: URLs, concurrency, workdir (for its helpers)
    sizes: Sizes
    quick: bool
    scenarios: tuple[str, ...]
    repeat: int
    scale_repeat: int
    aging_seconds: float
    prefetch: int | None  # COLDBREW_PREFETCH; None leaves the worker's default (auto)
    lag: float
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    declared: dict[str, list[str]] = field(default_factory=dict)  # namespace -> queues
    created: set[str] = field(default_factory=set)  # namespaces, until their schema is gone
    log_dir: Path | None = None  # keep the workers' logs here (default: a temporary directory)

    @property
    def concurrency(self) -> int:
        return self.base.concurrency


# --- jobs, publishing, provisioning -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Msg:
    """One job to publish: routing key (``<queue>.<tenant>``, or a queue name), id, duration."""

    key: str
    id: str
    ms: float
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Ran:
    """One finished job, with the wall times the job itself recorded."""

    id: str
    tenant: str
    priority: int
    published: float
    started: float
    finished: float

    @property
    def probe(self) -> bool:
        return self.id.startswith(PROBE)


def job_body(ms: float, published: float) -> bytes:
    document = {"type": "work", "args": {"ms": ms, "published": published}}
    return json.dumps(document, separators=(",", ":")).encode()


class Producer:
    """A plain aio-pika producer: one confirming channel to publish, one for queue depths."""

    def __init__(
        self, connection: AbstractConnection, exchange: AbstractExchange, info: AbstractChannel
    ) -> None:
        self.connection = connection
        self.exchange = exchange
        self._info = info

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, amqp_url: str, exchange: str | None) -> AsyncIterator[Producer]:
        """``exchange`` None: the default exchange (routing key = queue name)."""
        connection = await aio_pika.connect(amqp_url)
        try:
            channel = await connection.channel(publisher_confirms=True)
            target = (
                channel.default_exchange
                if exchange is None
                else await channel.get_exchange(exchange, ensure=True)
            )
            yield cls(connection, target, await connection.channel())
        finally:
            await connection.close()

    async def publish(self, messages: Sequence[Msg]) -> dict[str, float]:
        """Publish per the message contract, confirms pipelined; return each id's publish time.

        The time (``time.time()``) is taken just before each message goes out
        and travels in its args, so start delays include the whole path.
        """
        limit = asyncio.Semaphore(PUBLISH_WINDOW)
        stamps: dict[str, float] = {}

        async def one(msg: Msg) -> None:
            try:
                stamp = stamps[msg.id] = time.time()
                message = aio_pika.Message(
                    job_body(msg.ms, stamp),
                    message_id=msg.id,
                    priority=msg.priority,
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                await self.exchange.publish(
                    message, routing_key=msg.key, mandatory=False, timeout=60
                )
            finally:
                limit.release()

        tasks: list[asyncio.Future[None]] = []
        try:
            for msg in messages:
                await limit.acquire()
                tasks.append(asyncio.ensure_future(one(msg)))
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return stamps

    async def depth(self, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of a queue, from a passive declare."""
        declared = await self._info.declare_queue(queue, passive=True)
        result = declared.declaration_result
        return int(result.message_count or 0), int(result.consumer_count or 0)


def jobs(key: str, prefix: str, count: int, ms: float, priority: int = 0) -> list[Msg]:
    return [Msg(key, f"{prefix}-{i}", ms, priority) for i in range(count)]


def interleave(*groups: list[Msg]) -> list[Msg]:
    """Round robin over the groups, so each tenant's jobs are spread over the publish."""
    out: list[Msg] = []
    for row in zip(*groups, strict=True):
        out.extend(row)
    return out


@contextlib.asynccontextmanager
async def fresh_namespace(cfg: Bench, label: str) -> AsyncIterator[str]:
    """``throughput.namespace_for`` (migrated, dropped on exit), plus the removal of every
    tenant queue declared in it: ``drop_namespace`` only knows the recorded ones."""
    async with namespace_for(cfg.base, label) as namespace:
        cfg.created.add(namespace)
        try:
            yield namespace
        finally:
            queues = cfg.declared.pop(namespace, [])
            if queues:
                await delete_broker_entities(cfg.base.amqp_url, queues, [])


async def declare_tenants(cfg: Bench, namespace: str, tenants: Sequence[str]) -> None:
    """Declare and bind each tenant's queue as a worker would (coldbrew's own ``Broker``).

    Declared but not yet recorded in ``tenant_queues``, a queue holds its
    messages: no worker consumes it until ``record_tenants``.
    """
    topology = Topology(namespace)
    cfg.declared.setdefault(namespace, []).extend(topology.job_queue("default", t) for t in tenants)

    async def declare(names: Sequence[str]) -> None:
        # a durable priority queue takes RabbitMQ ~15-30 ms to create here and one
        # channel does one at a time: several connections declare in parallel
        broker = Broker(cfg.base.amqp_url, topology, name="coldbrew-bench-provision")
        await broker.connect()
        try:
            for tenant in names:
                await broker.declare_job_queue("default", tenant)
        finally:
            await broker.close()

    lanes = min(DECLARE_CONNECTIONS, len(tenants))
    await asyncio.gather(*(declare(tenants[i::lanes]) for i in range(lanes)))


async def record_tenants(store: JobStore, tenants: Sequence[str]) -> float:
    """Record the queues and NOTIFY, as a worker's provisioning does; every worker then
    consumes them within milliseconds. Returns the wall time just before the first write."""
    channel = Topology(store.namespace).tenant_channel
    began = time.time()
    for start in range(0, len(tenants), 8):
        chunk = tenants[start : start + 8]
        await asyncio.gather(
            *(store.tenants.add_tenant_queue("default", t, channel) for t in chunk)
        )
    return began


async def provision(cfg: Bench, namespace: str, tenants: Sequence[str]) -> None:
    """Declare and record tenant queues before any worker starts (no first-job provisioning)."""
    await declare_tenants(cfg, namespace, tenants)
    async with JobStore.open(cfg.base.database_url, namespace, pool_size=8) as store:
        await record_tenants(store, tenants)


# --- workers and the job table -------------------------------------------------------


def worker(
    cfg: Bench,
    namespace: str,
    label: str,
    *,
    worker_id: str = "bench-1",
    aging: float | None = None,
    ready_timeout: float = 60.0,
) -> contextlib.AbstractAsyncContextManager[RunningWorker]:
    """A ``coldbrew worker bench.fairness_app:app`` subprocess, ready; SIGTERMed on the way out."""
    env = {"COLDBREW_WORKER_ID": worker_id}
    if aging is not None:
        env["COLDBREW_AGING_SECONDS"] = f"{aging:g}"
    if cfg.prefetch is not None:
        env["COLDBREW_PREFETCH"] = str(cfg.prefetch)
    return worker_process(
        cfg.base,
        namespace,
        label,
        app_ref=APP,
        extra_env=env,
        log_path=(cfg.log_dir or cfg.base.workdir) / f"worker-{namespace}-{worker_id}.log",
        ready_timeout=ready_timeout,
    )


def jobs_table(namespace: str) -> str:
    return f"{quote_ident(namespace)}.jobs"


async def wait_succeeded(
    conn: asyncpg.Connection,
    namespace: str,
    target: int,
    workers: Sequence[RunningWorker],
    label: str,
    *,
    where: str = "true",
    args: Sequence[Any] = (),
) -> None:
    """Poll every 50 ms until ``target`` rows matching ``where`` have succeeded."""
    sql = f"SELECT count(*) FROM {jobs_table(namespace)} WHERE status = 'succeeded' AND {where}"
    deadline = time.perf_counter() + max(120.0, target / 50)
    while (done := await conn.fetchval(sql, *args)) < target:
        if any(w.process.returncode is not None for w in workers):
            raise BenchError(f"{label}: a worker exited with {done}/{target} jobs done")
        if time.perf_counter() > deadline:
            raise BenchError(f"{label}: only {done}/{target} jobs succeeded in time")
        await asyncio.sleep(POLL_SECONDS)


async def fetch_ran(
    conn: asyncpg.Connection, namespace: str, where: str = "true", args: Sequence[Any] = ()
) -> list[Ran]:
    rows = await conn.fetch(
        f"SELECT id, tenant, priority, result FROM {jobs_table(namespace)} "
        f"WHERE status = 'succeeded' AND {where}",
        *args,
    )
    out = []
    for row in rows:
        result = row["result"]
        doc = json.loads(result) if isinstance(result, str) else result
        out.append(
            Ran(
                row["id"],
                row["tenant"],
                row["priority"],
                doc["published"],
                doc["started"],
                doc["finished"],
            )
        )
    return out


async def table_health(
    conn: asyncpg.Connection, namespace: str, where: str = "true"
) -> dict[str, Any]:
    """Rows per status and the highest attempt: anything but succeeded/1 is worth a warning.

    ``where`` leaves out rows a scenario cuts off on purpose (a stream, a capped backlog).
    """
    rows = await conn.fetch(
        f"SELECT status::text AS status, count(*) AS n, max(attempt) AS top "
        f"FROM {jobs_table(namespace)} WHERE {where} GROUP BY status"
    )
    return {
        "statuses": {r["status"]: r["n"] for r in rows},
        "max_attempt": max((r["top"] for r in rows), default=0),
    }


def max_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """Most intervals open at one instant (an end at t closes before a start at t)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = top = 0
    for _, step in events:
        running += step
        top = max(top, running)
    return top


TRANSIENT: tuple[type[BaseException], ...] = (
    *SERVICE_ERRORS,
    asyncpg.InterfaceError,
    TimeoutError,
)


async def retrying(
    cfg: Bench, label: str, once: Callable[..., Awaitable[dict[str, Any]]], *args: Any
) -> dict[str, Any]:
    """Run one repeat; after a failure, clean up, wait and run it again (at most twice more).

    Other engineers' fault tests restart PostgreSQL and RabbitMQ on this machine.
    Every failure is kept in the repeat's ``failures`` and shown in the report,
    so a coldbrew crash that a retry papers over is still visible.
    """
    failures: list[str] = []
    while True:
        try:
            result = await once(cfg, *args)
        except TRANSIENT as exc:
            failures.append(f"{type(exc).__name__}: {str(exc)[:300]}")
            if len(failures) > RETRIES:
                raise
            progress(f"{label} failed ({failures[-1][:200]}); again in {RETRY_PAUSE:g} s")
            await asyncio.sleep(RETRY_PAUSE)
            continue
        return result | {"failures": failures}


# --- 1. burst -------------------------------------------------------------------------


def burst_tenants(cfg: Bench) -> list[str]:
    return [f"t{i:02d}" for i in range(1, cfg.sizes.burst_tenants + 1)]


def burst_summary(ran: Sequence[Ran]) -> dict[str, Any]:
    probes = [r for r in ran if r.probe]
    backlog = [r for r in ran if not r.probe]
    delays = sorted(r.started - r.published for r in probes)
    first = min(r.published for r in probes)
    return {
        "delays": delays,
        "p50": statistics.median(delays),
        "max": max(delays),
        "backlog_left": sum(1 for r in backlog if r.started > first),
        "backlog_seconds": max(r.finished for r in backlog) - min(r.started for r in backlog),
    }


async def burst_coldbrew(cfg: Bench, index: int) -> dict[str, Any]:
    label = f"burst coldbrew #{index + 1}"
    others = burst_tenants(cfg)
    backlog = cfg.sizes.burst_backlog
    async with fresh_namespace(cfg, label) as namespace:
        await provision(cfg, namespace, ["a", *others])
        conn = await asyncpg.connect(cfg.base.database_url)
        try:
            async with Producer.open(cfg.base.amqp_url, Topology(namespace).jobs_exchange) as p:
                await p.publish(jobs("default.a", "a", backlog, JOB_MS))
                progress(f"{label}: {backlog} jobs of tenant a queued; starting the worker")
                async with worker(cfg, namespace, label) as w:
                    await asyncio.sleep(cfg.lag)
                    await p.publish([Msg(f"default.{t}", f"{PROBE}{t}", JOB_MS) for t in others])
                    await wait_succeeded(conn, namespace, backlog + len(others), [w], label)
            ran = await fetch_ran(conn, namespace)
            health = await table_health(conn, namespace)
        finally:
            await conn.close()
    return burst_summary(ran) | health


async def burst_fifo(cfg: Bench, index: int) -> dict[str, Any]:
    """The baseline: one shared queue, a plain aio-pika consumer (subprocess, uvloop)."""
    label = f"burst FIFO #{index + 1}"
    queue = f"cbbench_{cfg.run_id}.fifo.{index}"
    others = burst_tenants(cfg)
    backlog = cfg.sizes.burst_backlog
    process: asyncio.subprocess.Process | None = None
    try:
        async with Producer.open(cfg.base.amqp_url, None) as p:
            channel = await p.connection.channel()
            await channel.declare_queue(queue, durable=True, arguments=raw_queue_arguments())
            await p.publish(jobs(queue, "a", backlog, JOB_MS))
            progress(f"{label}: {backlog} jobs queued; starting the consumer")
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(SCRIPT),
                "--fifo-consumer",
                queue,
                "--count",
                str(backlog + len(others)),
                "--concurrency",
                str(cfg.concurrency),
                "--amqp-url",
                cfg.base.amqp_url,
                stdout=subprocess.PIPE,
                env=child_env({}),
                start_new_session=True,
                limit=LINE_LIMIT,
            )
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), timeout=60)
            if line.strip() != b"ready":
                raise BenchError(f"{label}: the consumer did not start (said {line!r})")
            await asyncio.sleep(cfg.lag)
            await p.publish([Msg(queue, f"{PROBE}{t}", JOB_MS) for t in others])
            line = await asyncio.wait_for(process.stdout.readline(), timeout=max(120, backlog / 50))
        if not line:
            raise BenchError(f"{label}: the consumer exited before reporting")
        records = json.loads(line)
        await asyncio.wait_for(process.wait(), timeout=30)
    finally:
        if process is not None:
            await stop_process(process, grace=10)
        await delete_broker_entities(cfg.base.amqp_url, [queue], [])
    ran = [Ran(r[0], "fifo", 0, r[1], r[2], r[3]) for r in records]
    return burst_summary(ran)


async def fifo_consumer(amqp_url: str, queue_name: str, count: int, concurrency: int) -> None:
    """The FIFO side's subprocess: prefetch = concurrency, a task per message (aio-pika's
    callback), ``sleep(ms)``, then ack (late ack); report every message's times as JSON."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=concurrency)
        queue = await channel.declare_queue(queue_name, passive=True)
        records: list[list[Any]] = []
        done = asyncio.Event()

        async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            started = time.time()
            args = json.loads(message.body)["args"]
            await asyncio.sleep(args["ms"] / 1000)
            await message.ack()
            records.append([message.message_id, args["published"], started, time.time()])
            if len(records) >= count:
                done.set()

        await queue.consume(handle, no_ack=False)
        print("ready", flush=True)
        await done.wait()
        print(json.dumps(records), flush=True)
    finally:
        await connection.close()


async def scenario_burst(cfg: Bench) -> dict[str, Any]:
    fifo: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    for index in range(cfg.repeat):
        fifo.append(await retrying(cfg, f"burst FIFO #{index + 1}", burst_fifo, index))
        progress(
            f"burst FIFO #{index + 1}: p50 {fifo[-1]['p50']:.3f} s, max {fifo[-1]['max']:.3f} s"
        )
        cold.append(await retrying(cfg, f"burst coldbrew #{index + 1}", burst_coldbrew, index))
        progress(
            f"burst coldbrew #{index + 1}: p50 {cold[-1]['p50']:.3f} s, max {cold[-1]['max']:.3f} s"
        )
    target = 1.0
    worst = max(r["max"] for r in cold)
    return {
        "coldbrew": cold,
        "fifo": fifo,
        "target_seconds": target,
        "worst": worst,
        "pass": worst <= target,
    }


# --- 2. priority ----------------------------------------------------------------------


async def priority_once(cfg: Bench, index: int) -> dict[str, Any]:
    label = f"priority #{index + 1}"
    backlog = cfg.sizes.priority_backlog
    async with fresh_namespace(cfg, label) as namespace:
        await provision(cfg, namespace, ["p"])
        conn = await asyncpg.connect(cfg.base.database_url)
        try:
            async with Producer.open(cfg.base.amqp_url, Topology(namespace).jobs_exchange) as p:
                await p.publish(jobs("default.p", "low", backlog, JOB_MS, priority=0))
                progress(f"{label}: {backlog} priority-0 jobs queued; starting the worker")
                async with worker(cfg, namespace, label) as w:
                    await asyncio.sleep(cfg.lag)
                    await p.publish([Msg("default.p", f"{PROBE}p9", JOB_MS, priority=9)])
                    await wait_succeeded(conn, namespace, backlog + 1, [w], label)
            ran = await fetch_ran(conn, namespace)
            health = await table_health(conn, namespace)
        finally:
            await conn.close()
    probe = next(r for r in ran if r.probe)
    low = [r for r in ran if not r.probe]
    return {
        "delay": probe.started - probe.published,
        "backlog_left": sum(1 for r in low if r.started > probe.published),
        "started_in_between": sum(1 for r in low if probe.published < r.started < probe.started),
    } | health


async def scenario_priority(cfg: Bench) -> dict[str, Any]:
    runs = []
    for index in range(cfg.repeat):
        runs.append(await retrying(cfg, f"priority #{index + 1}", priority_once, index))
        progress(f"priority #{index + 1}: started after {runs[-1]['delay']:.3f} s")
    target = 0.5
    worst = max(r["delay"] for r in runs)
    return {"runs": runs, "target_seconds": target, "worst": worst, "pass": worst <= target}


# --- 3. aging -------------------------------------------------------------------------


def stream_job_ms() -> float:
    """Spread lengths, so the stream's jobs end one by one rather than in waves.

    Equal lengths would free the slots in waves bigger than the prefetch; the
    worker would then briefly hold no priority-9 delivery and, work-conserving,
    start the priority-0 job early: not a test of aging.
    """
    return STREAM_JOB_MS * random.uniform(0.5, 1.5)


class Feeder:
    """Keeps at least ``concurrency`` ready priority-9 jobs in tenant ``s``'s broker queue.

    That is a sustained stream which alone keeps every slot of the worker busy
    (the worker never runs out of priority-9 work). ``min_ready`` records the
    lowest ready count seen while measuring: 0 would mean the stream ran dry.
    """

    def __init__(self, producer: Producer, queue: str, low_water: int) -> None:
        self.producer = producer
        self.queue = queue
        self.low_water = low_water
        self.published = 0
        self.measuring = False
        self.min_ready: int | None = None
        self.stock = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            ready, _ = await self.producer.depth(self.queue)
            if self.measuring:
                self.min_ready = ready if self.min_ready is None else min(self.min_ready, ready)
            if ready < self.low_water:
                batch = [
                    Msg("default.s", f"s-{self.published + i}", stream_job_ms(), 9)
                    for i in range(self.low_water)
                ]
                await self.producer.publish(batch)
                self.published += len(batch)
            else:
                self.stock.set()
            await asyncio.sleep(POLL_SECONDS)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Feeder]:
        self._task = asyncio.create_task(self._run())
        try:
            yield self
        finally:
            await self.stop()

    async def stop(self) -> float:
        """Stop publishing; return the wall time the stream ended.

        Lets the loop finish its turn (a cancelled passive declare would make
        aiormq close the channel, noisily); cancels it only if it hangs.
        """
        ended = time.time()
        self._stop.set()
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=10)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        return ended

    def check(self) -> None:
        if self._task is not None and self._task.done() and not self._task.cancelled():
            self._task.result()  # re-raise the feeder's error


async def probe_result(conn: asyncpg.Connection, namespace: str, job_id: str) -> Ran | None:
    found = await fetch_ran(conn, namespace, "id = $1", [job_id])
    return found[0] if found else None


async def aging_once(cfg: Bench, index: int, same_tenant: bool) -> dict[str, Any]:
    variant = "b" if same_tenant else "a"
    label = f"aging ({variant}) #{index + 1}"
    tenant = "s" if same_tenant else "l"
    probe_id = f"{PROBE}p0"
    async with fresh_namespace(cfg, label) as namespace:
        topo = Topology(namespace)
        await provision(cfg, namespace, ["s", "l"])
        conn = await asyncpg.connect(cfg.base.database_url)
        try:
            async with (
                Producer.open(cfg.base.amqp_url, topo.jobs_exchange) as p,
                Feeder(p, topo.job_queue("default", "s"), cfg.concurrency).running() as feed,
            ):
                await asyncio.wait_for(feed.stock.wait(), timeout=60)
                async with worker(cfg, namespace, label, aging=cfg.aging_seconds) as w:
                    await asyncio.sleep(AGING_WARMUP)
                    feed.measuring = True
                    count_s = (
                        f"SELECT count(*) FROM {jobs_table(namespace)} "
                        "WHERE status = 'running' AND tenant = 's'"
                    )
                    running = [await conn.fetchval(count_s)]
                    stamps = await p.publish([Msg(f"default.{tenant}", probe_id, JOB_MS, 0)])
                    deadline = stamps[probe_id] + cfg.aging_seconds + 1 + AGING_MARGIN
                    probe = None
                    while probe is None and time.time() < deadline:
                        feed.check()
                        await asyncio.sleep(POLL_SECONDS)
                        running.append(await conn.fetchval(count_s))
                        probe = await probe_result(conn, namespace, probe_id)
                    stream_end = await feed.stop()
                    if probe is None:
                        progress(f"{label}: not started while the stream ran; waiting for it")
                        await wait_succeeded(
                            conn, namespace, 1, [w], label, where="id = $1", args=[probe_id]
                        )
                        probe = await probe_result(conn, namespace, probe_id)
                    assert probe is not None
            health = await table_health(conn, namespace, f"id = '{probe_id}'")
        finally:
            await conn.close()
    return {
        "delay": probe.started - probe.published,
        "during_stream": probe.started < stream_end,
        "stream_seconds_after_probe": stream_end - probe.published,
        "s_running_at_probe": running[0],
        "s_running_min": min(running),  # while the probe waited (polled every 50 ms)
        "stream_min_ready": feed.min_ready,
        "stream_published": feed.published,
    } | health


async def scenario_aging(cfg: Bench) -> dict[str, Any]:
    target = cfg.aging_seconds + 1.0
    out: dict[str, Any] = {"aging_seconds": cfg.aging_seconds, "target_seconds": target}
    for same in (False, True):
        runs = []
        for index in range(cfg.repeat):
            runs.append(await retrying(cfg, f"aging #{index + 1}", aging_once, index, same))
            r = runs[-1]
            when = "during" if r["during_stream"] else "only after"
            progress(
                f"aging ({'b' if same else 'a'}) #{index + 1}: started after {r['delay']:.2f} s, "
                f"{when} the stream"
            )
        ok = all(r["during_stream"] and r["delay"] <= target for r in runs)
        out["same_tenant" if same else "other_tenant"] = {
            "runs": runs,
            "worst": max(r["delay"] for r in runs),
            "pass": ok,
        }
    return out


# --- 4. caps --------------------------------------------------------------------------


class Sampler:
    """Every ~15 ms, on its own connection: tenant b's running rows, and how many of the
    workers' PostgreSQL sessions wait on a lock (what b's capped claims can cost the others)."""

    def __init__(self, conn: asyncpg.Connection, namespace: str) -> None:
        self.conn = conn
        self.sql = (
            f"SELECT (SELECT count(*) FROM {jobs_table(namespace)} "
            "WHERE tenant = 'b' AND status = 'running'), "
            "(SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
            "AND wait_event_type = 'Lock'), "
            "(SELECT count(*) FROM pg_stat_activity WHERE application_name = $1)"
        )
        self.application = f"coldbrew:{namespace}"
        self.samples: list[int] = []
        self.lock_waits: list[int] = []
        self.sessions: list[int] = []
        self.began = self.ended = 0.0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        self.began = time.perf_counter()
        while not self._stop.is_set():
            row = await self.conn.fetchrow(self.sql, self.application)
            assert row is not None
            self.samples.append(row[0])
            self.lock_waits.append(row[1])
            self.sessions.append(row[2])
            await asyncio.sleep(SAMPLE_SECONDS)
        self.ended = time.perf_counter()

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> dict[str, Any]:
        n = len(self.samples)
        return {
            "samples": n,
            "mean_interval_ms": (self.ended - self.began) / n * 1000 if n else None,
            "max": max(self.samples, default=0),
            "mean": statistics.fmean(self.samples) if n else 0.0,
            "over_cap": sum(1 for s in self.samples if s > CAP),
            "at_cap": sum(1 for s in self.samples if s == CAP),
            "lock_waits_mean": statistics.fmean(self.lock_waits) if n else 0.0,
            "sessions_mean": statistics.fmean(self.sessions) if n else 0.0,
        }


async def cap_waits(workers: Sequence[RunningWorker]) -> float:
    """``CAP_WAITS`` summed over the workers' ``/metrics`` (0 for one that shows none)."""
    return sum([(await scrape_metrics(w.port)).get(CAP_WAITS, 0.0) for w in workers])


SERVICES = {"postgres": "postgres", "beam.smp": "rabbitmq"}


def service_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of every PostgreSQL and RabbitMQ process on this machine, by pid."""
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            service = SERVICES.get((entry / "comm").read_text().strip())
            if service is not None:
                found[int(entry.name)] = (service, cpu_seconds(int(entry.name)))
    return found


def service_cpu_spent(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each service spent since ``before``: a process started since counts whole
    (PostgreSQL backends of connections opened meanwhile); one that ended meanwhile is missed."""
    spent = dict.fromkeys(SERVICES.values(), 0.0)
    for pid, (service, cpu) in service_cpu().items():
        spent[service] += cpu - (before[pid][1] if pid in before else 0.0)
    return spent


@dataclass
class Phase:
    """One caps phase: the other tenants' backlog released, then drained."""

    released: float  # wall time of the release (record + NOTIFY)
    ended: float
    worker_cpu_seconds: float
    cap_waits: float
    sampled: dict[str, Any]
    service_cpu_seconds: dict[str, float]


async def caps_phase(
    store: JobStore,
    conn: asyncpg.Connection,
    sampler: Sampler,
    workers: Sequence[RunningWorker],
    tenants: list[str],
    total: int,
    label: str,
    *,
    head_start: Sequence[str] = (),
) -> Phase:
    """Release ``head_start`` (b), wait, release ``tenants``; time until their jobs all succeeded.

    The sampler runs in both phases, so its queries load PostgreSQL alike.
    """
    sampling = asyncio.create_task(sampler.run())
    try:
        if head_start:
            await record_tenants(store, head_start)
            await asyncio.sleep(CAPS_HEAD_START)
        cpu0 = sum(cpu_seconds(w.pid) for w in workers)
        services0 = service_cpu()
        waits0 = await cap_waits(workers)
        released = await record_tenants(store, tenants)
        await wait_succeeded(
            conn,
            store.namespace,
            total,
            workers,
            label,
            where="tenant = ANY($1::text[])",
            args=[tenants],
        )
        ended = time.time()
        cpu1 = sum(cpu_seconds(w.pid) for w in workers)
        services = service_cpu_spent(services0)
        waits1 = await cap_waits(workers)
    finally:
        sampler.stop()
        await sampling
    return Phase(released, ended, cpu1 - cpu0, waits1 - waits0, sampler.summary(), services)


async def caps_once(cfg: Bench, index: int) -> dict[str, Any]:
    label = f"caps #{index + 1}"
    s = cfg.sizes
    absent = [f"oa{i}" for i in range(1, s.caps_tenants + 1)]
    present = [f"op{i}" for i in range(1, s.caps_tenants + 1)]
    per = s.caps_jobs_per_tenant
    total = per * len(absent)
    async with fresh_namespace(cfg, label) as namespace:
        await coldbrew_cli(cfg.base, namespace, "tenants", "set", "b", "--max-running", str(CAP))
        await declare_tenants(cfg, namespace, ["b", *absent, *present])
        async with Producer.open(cfg.base.amqp_url, Topology(namespace).jobs_exchange) as p:
            await p.publish(interleave(*(jobs(f"default.{t}", t, per, JOB_MS) for t in absent)))
            await p.publish(interleave(*(jobs(f"default.{t}", t, per, JOB_MS) for t in present)))
            await p.publish(jobs("default.b", "b", s.caps_b_jobs, CAPPED_JOB_MS))
        progress(f"{label}: queued, not yet consumed; starting two workers")
        conn = await asyncpg.connect(cfg.base.database_url)
        sampler_conn = await asyncpg.connect(cfg.base.database_url)
        try:
            async with (
                JobStore.open(cfg.base.database_url, namespace, pool_size=4) as store,
                worker(cfg, namespace, f"{label} w1", worker_id="bench-1") as w1,
                worker(cfg, namespace, f"{label} w2", worker_id="bench-2") as w2,
            ):
                workers = [w1, w2]
                sampler = Sampler(sampler_conn, namespace)
                without = await caps_phase(store, conn, sampler, workers, absent, total, label)
                sampler = Sampler(sampler_conn, namespace)
                with_b = await caps_phase(
                    store, conn, sampler, workers, present, total, label, head_start=["b"]
                )
            ran = await fetch_ran(conn, namespace)
            health = await table_health(conn, namespace, "tenant <> 'b'")
        finally:
            await conn.close()
            await sampler_conn.close()
    done_absent = sorted(r.finished - without.released for r in ran if r.tenant in absent)
    done_present = sorted(r.finished - with_b.released for r in ran if r.tenant in present)
    rate_absent = total / done_absent[-1]
    rate_present = total / done_present[-1]
    # the first 90% too, in case a straggler (a queue consumed late) decides the last finish
    nine = int(total * 0.9) - 1
    rate90_absent = (nine + 1) / done_absent[nine]
    rate90_present = (nine + 1) / done_present[nine]
    b_jobs = [r for r in ran if r.tenant == "b"]
    b_in_phase = [r for r in b_jobs if with_b.released <= r.started < with_b.ended]
    b_rate = len(b_in_phase) / (with_b.ended - with_b.released)
    return {
        "rate_absent": rate_absent,
        "rate_present": rate_present,
        "ratio": rate_present / rate_absent,
        "rate90_absent": rate90_absent,
        "rate90_present": rate90_present,
        "ratio90": rate90_present / rate90_absent,
        "cpu_ms_per_job_absent": without.worker_cpu_seconds / total * 1000,
        "cpu_ms_per_job_present": with_b.worker_cpu_seconds / total * 1000,
        # PostgreSQL's and RabbitMQ's CPU per other job, in each phase
        **{
            f"{service}_cpu_ms_per_job_{name}": phase.service_cpu_seconds[service] / total * 1000
            for name, phase in (("absent", without), ("present", with_b))
            for service in SERVICES.values()
        },
        "cap_waits": with_b.cap_waits,
        "b_sampled": with_b.sampled,
        "b_sampled_absent_max": without.sampled["max"],
        "lock_waits_absent": without.sampled["lock_waits_mean"],
        "lock_waits_present": with_b.sampled["lock_waits_mean"],
        "sessions_present": with_b.sampled["sessions_mean"],
        "b_overlap": max_overlap([(r.started, r.finished) for r in b_jobs]),
        "b_finished": len(b_jobs),
        "b_rate": b_rate,
        # how much of its cap b used while the others ran: by its jobs' starts, and sampled
        "b_utilisation": b_rate / (CAP * 1000 / CAPPED_JOB_MS),
        "b_sampled_utilisation": with_b.sampled["mean"] / CAP,
        "b_backlog_left": s.caps_b_jobs - len(b_jobs),
    } | health


async def scenario_caps(cfg: Bench) -> dict[str, Any]:
    runs = []
    for index in range(cfg.repeat):
        runs.append(await retrying(cfg, f"caps #{index + 1}", caps_once, index))
        r = runs[-1]
        progress(
            f"caps #{index + 1}: b max {r['b_sampled']['max']} sampled, {r['b_overlap']} overlap; "
            f"others {r['rate_absent']:,.0f} -> {r['rate_present']:,.0f} jobs/s"
        )
    worst_sampled = max(r["b_sampled"]["max"] for r in runs)
    worst_overlap = max(r["b_overlap"] for r in runs)
    ratio = statistics.median(r["ratio"] for r in runs)
    return {
        "runs": runs,
        "cap": CAP,
        "ratio_target": 0.9,
        "worst_sampled": worst_sampled,
        "worst_overlap": worst_overlap,
        "ratio_median": ratio,
        "cap_pass": worst_sampled <= CAP and worst_overlap <= CAP,
        "ratio_pass": ratio >= 0.9,
    }


# --- 5. scale -------------------------------------------------------------------------


async def idle_reading(w: RunningWorker, seconds: float) -> dict[str, Any]:
    """CPU (% of one core) over ``seconds`` of idling, then VmRSS."""
    cpu0, t0 = cpu_seconds(w.pid), time.perf_counter()
    await asyncio.sleep(seconds)
    cpu1, t1 = cpu_seconds(w.pid), time.perf_counter()
    memory = memory_kib(w.pid)
    return {
        "cpu_percent": (cpu1 - cpu0) / (t1 - t0) * 100,
        "rss_kib": memory["VmRSS"],
        "hwm_kib": memory["VmHWM"],
    }


def drain_summary(ran: Sequence[Ran]) -> dict[str, Any]:
    """Rate from the first publish to the last finish, and each job's own start delay.

    Publishing 1,000 persistent messages with confirms to 1,000 different
    durable queues is slower than to one (each queue writes its own), so the
    rate can be the producer's; the start delays say whether the worker kept up.
    """
    t0 = min(r.published for r in ran)
    last = max(r.finished for r in ran)
    delays = sorted(r.started - r.published for r in ran)
    return {
        "jobs": len(ran),
        "delay_p50": statistics.median(delays),
        "delay_p99": delays[min(len(delays) - 1, int(len(delays) * 0.99))],
        "delay_max": delays[-1],
        "after_last_publish": last - max(r.published for r in ran),
        "publish_seconds": max(r.published for r in ran) - t0,
        "last_start_seconds": max(r.started for r in ran) - t0,
        "last_finish_seconds": last - t0,
        "rate": len(ran) / (last - t0),
    }


async def scale_once(cfg: Bench, index: int) -> dict[str, Any]:
    label = f"scale #{index + 1}"
    n = cfg.sizes.scale_tenants
    tenants = [f"t{i:04d}" for i in range(n)]
    idle = cfg.sizes.idle_seconds
    async with fresh_namespace(cfg, label) as namespace:
        topo = Topology(namespace)
        async with worker(cfg, namespace, f"{label} baseline") as w:
            await asyncio.sleep(2.0)
            baseline = await idle_reading(w, idle) | {"ready_seconds": w.ready_seconds}
        progress(f"{label}: baseline (1 queue) {baseline['rss_kib'] / 1024:.1f} MiB; provisioning")
        began = time.perf_counter()
        await provision(cfg, namespace, tenants)
        provision_seconds = time.perf_counter() - began
        conn = await asyncpg.connect(cfg.base.database_url)
        try:
            async with (
                Producer.open(cfg.base.amqp_url, topo.jobs_exchange) as p,
                worker(cfg, namespace, label, ready_timeout=600) as w,
            ):
                progress(f"{label}: worker ready in {w.ready_seconds:.1f} s; checking consumers")
                depths = [await p.depth(topo.job_queue("default", t)) for t in tenants]
                consumed = sum(1 for _, consumers in depths if consumers > 0)
                await asyncio.sleep(2.0)
                loaded = await idle_reading(w, idle)
                progress(f"{label}: idle {loaded['rss_kib'] / 1024:.1f} MiB; one job per tenant")
                for rnd in ("spread", "again"):  # a tenant's first job, then its second
                    await p.publish([Msg(f"default.{t}", f"{rnd}-{t}", 0.0) for t in tenants])
                    await wait_succeeded(
                        conn, namespace, n, [w], label, where="id LIKE $1", args=[f"{rnd}-%"]
                    )
                await p.publish(jobs(f"default.{tenants[0]}", "single", n, 0.0))
                await wait_succeeded(conn, namespace, n, [w], label, where="id LIKE 'single-%'")
                peak = memory_kib(w.pid)["VmHWM"]
                ready_seconds = w.ready_seconds
            spread = await fetch_ran(conn, namespace, "id LIKE 'spread-%'")
            single = await fetch_ran(conn, namespace, "id LIKE 'single-%'")
            again = await fetch_ran(conn, namespace, "id LIKE 'again-%'")
            health = await table_health(conn, namespace)
        finally:
            await conn.close()
    return {
        "tenants": n,
        "provision_seconds": provision_seconds,
        "ready_seconds": ready_seconds,
        "consumed": consumed,
        "baseline": baseline,
        "idle": loaded,
        "peak_rss_kib": peak,
        "spread": drain_summary(spread),
        "again": drain_summary(again),
        "single": drain_summary(single),
    } | health


async def scenario_scale(cfg: Bench) -> dict[str, Any]:
    runs = []
    for index in range(cfg.scale_repeat):
        runs.append(await retrying(cfg, f"scale #{index + 1}", scale_once, index))
        r = runs[-1]
        progress(
            f"scale #{index + 1}: {r['idle']['rss_kib'] / 1024:.1f} MiB, "
            f"{r['idle']['cpu_percent']:.1f}% idle CPU, {r['spread']['rate']:,.0f} jobs/s"
        )
    ok = all(r["consumed"] == r["tenants"] and r["spread"]["jobs"] == r["tenants"] for r in runs)
    return {"runs": runs, "pass": ok}


# --- the run --------------------------------------------------------------------------


RUNNERS: dict[str, Callable[[Bench], Any]] = {
    "burst": scenario_burst,
    "priority": scenario_priority,
    "aging": scenario_aging,
    "caps": scenario_caps,
    "scale": scenario_scale,
}


def effective_prefetch(cfg: Bench) -> int | None:
    """What the worker's settings make of COLDBREW_PREFETCH (None if they cannot say)."""
    try:
        settings = Settings.model_construct(concurrency=cfg.concurrency, prefetch=cfg.prefetch or 0)
        return int(settings.effective_prefetch)
    except Exception:
        return None


async def run(cfg: Bench) -> dict[str, Any]:
    logs.configure("json", "warning")  # coldbrew's own log lines stay off stdout
    conn = await connect_creating_database(cfg.base.database_url)
    await conn.close()
    machine = await machine_info(cfg.base.amqp_url, cfg.base.database_url)
    progress(
        f"scenarios {','.join(cfg.scenarios)}; concurrency {cfg.concurrency}, "
        f"{cfg.repeat} repeats{' (quick sizes)' if cfg.quick else ''}"
    )
    result: dict[str, Any] = {
        "config": {
            "quick": cfg.quick,
            "sizes": asdict(cfg.sizes),
            "repeat": cfg.repeat,
            "scale_repeat": cfg.scale_repeat,
            "concurrency": cfg.concurrency,
            "prefetch_setting": cfg.prefetch,
            "prefetch_effective": effective_prefetch(cfg),
            "aging_seconds": cfg.aging_seconds,
            "lag_seconds": cfg.lag,
            "job_ms": JOB_MS,
        },
        "machine": machine,
    }
    started = time.perf_counter()
    try:
        for name in cfg.scenarios:
            progress(f"=== {name}")
            result[name] = await RUNNERS[name](cfg)
    finally:
        await sweep(cfg)
    result["seconds"] = time.perf_counter() - started
    return result


async def sweep(cfg: Bench, patience: float = 60.0) -> None:
    """Drop again any namespace of this run whose schema survived its clean-up.

    Other engineers' fault tests restart PostgreSQL and RabbitMQ on this machine;
    a drop that met a restart is retried here, for up to ``patience`` seconds.
    """
    deadline = time.perf_counter() + patience
    while cfg.created:
        try:
            conn = await asyncpg.connect(cfg.base.database_url)
            try:
                rows = await conn.fetch(
                    "SELECT nspname FROM pg_namespace WHERE nspname = ANY($1::text[])",
                    sorted(cfg.created),
                )
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError) as exc:
            if time.perf_counter() > deadline:
                progress(f"clean-up: gave up; schemas possibly left: {sorted(cfg.created)} ({exc})")
                return
            await asyncio.sleep(2.0)
            continue
        left = {row["nspname"] for row in rows}
        cfg.created &= left
        for namespace in sorted(left):
            progress(f"clean-up: {namespace} survived its drop; dropping it again")
            await drop_namespace(cfg.base.amqp_url, cfg.base.database_url, namespace)
        if left:
            if time.perf_counter() > deadline:
                progress(f"clean-up: gave up; schemas possibly left: {sorted(left)}")
                return
            await asyncio.sleep(1.0)


# --- the report -----------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def spread_text(values: Sequence[float], fmt: str = "{:.3f}", unit: str = " s") -> str:
    s = Spread.of(values)
    if len(values) == 1:
        return fmt.format(s.median) + unit
    return f"{fmt.format(s.median)}{unit} ({fmt.format(s.low)}-{fmt.format(s.high)})"


COUNT = "{:,.0f}"


def col(runs: Sequence[dict[str, Any]], key: str, fmt: str = "{:.3f}", unit: str = " s") -> str:
    """One figure over the repeats, as median (min-max)."""
    return spread_text([r[key] for r in runs], fmt, unit)


def warnings(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Rows not succeeded at attempt 1, and repeats that failed before they succeeded."""
    lines = []
    odd = [
        (r["statuses"], r["max_attempt"])
        for r in runs
        if set(r.get("statuses", {"succeeded": 1})) != {"succeeded"} or r.get("max_attempt", 1) > 1
    ]
    if odd:
        lines.append(
            f"   WARNING: rows not all succeeded at attempt 1 (statuses, max attempt): {odd}"
        )
    for failure in (f for r in runs for f in r.get("failures", [])):
        lines.append(f"   NOTE: a repeat failed and was run again: {failure[:160]}")
    return lines


def render_burst(res: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    sizes = cfg["sizes"]
    cold, fifo = res["coldbrew"], res["fifo"]
    lines = [
        f"1. burst: tenant a queues {sizes['burst_backlog']:,} jobs of {cfg['job_ms']:g} ms; "
        f"{cfg['lag_seconds']:g} s after the consumer is ready, "
        f"{sizes['burst_tenants']} other tenants publish 1 job each",
        f"   {'':<22} {'p50 start delay':>26} {'max start delay':>26} {'a jobs not started':>19}",
    ]
    for name, runs in (("coldbrew", cold), ("FIFO (plain aio-pika)", fifo)):
        lines.append(
            f"   {name:<22} {spread_text([r['p50'] for r in runs]):>26} "
            f"{spread_text([r['max'] for r in runs]):>26} "
            f"{spread_text([r['backlog_left'] for r in runs], '{:,.0f}', ''):>19}"
        )
    lines.append(
        f"   tenant a's backlog drained in {col(cold, 'backlog_seconds', '{:.2f}')} under "
        f"coldbrew, {col(fifo, 'backlog_seconds', '{:.2f}')} FIFO"
    )
    lines.append(
        f"   target: all {sizes['burst_tenants']} start within {res['target_seconds']:g} s under "
        f"coldbrew (every repeat): {verdict(res['pass'])} (worst {res['worst']:.3f} s)"
    )
    return lines + thin_backlog(cold + fifo, cfg) + warnings(cold) + warnings(fifo)


def thin_backlog(runs: Sequence[dict[str, Any]], cfg: dict[str, Any]) -> list[str]:
    """A warning when a repeat's backlog was nearly gone at the probe: then it proves little."""
    thin = [r["backlog_left"] for r in runs if r["backlog_left"] < cfg["concurrency"]]
    if not thin:
        return []
    return [
        f"   WARNING: only {thin} backlog jobs had not started when the probe was published "
        "(the worker had nearly drained it): such a repeat tests little"
    ]


def render_priority(res: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    runs = res["runs"]
    return [
        f"2. priority: one priority-9 job published {cfg['lag_seconds']:g} s after the worker "
        f"started on {cfg['sizes']['priority_backlog']:,} priority-0 jobs of the same tenant",
        f"   start delay {spread_text([r['delay'] for r in runs])}; priority-0 jobs not yet "
        f"started when it was published: {col(runs, 'backlog_left', COUNT, '')}; started "
        f"between its publish and its start: {col(runs, 'started_in_between', COUNT, '')}",
        f"   target: starts within {res['target_seconds']:g} s (every repeat): "
        f"{verdict(res['pass'])} (worst {res['worst']:.3f} s)",
        *thin_backlog(runs, cfg),
        *warnings(runs),
    ]


def render_aging(res: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    lines = [
        f"3. aging (COLDBREW_AGING_SECONDS={res['aging_seconds']:g}): tenant s's queue kept "
        f"stocked with priority-9 jobs of {STREAM_JOB_MS:g} ms +-50% (>= {cfg['concurrency']} "
        f"ready in the broker), then one priority-0 job of {cfg['job_ms']:g} ms; the stream runs "
        f"until that job started, or for {res['target_seconds'] + AGING_MARGIN:g} s"
    ]
    for key, name in (("other_tenant", "(a) other tenant"), ("same_tenant", "(b) same tenant")):
        part = res[key]
        runs = part["runs"]
        during = sum(1 for r in runs if r["during_stream"])
        lines.append(
            f"   {name}: start delay {col(runs, 'delay', '{:.2f}')}; started while the stream "
            f"ran in {during}/{len(runs)}; s running while it waited: min "
            f"{min(r['s_running_min'] for r in runs)} of {cfg['concurrency']}; fewest ready in "
            f"the broker {min(r['stream_min_ready'] or 0 for r in runs)}"
        )
        late = [
            r["delay"] - r["stream_seconds_after_probe"] for r in runs if not r["during_stream"]
        ]
        if late:
            lines.append(
                f"       not started while the stream ran: it started "
                f"{spread_text(late, '{:.2f}')} after the stream stopped, "
                f"{spread_text([r['stream_seconds_after_probe'] for r in runs], '{:.1f}')} "
                "after its publish"
            )
        # the ready count can dip to 0 while an aging sweep holds s's messages (unacked):
        # saturation is judged by s's running jobs
        if any(r["s_running_min"] < 0.9 * cfg["concurrency"] for r in runs):
            lines.append("       WARNING: s ran below 90% of the slots in a repeat: not saturated")
        elif key == "same_tenant" and late:
            lines.append(
                "       why: RabbitMQ delivers a priority queue strictly by priority, so the "
                "priority-0 message stays in the broker behind s's priority-9 backlog until "
                "an aging sweep takes it (none did: COLDBREW_AGING_SWEEP_LIMIT=0, or a "
                "backlog above the limit)"
            )
        lines.append(
            f"       target: within {res['target_seconds']:g} s, during the stream (every repeat): "
            f"{verdict(part['pass'])} (worst {part['worst']:.2f} s)"
        )
        lines += warnings(runs)
    return lines


def render_caps(res: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    runs = res["runs"]
    sizes = cfg["sizes"]
    sampled = [r["b_sampled"] for r in runs]
    return [
        f"4. caps: tenant b max_running {res['cap']}, two workers; others "
        f"{sizes['caps_tenants']} tenants x {sizes['caps_jobs_per_tenant']:,} jobs of "
        f"{cfg['job_ms']:g} ms, first without b, then with b's {sizes['caps_b_jobs']} jobs of "
        f"{CAPPED_JOB_MS:g} ms queued {CAPS_HEAD_START:g} s earlier",
        f"   b running, sampled in PostgreSQL: max {res['worst_sampled']} "
        f"({sum(s['samples'] for s in sampled):,} samples, every "
        f"{statistics.median(s['mean_interval_ms'] or 0 for s in sampled):.0f} ms; "
        f"{sum(s['over_cap'] for s in sampled)} above {res['cap']}, "
        f"{sum(s['at_cap'] for s in sampled)} at {res['cap']})",
        f"   b running, exact from its jobs' start/end times: max overlap {res['worst_overlap']} "
        f"over {sum(r['b_finished'] for r in runs):,} finished jobs; b ran "
        f"{col(runs, 'b_rate', '{:.1f}', ' jobs/s')} while the others ran (the cap allows "
        f"{res['cap'] * 1000 / CAPPED_JOB_MS:g}): cap used "
        f"{col(runs, 'b_utilisation', '{:.0%}', '')} by its jobs' starts, "
        f"{col(runs, 'b_sampled_utilisation', '{:.0%}', '')} sampled",
        f"   others' jobs/s: b absent {col(runs, 'rate_absent', COUNT, '')}, b present and "
        f"capped {col(runs, 'rate_present', COUNT, '')}; ratio {col(runs, 'ratio', '{:.2f}', '')} "
        f"(over their first 90%: {col(runs, 'ratio90', '{:.2f}', '')})",
        f"   workers' CPU per other job: b absent "
        f"{col(runs, 'cpu_ms_per_job_absent', '{:.2f}', ' ms')}, b present "
        f"{col(runs, 'cpu_ms_per_job_present', '{:.2f}', ' ms')}; capped claims "
        f"that found no room (coldbrew_cap_waits_total) while b was present: "
        f"{col(runs, 'cap_waits', COUNT, '')}",
        f"   PostgreSQL's CPU per other job: b absent "
        f"{col(runs, 'postgres_cpu_ms_per_job_absent', '{:.2f}', ' ms')}, b present "
        f"{col(runs, 'postgres_cpu_ms_per_job_present', '{:.2f}', ' ms')}; RabbitMQ's: "
        f"{col(runs, 'rabbitmq_cpu_ms_per_job_absent', '{:.2f}', ' ms')}, "
        f"{col(runs, 'rabbitmq_cpu_ms_per_job_present', '{:.2f}', ' ms')}",
        f"   the workers' PostgreSQL sessions waiting on a lock (mean): b absent "
        f"{col(runs, 'lock_waits_absent', '{:.1f}', '')}, b present "
        f"{col(runs, 'lock_waits_present', '{:.1f}', '')} of "
        f"{col(runs, 'sessions_present', '{:.0f}', '')} open",
        f"   target: b never above {res['cap']} running: {verdict(res['cap_pass'])}; "
        f"others' rate not reduced (median ratio >= {res['ratio_target']}): "
        f"{verdict(res['ratio_pass'])}",
        *warnings(runs),
    ]


def drain_text(d: dict[str, Any]) -> str:
    text = (
        f"{d['rate']:,.0f} jobs/s, the last finished {d['last_finish_seconds']:.2f} s after the "
        f"first publish (publishing took {d['publish_seconds']:.2f} s)"
    )
    if "delay_p50" in d:  # absent in results of older versions of this script
        text += (
            f"; start delay p50 {d['delay_p50'] * 1000:.0f} ms, "
            f"p99 {d['delay_p99'] * 1000:.0f} ms, max {d['delay_max'] * 1000:.0f} ms"
        )
    return text


def render_scale(res: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    lines = []
    for r in res["runs"]:
        base, idle, spread, single = r["baseline"], r["idle"], r["spread"], r["single"]
        lines += [
            f"5. scale: one worker consuming {r['tenants']:,} tenant queues "
            f"(provisioned in {r['provision_seconds']:.1f} s; worker ready in "
            f"{r['ready_seconds']:.1f} s, vs {base['ready_seconds']:.1f} s with one queue)",
            f"   queues with a consumer: {r['consumed']:,}/{r['tenants']:,}",
            f"   idle over {cfg['sizes']['idle_seconds']:g} s: VmRSS "
            f"{idle['rss_kib'] / 1024:.1f} MiB and {idle['cpu_percent']:.1f}% of a core "
            "(same worker with one queue: "
            f"{base['rss_kib'] / 1024:.1f} MiB, {base['cpu_percent']:.1f}%); peak RSS "
            f"{r['peak_rss_kib'] / 1024:.1f} MiB",
            f"   one no-op job per tenant ({spread['jobs']:,}, each tenant's first): "
            f"{drain_text(spread)}",
            *(
                [f"   once more, one per tenant (each tenant's second): {drain_text(r['again'])}"]
                if "again" in r
                else []
            ),
            f"   the same {single['jobs']:,} on one tenant's queue: {drain_text(single)}",
        ]
    lines.append(
        "   target: none set by issue #4 (figures reported); check that every queue is consumed "
        f"and every job ran: {verdict(res['pass'])}"
    )
    return lines + warnings(res["runs"])


RENDERERS: dict[str, Callable[[dict[str, Any], dict[str, Any]], list[str]]] = {
    "burst": render_burst,
    "priority": render_priority,
    "aging": render_aging,
    "caps": render_caps,
    "scale": render_scale,
}


def render(result: dict[str, Any]) -> str:
    cfg, machine = result["config"], result["machine"]
    dirty = " + uncommitted src changes" if machine.get("src_modified") else ""
    prefetch = cfg["prefetch_setting"]
    prefetch_text = f"{prefetch}" if prefetch else "auto"
    if cfg["prefetch_effective"] is not None:
        prefetch_text += f" (= {cfg['prefetch_effective']})"
    lines = [
        f"coldbrew fairness (issue #4): concurrency {cfg['concurrency']}, prefetch per tenant "
        f"queue {prefetch_text}, {cfg['repeat']} repeats (scale {cfg['scale_repeat']})"
        f"{', QUICK sizes' if cfg['quick'] else ''}; {result['seconds']:.0f} s",
        f"coldbrew {machine.get('coldbrew_commit') or '?'}{dirty}; {machine['nproc']} x "
        f"{machine['cpu_model']}, {machine['ram_gib']} GiB; RabbitMQ {machine['rabbitmq']}, "
        f"PostgreSQL {machine['postgresql']}, Python {machine['python']}",
        "(medians, with min-max over repeats in brackets; delays are job start minus publish, "
        "wall clock)",
    ]
    for name in SCENARIOS:
        if name in result:
            lines.append("")
            lines += RENDERERS[name](result[name], cfg)
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"comma-separated ({','.join(SCENARIOS)})"
    )
    parser.add_argument(
        "--repeat", type=int, help="repeats of each scenario but scale (3; quick 1)"
    )
    parser.add_argument("--scale-repeat", type=int, default=1, help="repeats of scale (1)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for development")
    parser.add_argument("--concurrency", type=int, default=100, help="COLDBREW_CONCURRENCY (100)")
    parser.add_argument(
        "--prefetch", type=int, help="COLDBREW_PREFETCH for the workers (default: theirs, auto)"
    )
    parser.add_argument(
        "--aging-seconds", type=float, default=5.0, help="COLDBREW_AGING_SECONDS for aging (5)"
    )
    parser.add_argument(
        "--lag", type=float, default=0.5, help="seconds between consumer ready and the probes (0.5)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--logs", metavar="DIR", type=Path, help="keep the workers' logs in DIR")
    parser.add_argument("--amqp-url", default=DEFAULT_AMQP_URL)
    parser.add_argument(
        "--database-url",
        default=DEFAULT_DATABASE_URL,
        help=f"created if missing (default {DEFAULT_DATABASE_URL})",
    )
    parser.add_argument("--fifo-consumer", metavar="QUEUE", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.scenarios = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown or not args.scenarios:
        parser.error(f"--scenarios: unknown {sorted(unknown)}; choose from {','.join(SCENARIOS)}")
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if min(args.repeat, args.scale_repeat, args.concurrency) < 1:
        parser.error("--repeat, --scale-repeat and --concurrency must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fifo_consumer:
        import uvloop

        uvloop.run(fifo_consumer(args.amqp_url, args.fifo_consumer, args.count, args.concurrency))
        return 0

    def config(workdir: Path) -> Bench:
        base = BaseConfig(
            jobs=0,
            repeat=args.repeat,
            concurrency=args.concurrency,
            prefetch=args.prefetch or 0,
            idle_seconds=0.0,
            amqp_url=args.amqp_url,
            database_url=args.database_url,
            workdir=workdir,
        )
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
        return Bench(
            base=base,
            sizes=QUICK if args.quick else FULL,
            quick=args.quick,
            scenarios=args.scenarios,
            repeat=args.repeat,
            scale_repeat=args.scale_repeat,
            aging_seconds=args.aging_seconds,
            prefetch=args.prefetch,
            lag=args.lag,
            log_dir=args.logs,
        )

    return run_main(config, run, render, json_output=args.json, workdir_prefix="cbfair-")


if __name__ == "__main__":
    sys.exit(main())
