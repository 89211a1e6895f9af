"""Per-tenant quorum queues against shared per-lane band queues, side by side (issue #14).

coldbrew's quorum mode gives every (lane, tenant) ``--bands`` FIFO quorum queues
(``<ns>.qq.<lane>.<tenant>.p<lo>-<hi>``): at 1,000 tenants that is 3,000 Raft
groups. The alternative designed in bench/README.md ("What to do at 1,000
tenants") is one set of band queues per lane, ``<ns>.qq.<lane>.p<lo>-<hi>``,
every tenant's messages in them, the tenant read from the routing key.
**coldbrew does not implement that layout**: this bench measures the broker's
side of both layouts and the fairness cost of the shared one, with a plain
aio-pika consumer on both sides (the same code), so the comparison is the
layout and nothing else.

For each layout (``--layouts per-tenant,per-lane``), on a fresh namespace:

1. declare the queues (coldbrew's arguments: delivery limit, at-least-once
   dead-lettering to ``<ns>.dlx``) with their bindings, one channel, one after
   the other as ``Broker.declare_job_queue`` does: seconds, broker CPU per node;
2. idle with no consumer (``--idle`` s): broker CPU per node, file handles
   (RabbitMQ 3.10's file handle cache, what ran out before), memory per node
   (``memory_breakdown``), queue leaders per node;
3. one consumer subscribed to every job queue (prefetch ``--prefetch`` per
   queue): seconds to ready, broker idle CPU with it;
4. ``--messages`` no-op messages spread round-robin over the tenants (banded
   routing keys ``default.t<i>.<priority>``, priorities cycling 0-9), published
   with confirms while the consumer drains them, each acked singly: messages
   per second end to end, broker CPU per 1,000 messages per node and the bench
   process's own CPU (publisher plus consumer);
5. head-of-line blocking (``--burst``): with no consumer, tenant ``t0`` publishes
   ``--burst`` messages and then ``t1`` one, all at priority 0 (the same band);
   then a consumer starts that runs each job for ``--work-ms`` with
   ``--concurrency`` slots, picking among what it holds round-robin by tenant.
   Variants (``--hol-variants``): ``fifo`` holds whatever the prefetch brings;
   ``requeue`` keeps at most ``--hold-bound`` unacked deliveries per tenant and
   rejects with requeue beyond it (meant to skim past the burst; but 3.10.8
   redelivers a requeued message first when the queue has a delivery limit, as
   coldbrew's have: see ``requeue_order`` and ``--probe-burst``). Measured:
   ``t1``'s wait from the consumer's start to its job's start, the burst's drain
   time, requeues, the highest ``x-delivery-count`` seen (the queues dead-letter
   at coldbrew's limit of 1,000), broker CPU per node;
6. everything deleted (16 channels at once), memory per node read again.

``--leader-tenants N`` then declares N tenants' per-tenant queues twice, with
the default leader placement (``client-local``: every leader on the node the
declaring client uses) and with ``x-queue-leader-locator: balanced`` (accepted
by 3.10.8 as a queue argument, a ``queue-leader-locator`` policy key, or
``queue_leader_locator`` in rabbitmq.conf), and reads leaders and file handles
per node for each.

Run it on scripts/cluster's three nodes, under the shared heavy-bench lock::

    flock /tmp/coldbrew-heavy.lock .venv/bin/python -m bench.quorum_layout --json \\
        --amqp-url amqp://guest:guest@127.0.0.1:5681/ \\
        --nodes cbc1@localhost,cbc2@localhost,cbc3@localhost
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage
from bench._common import BenchError, Spread, cpu_seconds, progress, run_main
from bench.quorum_cost import (
    HANDLES_PER_QUORUM_QUEUE,
    beam_pid,
    broker_memory,
    ctl,
    delete_queues,
    handle_limit,
    idle_cpu,
)

from coldbrew.topology import PRIORITY_LEVELS, Topology

LANE = "default"
LAYOUTS = ("per-tenant", "per-lane")


@dataclass(frozen=True, slots=True)
class Config:
    amqp_url: str
    nodes: tuple[str | None, ...]
    tenants: int
    bands: int
    layouts: list[str]
    messages: int
    idle: float
    repeat: int
    prefetch: int
    burst: int
    work_ms: float
    concurrency: int
    hold_bound: int
    hol_variants: list[str]
    hol_timeout: float
    leader_tenants: int
    probe_burst: int


# --- the two layouts -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layout:
    """The job queues of one lane in one layout, and their bindings on the jobs exchange."""

    name: str
    topo: Topology
    tenants: int
    extra_arguments: dict[str, Any] = field(default_factory=dict)

    def shared_band_queue(self, band: int) -> str:
        low, high = self.topo.band_ranges()[band]
        return f"{self.topo.namespace}.qq.{LANE}.p{low}-{high}"

    def queues(self) -> list[str]:
        """Every job queue (per-tenant: tenant by tenant, each highest band first)."""
        if self.name == "per-tenant":
            return [q for i in range(self.tenants) for q in self.topo.job_queues(LANE, f"t{i}")]
        return [self.shared_band_queue(band) for band in reversed(range(self.topo.bands))]

    def bindings(self) -> list[tuple[str, str]]:
        """(queue, routing key): per-tenant as coldbrew binds them; per-lane the same keys
        with ``*`` for the tenant (a band its priorities, the lowest band the plain key)."""
        if self.name == "per-tenant":
            return [
                b for i in range(self.tenants) for b in self.topo.job_queue_bindings(LANE, f"t{i}")
            ]
        bindings = [(self.shared_band_queue(0), f"{LANE}.*")]
        for priority in range(PRIORITY_LEVELS):
            band = self.topo.band_of(priority)
            bindings.append((self.shared_band_queue(band), f"{LANE}.*.{priority}"))
        return bindings

    def arguments(self) -> dict[str, Any]:
        return {**self.topo.job_queue_arguments(), **self.extra_arguments}


async def declare(cfg: Config, layout: Layout) -> float:
    """The exchanges, the dead queue and every job queue with its bindings, on one channel,
    queue after queue as ``Broker.declare_job_queue`` does; seconds taken."""
    topo = layout.topo
    connection = await aio_pika.connect(cfg.amqp_url)
    started = time.perf_counter()
    try:
        channel = await connection.channel()
        dead = await channel.declare_exchange(
            topo.dead_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        await channel.declare_exchange(
            topo.jobs_exchange, aio_pika.ExchangeType.TOPIC, durable=True
        )
        dead_queue = await channel.declare_queue(
            topo.dead_queue, durable=True, arguments=topo.dead_queue_arguments()
        )
        await dead_queue.bind(dead, routing_key="#")
        by_queue: dict[str, list[str]] = collections.defaultdict(list)
        for name, key in layout.bindings():
            by_queue[name].append(key)
        arguments = layout.arguments()
        for name in layout.queues():
            queue = await channel.declare_queue(name, durable=True, arguments=arguments)
            for key in by_queue[name]:
                await queue.bind(topo.jobs_exchange, routing_key=key)
    finally:
        await connection.close()
    return time.perf_counter() - started


async def delete_layout(cfg: Config, layout: Layout) -> None:
    """Every queue and exchange the layout declared (quorum deletes in parallel)."""
    topo = layout.topo
    await delete_queues(cfg.amqp_url, [*layout.queues(), topo.dead_queue], width=16)
    connection = await aio_pika.connect(cfg.amqp_url)
    try:
        channel = await connection.channel()
        for name in (topo.jobs_exchange, topo.dead_exchange):
            await channel.exchange_delete(name)
    finally:
        await connection.close()


# --- broker readings ----------------------------------------------------------------------------


def suffixes(cfg: Config) -> list[str]:
    return [""] if len(cfg.nodes) == 1 else [f"_n{i + 1}" for i in range(len(cfg.nodes))]


def leaders_per_node(cfg: Config, namespace: str) -> dict[str, int]:
    """How many of the namespace's quorum queues each node leads (``list_queues leader``)."""
    out = ctl("rabbitmqctl", cfg.nodes[0], "list_queues", "name", "leader", "--formatter", "json")
    counts: collections.Counter[str] = collections.Counter()
    for row in json.loads(out):
        if row["name"].startswith(f"{namespace}."):
            counts[str(row["leader"])] += 1
    return dict(sorted(counts.items()))


def handles(cfg: Config) -> list[int]:
    return [handle_limit(node)[1] for node in cfg.nodes]


def cpu_all(beams: Sequence[int]) -> list[float]:
    return [cpu_seconds(beam) for beam in beams]


def per_node(result: dict[str, Any], cfg: Config, key: str, values: Sequence[float]) -> None:
    for tag, value in zip(suffixes(cfg), values, strict=True):
        result[f"{key}{tag}"] = round(value, 3)


# --- the consumer -----------------------------------------------------------------------------


class Consumer:
    """A plain aio-pika consumer over a list of queues that runs each message as a job.

    ``concurrency`` slots take held deliveries round-robin by tenant (the tenant is the
    routing key's second word), run each for ``work`` seconds and ack it singly. With
    ``hold_bound`` a delivery for a tenant that already holds that many unacked ones is
    rejected with requeue, so one tenant's burst cannot fill the prefetch window.
    """

    def __init__(
        self,
        amqp_url: str,
        queues: Sequence[str],
        *,
        prefetch: int,
        concurrency: int,
        work: float = 0.0,
        hold_bound: int | None = None,
        watch_tenant: str | None = None,
    ) -> None:
        self.amqp_url = amqp_url
        self.queue_names = list(queues)
        self.prefetch = prefetch
        self.concurrency = concurrency
        self.work = work
        self.hold_bound = hold_bound
        self.watch_tenant = watch_tenant
        self.ready: dict[str, collections.deque[AbstractIncomingMessage]] = {}
        self.held: collections.Counter[str] = collections.Counter()
        self.done: collections.Counter[str] = collections.Counter()
        self.wakeup = asyncio.Condition()
        self.requeued = 0
        self.deliveries = 0
        self.watched_index: int | None = None
        self.max_delivery_count = 0
        self.started_at = 0.0
        self.ready_seconds = 0.0
        self.watched_delivered: float | None = None
        self.watched_started: float | None = None
        self.progressed = asyncio.Event()
        self.connection: AbstractConnection | None = None
        self.workers: list[asyncio.Task[None]] = []

    @property
    def total_done(self) -> int:
        return sum(self.done.values())

    async def start(self) -> None:
        self.started_at = time.perf_counter()
        self.workers = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        self.connection = await aio_pika.connect(self.amqp_url)
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=self.prefetch)  # per consumer (per queue)
        for name in self.queue_names:
            queue = await channel.get_queue(name, ensure=False)
            await queue.consume(self._on_message)
        self.ready_seconds = time.perf_counter() - self.started_at

    async def close(self) -> None:
        for task in self.workers:
            task.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)
        if self.connection is not None:
            await self.connection.close()  # the broker requeues whatever is still unacked

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        tenant = (message.routing_key or "").split(".")[1]
        self.deliveries += 1
        if tenant == self.watch_tenant and self.watched_index is None:
            self.watched_index = self.deliveries
        count = (message.headers or {}).get("x-delivery-count", 0)
        if isinstance(count, int):
            self.max_delivery_count = max(self.max_delivery_count, count)
        if self.hold_bound is not None and self.held[tenant] >= self.hold_bound:
            self.requeued += 1
            await message.reject(requeue=True)
            return
        if tenant == self.watch_tenant and self.watched_delivered is None:
            self.watched_delivered = time.perf_counter() - self.started_at
        self.held[tenant] += 1
        self.ready.setdefault(tenant, collections.deque()).append(message)
        async with self.wakeup:
            self.wakeup.notify()

    def _next(self) -> AbstractIncomingMessage | None:
        """The oldest held delivery of the tenant that waited longest for a turn."""
        for tenant in list(self.ready):
            waiting = self.ready.pop(tenant)
            if waiting:
                message = waiting.popleft()
                if waiting:
                    self.ready[tenant] = waiting  # back of the rotation
                return message
        return None

    async def _worker(self) -> None:
        while True:
            async with self.wakeup:
                message = self._next()
                while message is None:
                    await self.wakeup.wait()
                    message = self._next()
            tenant = (message.routing_key or "").split(".")[1]
            if tenant == self.watch_tenant and self.watched_started is None:
                self.watched_started = time.perf_counter() - self.started_at
            if self.work:
                await asyncio.sleep(self.work)
            await message.ack()
            self.held[tenant] -= 1
            self.done[tenant] += 1
            self.progressed.set()

    async def wait_for(self, total: int, timeout: float) -> float | None:
        """Seconds from the start until ``total`` messages are done, None after ``timeout``."""
        deadline = self.started_at + timeout
        while self.total_done < total:
            self.progressed.clear()
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(self.progressed.wait(), min(left, 1.0))
            except TimeoutError:
                continue
        return time.perf_counter() - self.started_at


async def publish(
    amqp_url: str, exchange_name: str, keys: Sequence[str], window: int = 256
) -> float:
    """Publish one persistent no-op per routing key with confirms; seconds taken."""
    connection = await aio_pika.connect(amqp_url)
    started = time.perf_counter()
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(exchange_name, ensure=False)
        slots = asyncio.Semaphore(window)
        body = json.dumps({"type": "noop", "args": {}}).encode()

        async def one(i: int, key: str) -> None:
            async with slots:
                await exchange.publish(
                    aio_pika.Message(
                        body,
                        message_id=f"m{i}",
                        content_type="application/json",
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=key,
                    mandatory=False,
                )

        await asyncio.gather(*(one(i, key) for i, key in enumerate(keys)))
    finally:
        await connection.close()
    return time.perf_counter() - started


async def queue_depths(amqp_url: str, names: Sequence[str]) -> int:
    """Messages ready in the queues (a passive declare each)."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        total = 0
        for name in names:
            queue = await channel.declare_queue(name, passive=True)
            total += queue.declaration_result.message_count or 0
        return total
    finally:
        await connection.close()


async def purge(amqp_url: str, names: Sequence[str]) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        for name in names:
            queue = await channel.get_queue(name, ensure=False)
            await queue.purge()
    finally:
        await connection.close()


def process_cpu() -> float:
    times = os.times()
    return times.user + times.system


# --- one layout, one round ----------------------------------------------------------------------


async def throughput(cfg: Config, layout: Layout, beams: Sequence[int]) -> dict[str, Any]:
    """Steps 3-4: a consumer on every queue, then ``--messages`` through it."""
    result: dict[str, Any] = {}
    consumer = Consumer(
        cfg.amqp_url, layout.queues(), prefetch=cfg.prefetch, concurrency=cfg.prefetch
    )
    try:
        await consumer.start()
        result["consumer_ready_seconds"] = round(consumer.ready_seconds, 1)
        await asyncio.sleep(3)
        per_node(result, cfg, "broker_idle_cpu_consumed", await idle_cpu(cfg.idle, *beams))
        keys = [
            f"{LANE}.t{i % layout.tenants}.{(i // layout.tenants) % PRIORITY_LEVELS}"
            for i in range(cfg.messages)
        ]
        cpu0, own0 = cpu_all(beams), process_cpu()
        started = time.perf_counter()
        base = consumer.total_done
        publish_seconds = await publish(cfg.amqp_url, layout.topo.jobs_exchange, keys)
        deadline = 600.0
        while consumer.total_done < base + cfg.messages:
            if time.perf_counter() - started > deadline:
                raise BenchError(f"{layout.name}: {cfg.messages} messages not drained in 600 s")
            consumer.progressed.clear()
            try:
                await asyncio.wait_for(consumer.progressed.wait(), 1.0)
            except TimeoutError:
                continue
        seconds = time.perf_counter() - started
        per = 1000 / cfg.messages
        result["publish_seconds"] = round(publish_seconds, 1)
        result["messages_per_second"] = round(cfg.messages / seconds)
        per_node(
            result,
            cfg,
            "broker_cpu_per_1000_messages",
            [(now - before) * per for now, before in zip(cpu_all(beams), cpu0, strict=True)],
        )
        result["bench_cpu_per_1000_messages"] = round((process_cpu() - own0) * per, 3)
    finally:
        await consumer.close()
    return result


async def head_of_line(
    cfg: Config, layout: Layout, beams: Sequence[int], variant: str
) -> dict[str, Any]:
    """Step 5: ``t0``'s burst ahead of ``t1``'s single message, then a consumer."""
    keys = [f"{LANE}.t0.0"] * cfg.burst + [f"{LANE}.t1.0"]
    await publish(cfg.amqp_url, layout.topo.jobs_exchange, keys)
    consumer = Consumer(
        cfg.amqp_url,
        layout.queues(),
        prefetch=cfg.prefetch,
        concurrency=cfg.concurrency,
        work=cfg.work_ms / 1000,
        hold_bound=cfg.hold_bound if variant == "requeue" else None,
        watch_tenant="t1",
    )
    result: dict[str, Any] = {}
    cpu0 = cpu_all(beams)
    try:
        await consumer.start()
        drained = await consumer.wait_for(len(keys), cfg.hol_timeout)
    finally:
        await consumer.close()
    wait = consumer.watched_started
    result["other_tenant_wait_seconds"] = round(wait, 3) if wait is not None else None
    delivered = consumer.watched_delivered
    result["other_tenant_delivered_seconds"] = (
        round(delivered, 3) if delivered is not None else None
    )
    result["burst_drain_seconds"] = round(drained, 1) if drained is not None else None
    result["done"] = consumer.total_done
    result["requeued"] = consumer.requeued
    result["max_delivery_count"] = consumer.max_delivery_count
    result["consumer_ready_seconds"] = round(consumer.ready_seconds, 2)
    per_node(
        result,
        cfg,
        "broker_cpu_seconds",
        [now - before for now, before in zip(cpu_all(beams), cpu0, strict=True)],
    )
    left = await queue_depths(cfg.amqp_url, layout.queues())
    dead = await queue_depths(cfg.amqp_url, [layout.topo.dead_queue])
    result["left_in_queues"] = left
    result["dead_lettered"] = dead
    if left or dead:
        await purge(cfg.amqp_url, [*layout.queues(), layout.topo.dead_queue])
    return result


async def requeue_order(cfg: Config, delivery_limit: bool) -> dict[str, Any]:
    """Where 3.10.8 puts a rejected-with-requeue message of a quorum queue: ``--probe-burst``
    of ``t0``'s ahead of ``t1``'s one in a single queue, the HOL consumer with the hold bound.

    With coldbrew's arguments (``x-delivery-limit`` and at-least-once dead-lettering) a
    returned message is delivered again before the rest of the queue, so the bound cannot
    skim past a burst; without a delivery limit it goes behind what is queued. Only the
    first is an option for coldbrew (a limit bounds a crash loop; 4.0 defaults it to 20).
    """
    topo = Topology(f"bql_{secrets.token_hex(3)}_order", "quorum", 1)
    name = f"{topo.namespace}.qq.{LANE}.p0-9"
    arguments: dict[str, Any] = (
        topo.job_queue_arguments() if delivery_limit else {"x-queue-type": "quorum"}
    )
    connection = await aio_pika.connect(cfg.amqp_url)
    channel = await connection.channel()
    try:
        await channel.declare_exchange(
            topo.dead_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        await channel.declare_exchange(
            topo.jobs_exchange, aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(name, durable=True, arguments=arguments)
        await queue.bind(topo.jobs_exchange, routing_key=f"{LANE}.*.*")
        keys = [f"{LANE}.t0.0"] * cfg.probe_burst + [f"{LANE}.t1.0"]
        await publish(cfg.amqp_url, topo.jobs_exchange, keys)
        consumer = Consumer(
            cfg.amqp_url,
            [name],
            prefetch=cfg.prefetch,
            concurrency=cfg.concurrency,
            work=cfg.work_ms / 1000,
            hold_bound=cfg.hold_bound,
            watch_tenant="t1",
        )
        try:
            await consumer.start()
            drained = await consumer.wait_for(len(keys), cfg.hol_timeout)
        finally:
            await consumer.close()
        return {
            "delivery_limit": delivery_limit,
            "burst": cfg.probe_burst,
            "other_tenant_delivered_seconds": consumer.watched_delivered,
            "deliveries_until_other_tenant": consumer.watched_index,
            "burst_drain_seconds": drained,
            "requeued": consumer.requeued,
            "max_delivery_count": consumer.max_delivery_count,
        }
    finally:
        await channel.queue_delete(name)
        await channel.exchange_delete(topo.jobs_exchange)
        await channel.exchange_delete(topo.dead_exchange)
        await connection.close()


async def one_run(cfg: Config, name: str) -> dict[str, Any]:
    namespace = f"bql_{secrets.token_hex(3)}_{name.replace('-', '')}"
    layout = Layout(name, Topology(namespace, "quorum", cfg.bands), cfg.tenants)
    beams = [beam_pid(node) for node in cfg.nodes]
    result: dict[str, Any] = {"layout": name, "queues": len(layout.queues())}
    check_handles(cfg, len(layout.queues()))
    try:
        memory0 = [broker_memory(node)["allocated"] for node in cfg.nodes]
        handles0 = handles(cfg)
        cpu0 = cpu_all(beams)
        progress(f"{name}: declaring {result['queues']} queues")
        result["declare_seconds"] = round(await declare(cfg, layout), 1)
        per_node(
            result,
            cfg,
            "declare_broker_cpu_seconds",
            [now - before for now, before in zip(cpu_all(beams), cpu0, strict=True)],
        )
        await asyncio.sleep(5)  # let the new Raft groups settle before reading
        per_node(
            result,
            cfg,
            "file_handles_added",
            [now - before for now, before in zip(handles(cfg), handles0, strict=True)],
        )
        memories = [broker_memory(node) for node in cfg.nodes]
        per_node(
            result,
            cfg,
            "broker_memory_growth_mib",
            [m["allocated"] - m0 for m, m0 in zip(memories, memory0, strict=True)],
        )
        per_node(result, cfg, "quorum_queue_procs_mib", [m["quorum_queue_procs"] for m in memories])
        result["leaders"] = leaders_per_node(cfg, namespace)
        per_node(result, cfg, "broker_idle_cpu_no_consumer", await idle_cpu(cfg.idle, *beams))
        progress(f"{name}: {cfg.messages} messages through one consumer")
        result.update(await throughput(cfg, layout, beams))
        for variant in cfg.hol_variants:
            progress(f"{name}: head of line, {variant}: {cfg.burst} of t0's ahead of t1's one")
            hol = await head_of_line(cfg, layout, beams, variant)
            result.update({f"hol_{variant}_{k}": v for k, v in hol.items()})
    finally:
        progress(f"{name}: deleting everything")
        await delete_layout(cfg, layout)
    await asyncio.sleep(5)
    per_node(
        result,
        cfg,
        "broker_memory_after_delete_growth_mib",
        [
            broker_memory(node)["allocated"] - m0
            for node, m0 in zip(cfg.nodes, memory0, strict=True)
        ],
    )
    return result


def check_handles(cfg: Config, queues: int) -> None:
    """Refuse a run that would push the declaring node's file handle cache past 85%: a node
    out of handles accepts no new connection (bench/README.md, "The limit found")."""
    limit, used = handle_limit(cfg.nodes[0])
    needed = queues * HANDLES_PER_QUORUM_QUEUE
    if used + needed > limit * 0.85:
        raise BenchError(
            f"{queues} quorum queues reserve about {needed} file handles on the leading node;"
            f" {cfg.nodes[0] or 'the node'} has {limit - used} of {limit} free"
        )


async def leader_spread(cfg: Config, locator: str) -> dict[str, Any]:
    """N tenants' per-tenant queues declared with ``locator``: leaders and handles per node."""
    namespace = f"bql_{secrets.token_hex(3)}_lead"
    extra = {} if locator == "client-local" else {"x-queue-leader-locator": locator}
    layout = Layout(
        "per-tenant", Topology(namespace, "quorum", cfg.bands), cfg.leader_tenants, extra
    )
    beams = [beam_pid(node) for node in cfg.nodes]
    check_handles(cfg, len(layout.queues()))
    result: dict[str, Any] = {"locator": locator, "queues": len(layout.queues())}
    try:
        handles0 = handles(cfg)
        cpu0 = cpu_all(beams)
        progress(f"leaders, {locator}: declaring {result['queues']} queues")
        result["declare_seconds"] = round(await declare(cfg, layout), 1)
        per_node(
            result,
            cfg,
            "declare_broker_cpu_seconds",
            [now - before for now, before in zip(cpu_all(beams), cpu0, strict=True)],
        )
        await asyncio.sleep(5)
        result["leaders"] = leaders_per_node(cfg, namespace)
        per_node(
            result,
            cfg,
            "file_handles_added",
            [now - before for now, before in zip(handles(cfg), handles0, strict=True)],
        )
        per_node(result, cfg, "broker_idle_cpu", await idle_cpu(cfg.idle, *beams))
    finally:
        progress(f"leaders, {locator}: deleting")
        await delete_layout(cfg, layout)
    return result


async def run(cfg: Config) -> dict[str, Any]:
    version = ctl("rabbitmqctl", cfg.nodes[0], "version").strip()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cfg.layouts}
    for round_ in range(cfg.repeat):
        for name in cfg.layouts:
            progress(f"round {round_ + 1}/{cfg.repeat}: {name}")
            runs[name].append(await one_run(cfg, name))
            progress(f"{name}: {json.dumps(runs[name][-1])}")  # kept if a later round fails
    summary: dict[str, Any] = {}
    for name, results in runs.items():
        numeric = {k for k, v in results[0].items() if isinstance(v, int | float)}
        summary[name] = {
            k: Spread.of([r[k] for r in results if isinstance(r.get(k), int | float)]).as_dict()
            for k in sorted(numeric)
        }
    order = []
    for delivery_limit in (True, False) if cfg.probe_burst else ():
        order.append(await requeue_order(cfg, delivery_limit))
        progress(f"requeue order: {json.dumps(order[-1])}")
    leaders = []
    if cfg.leader_tenants:
        for locator in ("client-local", "balanced"):
            leaders.append(await leader_spread(cfg, locator))
            progress(f"leaders: {json.dumps(leaders[-1])}")
    return {
        "rabbitmq": version,
        "nodes": list(cfg.nodes),
        "tenants": cfg.tenants,
        "bands": cfg.bands,
        "messages": cfg.messages,
        "burst": cfg.burst,
        "work_ms": cfg.work_ms,
        "concurrency": cfg.concurrency,
        "prefetch": cfg.prefetch,
        "hold_bound": cfg.hold_bound,
        "load_average": os.getloadavg(),
        "runs": runs,
        "summary": summary,
        "leader_spread": leaders,
        "requeue_order": order,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"RabbitMQ {result['rabbitmq']}, {result['tenants']} tenants x {result['bands']} bands,"
        f" {result['messages']} messages, burst {result['burst']}"
    ]
    for name, figures in result["summary"].items():
        lines.append(f"== {name}")
        for key, value in figures.items():
            lines.append(f"  {key:44} {value['median']:>10} ({value['min']} .. {value['max']})")
        for run_ in result["runs"][name]:
            lines.append(f"  leaders: {run_['leaders']}")
    for probe in result["requeue_order"]:
        lines.append(f"== requeue order: {json.dumps(probe)}")
    for spread in result["leader_spread"]:
        lines.append(f"== leaders, {spread['locator']}: {json.dumps(spread)}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--bands", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--prefetch", type=int, default=100, help="per queue (per consumer)")
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--work-ms", type=float, default=20.0, help="each job's time (HOL)")
    parser.add_argument("--concurrency", type=int, default=10, help="job slots (HOL)")
    parser.add_argument("--hold-bound", type=int, default=10, help="per tenant (HOL requeue)")
    parser.add_argument("--hol-variants", default="fifo,requeue")
    parser.add_argument("--hol-timeout", type=float, default=180.0)
    parser.add_argument("--leader-tenants", type=int, default=0)
    parser.add_argument(
        "--probe-burst",
        type=int,
        default=2000,
        help="the requeue-order probe's burst, on one queue with and without a delivery limit"
        " (0: skip it)",
    )
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5681/")
    parser.add_argument(
        "--nodes",
        default="cbc1@localhost,cbc2@localhost,cbc3@localhost",
        help="RabbitMQ node names (rabbitmqctl -n); the first is the one --amqp-url reaches",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    layouts = [name for name in args.layouts.split(",") if name]
    if unknown := set(layouts) - set(LAYOUTS):
        parser.error(f"unknown layouts {sorted(unknown)}; choose from {LAYOUTS}")
    if "5672" in args.amqp_url:
        parser.error("never declare quorum queues on the machine's shared node (5672)")

    def make_config(_workdir: Path) -> Config:
        return Config(
            amqp_url=args.amqp_url,
            nodes=tuple(args.nodes.split(",")),
            tenants=args.tenants,
            bands=args.bands,
            layouts=layouts,
            messages=args.messages,
            idle=args.idle,
            repeat=args.repeat,
            prefetch=args.prefetch,
            burst=args.burst,
            work_ms=args.work_ms,
            concurrency=args.concurrency,
            hold_bound=args.hold_bound,
            hol_variants=[v for v in args.hol_variants.split(",") if v],
            hol_timeout=args.hol_timeout,
            leader_tenants=args.leader_tenants,
            probe_burst=args.probe_burst,
        )

    return run_main(
        make_config,
        run,
        render,
        json_output=args.json,
        workdir_prefix="coldbrew-quorum-layout-",
    )


if __name__ == "__main__":
    raise SystemExit(main())
