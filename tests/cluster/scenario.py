"""A worker fleet spread over the cluster's nodes, and the figures a node fault leaves behind.

The fleet is tests/faults' (three ``coldbrew worker`` processes running
tests/faults/apps.py, whose jobs record each attempt's start and their side
effect in PostgreSQL); here worker *i* connects first to broker node *i*.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from coldbrew.client import Client
from coldbrew.errors import ConfigurationError
from coldbrew.migrate import quote_ident
from coldbrew.settings import Settings, load_settings
from coldbrew.topology import Topology
from tests.faults.harness import Fleet, WorkerProcess


@dataclass
class Cluster:
    """``scripts/cluster``: its URLs, and the verbs the scenarios call."""

    script: Path
    amqp_urls: list[str] = field(default_factory=list)  # one per node, node 1 first
    database_url: str = ""  # both servers, target_session_attrs=read-write
    directory: Path | None = None

    def ctl(self, *args: str, timeout: float = 180.0) -> str:
        done = subprocess.run(  # noqa: S603 - our own script
            [str(self.script), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        return done.stdout

    def up(self) -> None:
        env = dict(line.split("=", 1) for line in self.ctl("up").splitlines() if "=" in line)
        self.amqp_urls = env["COLDBREW_AMQP_URL"].split(",")
        self.database_url = env["COLDBREW_DATABASE_URL"]
        self.directory = Path(env["COLDBREW_CLUSTER_DIR"])

    def up_pg(self) -> None:
        """``pg-up``: heal the PostgreSQL pair only (standby synchronous again); the
        RabbitMQ nodes are neither started nor waited for."""
        env = dict(line.split("=", 1) for line in self.ctl("pg-up").splitlines() if "=" in line)
        self.database_url = env["COLDBREW_DATABASE_URL"]
        self.directory = Path(env["COLDBREW_CLUSTER_DIR"])

    def directory_exists(self) -> bool:
        env = dict(line.split("=", 1) for line in self.ctl("env").splitlines() if "=" in line)
        return Path(env["COLDBREW_CLUSTER_DIR"]).exists()

    def queues(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's queues: name, type, messages, node (home or leader, 1..3)."""
        rows: list[dict[str, Any]] = json.loads(self.ctl("queues"))
        return [row for row in rows if str(row["name"]).startswith(f"{namespace}.")]

    def busiest_nodes(self, namespace: str) -> list[int]:
        """Nodes by the ready messages of the queues they lead (or host), busiest first."""
        load = {1: 0, 2: 0, 3: 0}
        count = {1: 0, 2: 0, 3: 0}
        for row in self.queues(namespace):
            load[row["node"]] += int(row.get("messages") or 0)
            count[row["node"]] += 1
        return sorted(load, key=lambda n: (load[n], count[n]), reverse=True)


def quorum_available() -> bool:
    """COLDBREW_QUEUE_TYPE exists (h/quorum): the scenarios' quorum mode can run."""
    return "queue_type" in Settings.model_fields


def amqp_list_available() -> bool:
    """COLDBREW_AMQP_URL takes several URLs (h/failover): a worker can fail over to a
    surviving node. Told by the setting's validation, the one place the list is defined."""
    try:
        settings = load_settings(
            amqp_url="amqp://guest:guest@127.0.0.1:5681/,amqp://guest:guest@127.0.0.1:5682/"
        )
    except ConfigurationError:
        return False
    # an old validator checks only the scheme: the list must also come out as a list
    return "5682" in settings.amqp_url and settings.amqp_url.count("amqp://") == 2


async def submit_concurrently(
    client: Client, count: int, rng: random.Random, in_flight: int = 64
) -> list[str]:
    """tests/faults' load (nine 0.1-5 s coroutine jobs to each 0.1-1.5 s pool job, seven
    tenants), submitted ``in_flight`` at a time: one by one, 500 submissions to a cluster
    take longer than the fleet takes to run them, and no backlog would be left to harm."""
    gate = asyncio.Semaphore(in_flight)
    plan = [
        ("crunch", {"seconds": round(rng.uniform(0.1, 1.5), 2)}, "default")
        if index % 10 == 9
        else ("work", {"seconds": round(rng.uniform(0.1, 5.0), 2)}, f"t{index % 7}")
        for index in range(count)
    ]

    async def one(job_type: str, args: dict[str, Any], tenant: str) -> str:
        async with gate:
            return (await client.submit(job_type, args, tenant=tenant)).id

    return list(await asyncio.gather(*(one(*entry) for entry in plan)))


@dataclass
class ClusterFleet(Fleet):
    """Worker *i* connects to node *i* first: only that node, or (with the URL list) that
    node then the others in order."""

    amqp_urls: list[str] = field(default_factory=list)
    fail_over: bool = False
    node_of: dict[int, int] = field(default_factory=dict)  # worker pid -> its first node
    started: int = 0

    def env(self, port: int) -> dict[str, str]:
        env = super().env(port)
        first = self.started % len(self.amqp_urls)
        if self.fail_over:
            # the whole list; a process starts at the URL its worker id hashes to
            # (transport/connection.py start_index), so pick an id that hashes to node i
            env["COLDBREW_AMQP_URL"] = ",".join(self.amqp_urls)
            env["COLDBREW_WORKER_ID"] = worker_id_for(first, len(self.amqp_urls), self.started)
        else:
            env["COLDBREW_AMQP_URL"] = self.amqp_urls[first]
        return env

    def start_one(self) -> WorkerProcess:
        worker = super().start_one()
        self.node_of[worker.pid] = self.started % len(self.amqp_urls) + 1
        self.started += 1
        return worker


def worker_id_for(index: int, count: int, serial: int) -> str:
    """A worker id whose CRC-32 picks broker URL ``index`` of ``count`` first, as
    COLDBREW_AMQP_URL's list does (transport/connection.py ``start_index``)."""
    for salt in range(10_000):
        candidate = f"cluster-w{serial}-{salt}"
        if zlib.crc32(candidate.encode()) % count == index:
            return candidate
    raise AssertionError("no worker id hashes to that node")  # 1 in 3 does: unreachable


_SAMPLE = re.compile(
    r"^(coldbrew_(?:redeliveries|duplicate_deliveries|reconcile_republished)_total)"
    r"\{?[^}]*\}? (\S+)$"
)


def delivery_counts(fleet: Fleet) -> dict[str, float]:
    """Redeliveries, duplicate deliveries and reconciler republications (jobs whose message
    was gone from the broker) the live workers counted (their /metrics)."""
    totals: dict[str, float] = {}
    for worker in fleet.workers:
        if worker.process.poll() is not None:
            continue
        try:
            with urllib.request.urlopen(  # noqa: S310 - our own worker
                f"http://127.0.0.1:{worker.port}/metrics", timeout=5
            ) as response:
                text = response.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match:
                name = match.group(1).removeprefix("coldbrew_").removesuffix("_total")
                totals[name] = totals.get(name, 0.0) + float(match.group(2))
    return totals


async def lane_recoveries(
    database_url: str, namespace: str, ids: list[str], fault_at: float
) -> dict[str, float]:
    """For each lane (queue.tenant) with jobs of ``ids`` that started after ``fault_at``, the
    longest time it went without starting one, from the fault on: how long the fault held
    the lane up. A lane whose queue lived on a dead node stops once the deliveries its
    workers held have run, and starts again when its queue is back (a new quorum leader, or
    the node's restart); a lane the fault missed starts a job every second or so. Waiting
    for a free worker slot counts too, so this is an upper bound."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    try:
        # jobs.started_at: the start of the attempt that finished the job, for pool jobs too
        # (fault_attempts has the coroutine jobs' attempts only)
        rows = await conn.fetch(
            "SELECT queue || '.' || tenant AS lane, extract(epoch FROM started_at) AS t"
            " FROM jobs WHERE id = ANY($2) AND started_at > to_timestamp($1) ORDER BY 1, 2",
            fault_at,
            ids,
        )
    finally:
        await conn.close()
    gaps: dict[str, float] = {}
    last: dict[str, float] = {}
    for row in rows:
        lane, started = row["lane"], float(row["t"])
        gap = started - last.get(lane, fault_at)
        gaps[lane] = round(max(gaps.get(lane, 0.0), gap), 2)
        last[lane] = started
    return gaps


async def stall_history(
    database_url: str, namespace: str, ids: list[str], fault_at: float, bound: float
) -> list[dict[str, Any]]:
    """For a lane held up longer than ``bound``: the job that ended the gap (the first
    to start after it), its row and its attempts (the job_attempts trigger table), so a
    failed run says what the stalled job went through."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    try:
        rows = await conn.fetch(
            "SELECT id, queue || '.' || tenant AS lane, extract(epoch FROM started_at) AS t"
            " FROM jobs WHERE id = ANY($2) AND started_at > to_timestamp($1) ORDER BY 2, 3",
            fault_at,
            ids,
        )
        last: dict[str, float] = {}
        stalled: list[str] = []
        for row in rows:
            if float(row["t"]) - last.get(row["lane"], fault_at) > bound:
                stalled.append(row["id"])
            last[row["lane"]] = float(row["t"])
        history = []
        for job_id in stalled:
            job = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
            attempts = await conn.fetch(
                "SELECT * FROM job_attempts WHERE job_id = $1 ORDER BY ended_at", job_id
            )
            history.append(
                {
                    "job": {k: str(v) for k, v in dict(job or {}).items()},
                    "attempts": [{k: str(v) for k, v in dict(a).items()} for a in attempts],
                }
            )
        return history
    finally:
        await conn.close()


async def cleanup_cluster_namespace(cluster: Cluster, namespace: str) -> None:
    """Drop the namespace's schema (on the primary) and its queues and exchanges."""
    conn = await asyncpg.connect(cluster.database_url)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(namespace)} CASCADE")
    finally:
        await conn.close()
    names = [row["name"] for row in await asyncio.to_thread(cluster.queues, namespace)]
    topo = Topology(namespace)
    for url in cluster.amqp_urls:
        try:
            connection = await aio_pika.connect(url, timeout=5)
        except (OSError, aio_pika.exceptions.AMQPError):
            continue  # a node that is down: another one deletes them
        try:
            channel = await connection.channel()
            for name in names:
                await channel.queue_delete(name)
            for name in (topo.jobs_exchange, topo.unrouted_exchange, topo.dead_exchange):
                await channel.exchange_delete(name)
        finally:
            await connection.close()
        return
