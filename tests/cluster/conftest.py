"""The cluster the node-killing tests run on: ``scripts/cluster up`` once per session.

The fixture starts the three RabbitMQ nodes and the PostgreSQL pair when they are
not up yet and stops them at the end of the session; a cluster a developer started
(``make cluster-up``) before the run is left running. Each test gets a namespace of
its own on the cluster (its schema and its queues are removed afterwards), and
starts from a healed cluster: ``up`` restarts a killed node, starts a stopped app
and turns a failed-over primary into the new primary's standby.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from coldbrew.migrate import migrate, quote_ident
from tests.cluster.scenario import Cluster, cleanup_cluster_namespace
from tests.faults.harness import prepare_tables
from tests.helpers import new_namespace

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster"


def _session_cluster(verb: str) -> Iterator[Cluster]:
    """Bring the cluster (or the part ``verb`` heals) up for the session; a cluster this
    session created is stopped at its end."""
    running = Cluster(SCRIPT)
    was_up = running.directory_exists()
    try:
        if verb == "pg-up":
            running.up_pg()
        else:
            running.up()
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"scripts/cluster {verb} failed ({exc.returncode}): {exc.stderr[-2000:]}")
    try:
        yield running
    finally:
        if not was_up:
            running.ctl("down")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    yield from _session_cluster("up")


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """The cluster's PostgreSQL pair only, for the tests that need no broker: ``pg-up``
    does not wait for the RabbitMQ nodes, whose ``rabbitmqctl`` calls time out on a
    loaded machine. A pair this fixture created is stopped at the end of the session."""
    yield from _session_cluster("pg-up")


@pytest.fixture
async def pg_namespace(pg_cluster: Cluster) -> AsyncIterator[str]:
    """A namespace migrated on the pair's primary, the pair healed first (its standby
    synchronous); its schema is dropped afterwards."""
    await asyncio.to_thread(pg_cluster.up_pg)  # heal what the last test broke
    name = new_namespace()
    await migrate(pg_cluster.database_url, name)
    yield name
    conn = await asyncpg.connect(pg_cluster.database_url)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(name)} CASCADE")
    finally:
        await conn.close()


@pytest.fixture
async def cluster_namespace(cluster: Cluster) -> AsyncIterator[str]:
    """A namespace migrated on the cluster's primary, with the fault scenarios' side tables."""
    await asyncio.to_thread(cluster.up)  # heal what the last test broke
    name = new_namespace()
    await migrate(cluster.database_url, name)
    await prepare_tables(name, cluster.database_url)
    yield name
    await cleanup_cluster_namespace(cluster, name)
