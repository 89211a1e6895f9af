"""Fixtures on the real RabbitMQ and PostgreSQL: a fresh namespace per test, cleaned up after."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aio_pika
import pytest

from coldbrew import logs
from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.migrate import connect_creating_database, migrate
from coldbrew.settings import Settings
from coldbrew.worker import Worker
from tests.helpers import (
    AMQP_URL,
    DATABASE_URL,
    RUN_ID,
    WorkerFactory,
    cleanup_namespace,
    make_settings,
    new_namespace,
)

PHASES = ("all", "parallel", "exclusive")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=PHASES,
        default="all",
        help="which tests to run: all (default), parallel (those not marked exclusive, for"
        " pytest-xdist's -n) or exclusive (those marked exclusive, to run on their own);"
        " `make test` runs the two phases one after the other",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Refuse ``-n`` over the exclusive tests: they restart the machine's services or
    measure timings, and other tests running beside them would fail or make them fail."""
    workers = config.getoption("numprocesses", default=None)
    if workers and config.getoption("--phase") != "parallel":
        raise pytest.UsageError(
            "pytest -n runs tests side by side; tests marked exclusive must not be among"
            " them: add --phase=parallel (and run --phase=exclusive without -n), or use"
            " `make test`, which runs both phases"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--phase: keep only the parallel-safe tests, or only the exclusive ones."""
    phase = config.getoption("--phase")
    if phase == "all":
        return
    want_exclusive = phase == "exclusive"
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        is_exclusive = item.get_closest_marker("exclusive") is not None
        (kept if is_exclusive == want_exclusive else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


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
