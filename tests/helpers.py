"""Helpers for tests on the real RabbitMQ and PostgreSQL: settings, namespaces, waits.

Test modules import these from here (never from conftest.py, which only holds
fixtures): a helper is an ordinary function with a name to import, and a
fixture is what pytest injects.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import asyncpg

from coldbrew.client import Client
from coldbrew.errors import JobNotFound
from coldbrew.migrate import quote_ident
from coldbrew.settings import Settings, load_settings
from coldbrew.topology import Topology
from coldbrew.worker import Worker

AMQP_URL = os.environ.get("COLDBREW_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
DATABASE_URL = os.environ.get(
    "COLDBREW_TEST_DATABASE_URL", "postgresql://127.0.0.1:5432/coldbrew_test"
)
# One id per test process: with pytest-xdist every worker process imports this module
# itself, and its worker name ("gw3" -> "w3") keeps the workers' namespaces (and the
# queues the session sweep in conftest.py deletes by prefix) apart with certainty.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
RUN_ID = secrets.token_hex(3) + (f"w{_XDIST_WORKER.removeprefix('gw')}" if _XDIST_WORKER else "")
_counter = iter(range(1_000_000))


def new_namespace() -> str:
    return f"cbt_{RUN_ID}_{next(_counter)}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_settings(namespace: str, **overrides: Any) -> Settings:
    """Short leases and intervals so recovery paths run in seconds."""
    values: dict[str, Any] = {
        "amqp_url": AMQP_URL,
        "database_url": DATABASE_URL,
        "namespace": namespace,
        "metrics_port": 0,
        "metrics_host": "127.0.0.1",
        "lease_seconds": 4.0,
        "heartbeat_seconds": 1.0,
        "progress_flush_seconds": 0.2,
        "reaper_interval_seconds": 0.5,
        "relay_interval_seconds": 0.2,
        "relay_grace_seconds": 2.0,
        "retry_base_seconds": 0.05,
        "retry_max_seconds": 0.5,
        "shutdown_grace_seconds": 5.0,
        "tenant_resync_seconds": 2.0,
        "processes": 2,
        "concurrency": 50,
        # small pools: three or four test processes side by side, each starting workers of its own,
        # must stay under the shared server's max_connections (100)
        "db_pool_size": 5,
        "log_format": "json",
        "log_level": "warning",
    }
    values.update(overrides)
    return load_settings(**values)


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment for a `coldbrew` subprocess with the same settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLDBREW_")}
    for name, value in settings.model_dump().items():
        if name == "worker_id":
            continue
        env[f"COLDBREW_{name.upper()}"] = ",".join(value) if isinstance(value, list) else str(value)
    env.update(extra)
    return env


async def drop_broker_entities(namespace: str, pairs: list[tuple[str, str]]) -> None:
    topo = Topology(namespace)
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        for name in topo.every_queue_name(pairs):
            await channel.queue_delete(name)
        for name in (topo.jobs_exchange, topo.unrouted_exchange, topo.dead_exchange):
            await channel.exchange_delete(name)
    finally:
        await connection.close()


async def cleanup_namespace(namespace: str) -> None:
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        try:
            rows = await conn.fetch(
                f"SELECT queue, tenant FROM {quote_ident(namespace)}.tenant_queues"
            )
            pairs = [(r["queue"], r["tenant"]) for r in rows]
        except asyncpg.UndefinedTableError:
            pairs = []
        except asyncpg.InvalidSchemaNameError:
            pairs = []
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(namespace)} CASCADE")
    finally:
        await conn.close()
    await drop_broker_entities(namespace, pairs)


WorkerFactory = Callable[..., Awaitable[Worker]]


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float = 20.0, interval: float = 0.05
) -> None:
    """Poll ``predicate`` until true, failing after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


async def read_dead_letters(
    channel: aio_pika.abc.AbstractChannel, namespace: str, count: int, *, timeout: float = 20.0
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Take ``count`` messages off ``<ns>.dead`` (acking them), failing after ``timeout``."""
    queue = await channel.get_queue(Topology(namespace).dead_queue)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    taken: list[aio_pika.abc.AbstractIncomingMessage] = []
    while len(taken) < count:
        message = await queue.get(fail=False)
        if message is None:
            if loop.time() > deadline:
                raise AssertionError(f"{len(taken)} of {count} dead letters within {timeout} s")
            await asyncio.sleep(0.05)
            continue
        await message.ack()
        taken.append(message)
    return taken


def metric(worker: Any, metric_name: str, **labels: str) -> float:
    """A worker's metric sample (0 when it has none yet)."""
    value = worker.metrics.registry.get_sample_value(metric_name, labels or None)
    return 0.0 if value is None else value


async def publish_raw(
    channel: aio_pika.abc.AbstractChannel,
    namespace: str,
    body: bytes,
    routing_key: str,
    **properties: Any,
) -> None:
    """Publish ``body`` as a producer that uses no coldbrew code would."""
    exchange = await channel.get_exchange(f"{namespace}.jobs")
    properties.setdefault("delivery_mode", aio_pika.DeliveryMode.PERSISTENT)
    properties.setdefault("content_type", "application/json")
    await exchange.publish(aio_pika.Message(body, **properties), routing_key=routing_key)


async def status_is(client: Client, job_id: str, status: str) -> bool:
    """Whether the job's row exists and has ``status`` (a ``wait_until`` predicate)."""
    try:
        return (await client.get(job_id)).status == status
    except JobNotFound:  # not inserted yet
        return False


async def holds(value: bool) -> bool:
    """``value`` as a ``wait_until`` predicate: ``wait_until(lambda: holds(x > 1))``."""
    return value
