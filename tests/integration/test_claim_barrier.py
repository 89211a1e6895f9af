"""The durability barrier of COLDBREW_CLAIM_COMMIT=async really flushes the WAL.

ClaimAcks acks a delivery at the barrier ("barrier") on the word of
``ClaimStore.durability_barrier``: every asynchronous claim committed before it
is on disk (and, with a synchronous standby, on the standby). PostgreSQL flushes
the WAL at a synchronous commit, and waits for a synchronous standby, only when
the transaction wrote WAL of its own before its commit record (xact.c,
RecordTransactionCommit: ``wrote_xlog``); an xid alone (``txid_current()``) is
not enough. Such a barrier returned before the claims were durable, and a
failover (tests/cluster, the PostgreSQL scenario) lost a pool job's claim whose
delivery had been acked: the row went back to ``queued`` with no message, until
the reconciler republished it 30 s later.

Checked on the machine's PostgreSQL, without a standby: after the barrier, the
WAL must be flushed past the claim's commit record. A standby receives only
flushed WAL, so a barrier that does not flush cannot have waited for it either.
"""

from __future__ import annotations

import uuid

import asyncpg

from coldbrew.settings import Settings
from coldbrew.store import ClaimRequest, JobStore
from tests.helpers import DATABASE_URL

ROUNDS = 10


async def test_the_barrier_flushes_the_wal_past_an_async_claim(settings: Settings) -> None:
    probe = await asyncpg.connect(DATABASE_URL)
    try:
        async with JobStore.open(DATABASE_URL, settings.namespace, pool_size=2) as store:
            store.configure_claims(lease_seconds=30, worker_id="barrier-test", commit="async")
            unflushed = []
            for index in range(ROUNDS):
                request = ClaimRequest(
                    uuid.uuid4().hex, "echo", "default", "acme", {}, 0, 3, None, None
                )
                claim = await store.claims.claim(request)
                assert claim.claimed and claim.mark is not None, claim
                # the claim's commit record is in the WAL, maybe not yet on disk
                written = await probe.fetchval("SELECT pg_current_wal_insert_lsn()")
                await store.claims.durability_barrier()
                flushed = await probe.fetchval(
                    "SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn", written
                )
                if not flushed:
                    unflushed.append(index)
            assert not unflushed, f"the barrier left the claim unflushed in rounds {unflushed}"
    finally:
        await probe.close()
