"""A claim acked at the durability barrier survives a failover (COLDBREW_CLAIM_COMMIT=async).

``ClaimAcks`` acks a delivery once ``durability_barrier`` returned after its claim:
from then on the row, not the message, must carry the job. The barrier used to be
``SELECT txid_current()``, which writes no WAL before its commit record, so
PostgreSQL committed it without flushing and without waiting for the
synchronous standby: a claim acked that way, made in the last ~200 ms before the
primary was killed, was missing on the promoted standby. In the PostgreSQL
scenario of test_node_faults.py that left a pool job ``queued`` with no message
for 32 s, until the reconciler republished it.

Here one store claims a new job after another, each followed by a barrier, while
the primary is killed; every claim whose barrier returned must be on the
promoted standby.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from coldbrew.errors import DatabaseUnavailable
from coldbrew.store import ClaimRequest, JobStore
from tests.cluster.scenario import Cluster

# exclusive: kills the cluster's PostgreSQL primary
pytestmark = [pytest.mark.slow, pytest.mark.exclusive, pytest.mark.timeout(180)]


async def claim_and_barrier(store: JobStore, acked: list[str]) -> None:
    """Claim new jobs one by one, each made durable by a barrier, until PostgreSQL is gone."""
    while True:
        request = ClaimRequest(uuid.uuid4().hex, "echo", "default", "acme", {}, 0, 3, None, None)
        try:
            claim = await store.claims.claim(request)
            assert claim.claimed and claim.mark is not None, claim
            await store.claims.durability_barrier()
        except DatabaseUnavailable:
            return
        acked.append(request.id)  # what ClaimAcks would ack now ("barrier")


async def test_claims_acked_at_the_barrier_survive_the_promotion(
    cluster: Cluster, cluster_namespace: str
) -> None:
    acked: list[str] = []
    async with JobStore.open(cluster.database_url, cluster_namespace, pool_size=2) as store:
        store.configure_claims(lease_seconds=120, worker_id="barrier-failover", commit="async")
        claiming = asyncio.create_task(claim_and_barrier(store, acked))
        await asyncio.sleep(2.0)
        await asyncio.to_thread(cluster.ctl, "kill-pg", "primary")
        async with asyncio.timeout(30):
            await claiming
    await asyncio.to_thread(cluster.ctl, "promote")
    conn = await asyncpg.connect(
        cluster.database_url, server_settings={"search_path": cluster_namespace}
    )
    try:
        found = {
            row["id"]
            for row in await conn.fetch(
                "SELECT id FROM jobs WHERE id = ANY($1) AND status = 'running' AND attempt = 1",
                acked,
            )
        }
    finally:
        await conn.close()
    lost = [job_id for job_id in acked if job_id not in found]
    assert len(acked) > 100, f"only {len(acked)} claims before the kill"
    assert not lost, (
        f"{len(lost)} of {len(acked)} claims acked at the barrier were lost in the failover"
        f" (the last acked: {acked[-3:]}, lost: {lost[-3:]})"
    )
