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

On scripts/cluster's three nodes (``--nodes``: the broker figures are then per
node, suffixed ``_n1``.. ``_n3``; the worker and the bench connect to
``--amqp-url``, node 1, where 3.10 places every new quorum queue's leader)::

    .venv/bin/python -m bench.quorum_cost --amqp-url amqp://guest:guest@127.0.0.1:5681/ \
        --database-url postgresql://root@127.0.0.1:5441/coldbrew \
        --nodes cbc1@localhost,cbc2@localhost,cbc3@localhost
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import secrets
import subprocess
import time
from collections.abc import Sequence
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
    nodes: tuple[str | None, ...] = (None,)  # rabbitmqctl -n; None: its default node


def ctl(tool: str, node: str | None, *args: str) -> str:
    """``tool`` (rabbitmqctl, rabbitmq-diagnostics) against ``node`` (None: the default)."""
    target = ["-n", node] if node else []
    return subprocess.run(
        [tool, "-q", *target, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def suffixes(cfg: Config) -> list[str]:
    """Each node's suffix of the per-node figures: none for a single node."""
    return [""] if len(cfg.nodes) == 1 else [f"_n{i + 1}" for i in range(len(cfg.nodes))]


def beam_pid(node: str | None = None) -> int:
    """The OS pid of ``node`` (None: the one ``rabbitmqctl`` talks to by default)."""
    return int(ctl("rabbitmqctl", node, "eval", "os:getpid().").strip().strip('"'))


HANDLES_PER_QUORUM_QUEUE = 5
"""File handles a quorum queue reserves in RabbitMQ 3.10's file handle cache, on the node
that leads it (measured here: 6,499 reserved by about 2,300 quorum queues on a single node,
2.8; on scripts/cluster, where node 1 leads every queue it declared, ~4.9 there and ~2 on
each follower)."""


def handle_limit(node: str | None = None) -> tuple[int, int]:
    """(limit, used) of the node's file handle cache: past the limit the node accepts no new
    AMQP connection (a socket needs a handle) and classic queues stall on their journals."""
    out = ctl("rabbitmqctl", node, "eval", "file_handle_cache:info([total_limit, total_used]).")
    limit, used = (int(n) for n in re.findall(r"\d+", out))
    return limit, used


def broker_memory(node: str | None = None) -> dict[str, float]:
    """MiB by category (the lines that grow with queues) and the allocated total."""
    out = ctl(
        "rabbitmq-diagnostics", node, "memory_breakdown", "--unit", "mb", "--formatter", "json"
    )
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
    tags = suffixes(cfg)
    beams = [beam_pid(node) for node in cfg.nodes]
    result: dict[str, Any] = {"mode": mode, "queues": cfg.tenants * len(topo.job_queues("d", "t"))}
    if topo.quorum:
        for node, tag in zip(cfg.nodes, tags, strict=True):
            limit, used = handle_limit(node)
            result[f"handle_limit{tag}"] = limit
            # every node holds a member of every quorum queue (the initial group is the cluster)
            needed = result["queues"] * HANDLES_PER_QUORUM_QUEUE
            if used + needed > limit * 0.8:
                raise RuntimeError(
                    f"{result['queues']} quorum queues reserve about {needed} file handles; "
                    f"node {node or 'default'} has {limit - used} of {limit} free: it would stop"
                    " accepting connections (raise its open-files limit, or use fewer --tenants)"
                )
    await migrate(cfg.database_url, namespace)
    try:
        memory_before = [broker_memory(node) for node in cfg.nodes]
        rss_before = [memory_kib(beam)["VmRSS"] for beam in beams]
        cpu_before = [cpu_seconds(beam) for beam in beams]
        progress(f"{mode}: declaring {result['queues']} queues")
        result["declare_seconds"] = round(await declare(cfg, topo), 1)
        for tag, beam, before in zip(tags, beams, cpu_before, strict=True):
            result[f"declare_broker_cpu_seconds{tag}"] = round(cpu_seconds(beam) - before, 1)
        await asyncio.sleep(5)  # let the new Raft groups settle before reading
        for node, tag, beam, mem0, rss0 in zip(
            cfg.nodes, tags, beams, memory_before, rss_before, strict=True
        ):
            memory_after = broker_memory(node)
            result[f"broker_memory_mib{tag}"] = memory_after
            result[f"broker_memory_growth_mib{tag}"] = round(
                memory_after["allocated"] - mem0["allocated"], 1
            )
            result[f"broker_rss_growth_mib{tag}"] = round(
                (memory_kib(beam)["VmRSS"] - rss0) / 1024, 1
            )
        idle = await idle_cpu(cfg.idle, *beams)
        for tag, value in zip(tags, idle, strict=True):
            result[f"broker_idle_cpu_no_consumers{tag}"] = round(value, 3)
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
            *broker_idle, worker_idle = await idle_cpu(cfg.idle, *beams, worker.pid)
            for node, tag, value in zip(cfg.nodes, tags, broker_idle, strict=True):
                result[f"broker_idle_cpu_consumed{tag}"] = round(value, 3)
                result[f"broker_memory_consumed_mib{tag}"] = broker_memory(node)["allocated"]
            result["worker_idle_cpu"] = round(worker_idle, 3)
            result["worker_rss_mib"] = round(memory_kib(worker.pid)["VmRSS"] / 1024, 1)
            if cfg.jobs:
                progress(f"{mode}: {cfg.jobs} jobs over {cfg.tenants} tenants")
                b0 = [cpu_seconds(beam) for beam in beams]
                w0 = cpu_seconds(worker.pid)
                started = time.perf_counter()
                await publish(cfg, topo)
                while await succeeded(cfg, namespace) < cfg.jobs:
                    if time.perf_counter() - started > 600:
                        raise RuntimeError("jobs not done in 600 s")
                    await asyncio.sleep(0.2)
                seconds = time.perf_counter() - started
                per = 1000 / cfg.jobs
                result["jobs_per_second"] = round(cfg.jobs / seconds)
                for tag, beam, before in zip(tags, beams, b0, strict=True):
                    result[f"broker_cpu_per_1000_jobs{tag}"] = round(
                        (cpu_seconds(beam) - before) * per, 2
                    )
                result["worker_cpu_per_1000_jobs"] = round((cpu_seconds(worker.pid) - w0) * per, 2)
                result["worker_rss_after_jobs_mib"] = round(
                    memory_kib(worker.pid)["VmRSS"] / 1024, 1
                )
    finally:
        progress(f"{mode}: deleting everything")
        pairs = [("default", "default")] + [("default", f"t{i}") for i in range(cfg.tenants)]
        await delete_queues(cfg.amqp_url, topo.every_queue_name(pairs))
        await delete_broker_entities(
            cfg.amqp_url, [], [topo.jobs_exchange, topo.unrouted_exchange, topo.dead_exchange]
        )
        conn = await asyncpg.connect(cfg.database_url)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(namespace)} CASCADE")
        finally:
            await conn.close()
    await asyncio.sleep(5)
    for node, tag in zip(cfg.nodes, tags, strict=True):
        result[f"broker_memory_after_delete_mib{tag}"] = broker_memory(node)["allocated"]
    return result


async def delete_queues(amqp_url: str, names: Sequence[str], width: int = 16) -> None:
    """Delete queues ``width`` at a time, one channel each: deleting a quorum queue takes
    about 0.5 s (its Raft group stops on every member), so 3,000 one by one take 25 min."""
    connection = await aio_pika.connect(amqp_url)
    try:
        pending = list(names)

        async def deleter() -> None:
            channel = await connection.channel()
            while pending:
                await channel.queue_delete(pending.pop())
            await channel.close()

        await asyncio.gather(*(deleter() for _ in range(width)))
    finally:
        await connection.close()


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
        for tag in suffixes(cfg):
            summary[mode][f"broker_memory_mib{tag}"] = results[-1][f"broker_memory_mib{tag}"]
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
    parser.add_argument(
        "--nodes",
        default="",
        help="comma-separated RabbitMQ node names to measure (rabbitmqctl -n), e.g. the"
        " cluster's cbc1@localhost,cbc2@localhost,cbc3@localhost; default: rabbitmqctl's own",
    )
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
            nodes=tuple(args.nodes.split(",")) if args.nodes else (None,),
        ),
        run,
        render,
        json_output=args.json,
        workdir_prefix="coldbrew-quorum-cost-",
    )


if __name__ == "__main__":
    raise SystemExit(main())
