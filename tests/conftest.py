"""Fixtures on the real RabbitMQ and PostgreSQL: a fresh namespace per test, cleaned up after."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aio_pika
import asyncpg
import pytest

from coldbrew import logs
from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.migrate import connect_creating_database, migrate, quote_ident
from coldbrew.settings import Settings, load_settings
from coldbrew.topology import Topology
from coldbrew.worker import Worker

AMQP_URL = os.environ.get("COLDBREW_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
DATABASE_URL = os.environ.get(
    "COLDBREW_TEST_DATABASE_URL", "postgresql://127.0.0.1:5432/coldbrew_test"
)
RUN_ID = secrets.token_hex(3)
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
        names = [topo.unrouted_queue, topo.dead_queue] + [topo.job_queue(q, t) for q, t in pairs]
        for name in names:
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


@pytest.fixture(scope="session", autouse=True)
def _configure_logging() -> None:
    logs.configure("json", os.environ.get("COLDBREW_TEST_LOG_LEVEL", "warning"))  # type: ignore[arg-type]


@pytest.fixture(scope="session", autouse=True)
def _sweep_leftover_queues() -> Iterator[None]:
    """At the end of a run, delete any queue this run left (a crashed test's)."""
    yield
    try:
        out = subprocess.run(
            ["rabbitmqctl", "-q", "list_queues", "name"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return
    leftovers = [line.strip() for line in out.splitlines() if line.startswith(f"cbt_{RUN_ID}_")]
    if leftovers:

        async def sweep() -> None:
            connection = await aio_pika.connect(AMQP_URL)
            channel = await connection.channel()
            for name in leftovers:
                await channel.queue_delete(name)
            await connection.close()

        asyncio.run(sweep())


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = new_namespace()
    yield name
    await cleanup_namespace(name)


@pytest.fixture
async def settings(namespace: str) -> Settings:
    conn = await connect_creating_database(DATABASE_URL)
    await conn.close()
    await migrate(DATABASE_URL, namespace)
    return make_settings(namespace)


@pytest.fixture
def test_app() -> Any:
    return load_app("tests.apps:app")


WorkerFactory = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def start_worker(settings: Settings, test_app: Any) -> AsyncIterator[WorkerFactory]:
    """Start in-process workers (stopped, drained, at teardown)."""
    running: list[tuple[Worker, asyncio.Task[None]]] = []

    async def start(app: Any = None, **overrides: Any) -> Worker:
        # workers in one process need ids of their own (each holds its id's liveness lock)
        overrides.setdefault("worker_id", f"{settings.worker_id}-{len(running) + 1}")
        worker_settings = make_settings(settings.namespace, **overrides)
        worker = Worker(app or test_app, worker_settings)
        task = asyncio.create_task(worker.run())
        await worker.wait_ready(task)
        running.append((worker, task))
        return worker

    yield start
    for worker, _ in reversed(running):
        worker.stop()
    for _, task in reversed(running):
        await asyncio.wait_for(task, timeout=30)


@pytest.fixture
async def client(settings: Settings, test_app: Any) -> AsyncIterator[Client]:
    async with Client.connect(settings, app=test_app) as connected:
        yield connected


@pytest.fixture
async def amqp() -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """A plain aio-pika channel with confirms: a producer that uses no coldbrew code."""
    connection = await aio_pika.connect(AMQP_URL)
    channel = await connection.channel(publisher_confirms=True)
    yield channel
    await connection.close()


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
