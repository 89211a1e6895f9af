"""What per-tenant quorum queues cost: broker memory and CPU, worker RSS and CPU (issue #14).

For each layout (classic: one priority queue per tenant; quorum: one queue per
priority band per tenant, each a Raft group), on a fresh namespace:

1. declare ``--tenants`` tenants' queues (lane ``default``) and record them,
   timing it and the broker's CPU (``beam.smp``, /proc) meanwhile;
2. the broker idle with those queues and no consumer (``--idle`` seconds):
   its CPU, its memory (``rabbitmq-diagnostics memory_breakdown``: the
   ``queue_procs``/``quorum_queue_procs``/``quorum_ets`` lines and the
   allocated total; and beam.smp's RSS);
3. one ``coldbrew worker`` consuming every one of them: seconds to ready, its
   RSS, its CPU and the broker's over ``--idle`` seconds idle;
4. ``--jobs`` no-op jobs spread round-robin over the tenants (plain aio-pika,
   plain routing keys): seconds to drain, worker and broker CPU per 1,000 jobs;
5. everything deleted, and the broker's memory read again.

The broker is the machine's shared node, so other users' load counts in its
CPU; run it when the machine is quiet, and read the medians of ``--repeat``.

    .venv/bin/python -m bench.quorum_cost --tenants 1000 --bands 3
    .venv/bin/python -m bench.quorum_cost --tenants 100 --modes quorum --json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
from bench._common import (
    Spread,
    cpu_seconds,
    delete_broker_entities,
    memory_kib,
    progress,
    run_main,
    worker_process,
)
from bench._worker import services

from coldbrew.migrate import migrate, quote_ident
from coldbrew.topology import Topology

NOOP = json.dumps({"type": "noop", "args": {}}).encode()


@dataclass(frozen=True, slots=True)
class Config:
    amqp_url: str
    database_url: str
    workdir: Path
    concurrency: int
    tenants: int
    bands: int
    modes: list[str]
    idle: float
    jobs: int
    repeat: int


def beam_pid() -> int:
    """The OS pid of the node ``rabbitmqctl`` talks to (other nodes may run: a cluster's)."""
    out = subprocess.run(
        ["rabbitmqctl", "-q", "eval", "os:getpid()."],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return int(out.strip().strip('"'))


def broker_memory() -> dict[str, float]:
    """MiB by category (the lines that grow with queues) and the allocated total."""
    out = subprocess.run(
        ["rabbitmq-diagnostics", "-q", "memory_breakdown", "--unit", "mb", "--formatter", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    lines = {name: value["bytes"] / 2**20 for name, value in json.loads(out).items()}
    total = sum(v for k, v in lines.items() if k != "reserved_unallocated")
    keep = ("queue_procs", "quorum_queue_procs", "quorum_ets", "mnesia", "other_proc", "binary")
    return {"allocated": round(total, 1), **{k: round(lines.get(k, 0.0), 1) for k in keep}}


async def idle_cpu(seconds: float, *pids: int) -> list[float]:
    """CPU seconds per second of each pid over ``seconds`` of waiting."""
    before = [cpu_seconds(pid) for pid in pids]
    await asyncio.sleep(seconds)
    return [(cpu_seconds(pid) - b) / seconds for pid, b in zip(pids, before, strict=True)]


async def declare(cfg: Config, topo: Topology) -> float:
    """Every tenant's queues with their bindings, recorded for the workers; seconds taken."""
    from coldbrew.transport import Broker

    broker = Broker(cfg.amqp_url, topo, name="bench-quorum-cost")
    await broker.connect()
    started = time.perf_counter()
    try:
        for i in range(cfg.tenants):
            await broker.declare_job_queue("default", f"t{i}")
    finally:
        await broker.close()
    seconds = time.perf_counter() - started
    conn = await asyncpg.connect(cfg.database_url)
    try:
        await conn.executemany(
            f"INSERT INTO {quote_ident(topo.namespace)}.tenant_queues (queue, tenant) "
            "VALUES ('default', $1) ON CONFLICT DO NOTHING",
            [(f"t{i}",) for i in range(cfg.tenants)],
        )
    finally:
        await conn.close()
    return seconds


async def publish(cfg: Config, topo: Topology) -> None:
    connection = await aio_pika.connect(cfg.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(topo.jobs_exchange)
        window = asyncio.Semaphore(256)

        async def one(i: int) -> None:
            async with window:
                message = aio_pika.Message(
                    NOOP,
                    message_id=f"j{i}",
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                await exchange.publish(message, routing_key=f"default.t{i % cfg.tenants}")

        await asyncio.gather(*(one(i) for i in range(cfg.jobs)))
    finally:
        await connection.close()


async def succeeded(cfg: Config, namespace: str) -> int:
    conn = await asyncpg.connect(cfg.database_url)
    try:
        return int(
            await conn.fetchval(
                f"SELECT count(*) FROM {quote_ident(namespace)}.jobs WHERE status = 'succeeded'"
            )
        )
    finally:
        await conn.close()


async def one_run(cfg: Config, mode: str) -> dict[str, Any]:
    namespace = f"bqc_{secrets.token_hex(3)}_{mode}"
    topo = Topology(namespace, "quorum" if mode == "quorum" else "classic", cfg.bands)
    beam = beam_pid()
    result: dict[str, Any] = {"mode": mode, "queues": cfg.tenants * len(topo.job_queues("d", "t"))}
    await migrate(cfg.database_url, namespace)
    try:
        memory_before = broker_memory()
        rss_before = memory_kib(beam)["VmRSS"]
        cpu_before = cpu_seconds(beam)
        progress(f"{mode}: declaring {result['queues']} queues")
        result["declare_seconds"] = round(await declare(cfg, topo), 1)
        result["declare_broker_cpu_seconds"] = round(cpu_seconds(beam) - cpu_before, 1)
        await asyncio.sleep(5)  # let the new Raft groups settle before reading
        memory_after = broker_memory()
        result["broker_memory_mib"] = memory_after
        result["broker_memory_growth_mib"] = round(
            memory_after["allocated"] - memory_before["allocated"], 1
        )
        result["broker_rss_growth_mib"] = round((memory_kib(beam)["VmRSS"] - rss_before) / 1024, 1)
        (idle,) = await idle_cpu(cfg.idle, beam)
        result["broker_idle_cpu_no_consumers"] = round(idle, 3)
        progress(f"{mode}: one worker consuming them")
        env = {
            "COLDBREW_QUEUE_TYPE": topo.queue_type,
            "COLDBREW_PRIORITY_BANDS": str(cfg.bands),
            "COLDBREW_QUEUES": "default",
            "COLDBREW_PREFETCH": "2",
        }
        async with worker_process(
            services_cfg(cfg), namespace, mode, extra_env=env, ready_timeout=900
        ) as worker:
            result["worker_ready_seconds"] = round(worker.ready_seconds, 1)
            await asyncio.sleep(5)
            broker_idle, worker_idle = await idle_cpu(cfg.idle, beam, worker.pid)
            result["broker_idle_cpu_consumed"] = round(broker_idle, 3)
            result["worker_idle_cpu"] = round(worker_idle, 3)
            result["worker_rss_mib"] = round(memory_kib(worker.pid)["VmRSS"] / 1024, 1)
            result["broker_memory_consumed_mib"] = broker_memory()["allocated"]
            if cfg.jobs:
                progress(f"{mode}: {cfg.jobs} jobs over {cfg.tenants} tenants")
                b0, w0 = cpu_seconds(beam), cpu_seconds(worker.pid)
                started = time.perf_counter()
                await publish(cfg, topo)
                while await succeeded(cfg, namespace) < cfg.jobs:
                    if time.perf_counter() - started > 600:
                        raise RuntimeError("jobs not done in 600 s")
                    await asyncio.sleep(0.2)
                seconds = time.perf_counter() - started
                per = 1000 / cfg.jobs
                result["jobs_per_second"] = round(cfg.jobs / seconds)
                result["broker_cpu_per_1000_jobs"] = round((cpu_seconds(beam) - b0) * per, 2)
                result["worker_cpu_per_1000_jobs"] = round((cpu_seconds(worker.pid) - w0) * per, 2)
                result["worker_rss_after_jobs_mib"] = round(
                    memory_kib(worker.pid)["VmRSS"] / 1024, 1
                )
    finally:
        progress(f"{mode}: deleting everything")
        pairs = [("default", f"t{i}") for i in range(cfg.tenants)]
        await delete_broker_entities(
            cfg.amqp_url,
            topo.every_queue_name(pairs),
            [topo.jobs_exchange, topo.unrouted_exchange, topo.dead_exchange],
        )
        conn = await asyncpg.connect(cfg.database_url)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(namespace)} CASCADE")
        finally:
            await conn.close()
    await asyncio.sleep(5)
    result["broker_memory_after_delete_mib"] = broker_memory()["allocated"]
    return result


def services_cfg(cfg: Config) -> Any:
    """What ``worker_process`` reads: the URLs, the work directory and the concurrency."""
    base = services(cfg.amqp_url, cfg.database_url, cfg.workdir)
    return dataclasses.replace(base, concurrency=cfg.concurrency)


async def run(cfg: Config) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in cfg.modes}
    for _ in range(cfg.repeat):
        for mode in cfg.modes:
            runs[mode].append(await one_run(cfg, mode))
    summary: dict[str, Any] = {}
    for mode, results in runs.items():
        numeric = {k for k, v in results[0].items() if isinstance(v, int | float)}
        summary[mode] = {k: Spread.of([r[k] for r in results]).as_dict() for k in sorted(numeric)}
        summary[mode]["broker_memory_mib"] = results[-1]["broker_memory_mib"]
    return {"tenants": cfg.tenants, "bands": cfg.bands, "runs": runs, "summary": summary}


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['tenants']} tenants, {result['bands']} bands (quorum)"]
    for mode, figures in result["summary"].items():
        lines.append(f"== {mode}")
        for key, value in figures.items():
            if "median" in value:
                lines.append(f"  {key:34} {value['median']:>10} ({value['min']} .. {value['max']})")
            else:
                lines.append(f"  {key:34} {value}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--bands", type=int, default=3)
    parser.add_argument("--modes", default="classic,quorum")
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--database-url", default="postgresql://127.0.0.1:5432/coldbrew_bench")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    return run_main(
        lambda workdir: Config(
            amqp_url=args.amqp_url,
            database_url=args.database_url,
            workdir=workdir,
            concurrency=args.concurrency,
            tenants=args.tenants,
            bands=args.bands,
            modes=args.modes.split(","),
            idle=args.idle,
            jobs=args.jobs,
            repeat=args.repeat,
        ),
        run,
        render,
        json_output=args.json,
        workdir_prefix="coldbrew-quorum-cost-",
    )


if __name__ == "__main__":
    raise SystemExit(main())
