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

import pytest

from coldbrew.migrate import migrate
from tests.cluster.scenario import Cluster, cleanup_cluster_namespace
from tests.faults.harness import prepare_tables
from tests.helpers import new_namespace

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    running = Cluster(SCRIPT)
    was_up = running.directory_exists()
    try:
        running.up()
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"scripts/cluster up failed ({exc.returncode}): {exc.stderr[-2000:]}")
    try:
        yield running
    finally:
        if not was_up:
            running.ctl("down")


@pytest.fixture
async def cluster_namespace(cluster: Cluster) -> AsyncIterator[str]:
    """A namespace migrated on the cluster's primary, with the fault scenarios' side tables."""
    await asyncio.to_thread(cluster.up)  # heal what the last test broke
    name = new_namespace()
    await migrate(cluster.database_url, name)
    await prepare_tables(name, cluster.database_url)
    yield name
    await cleanup_cluster_namespace(cluster, name)
