"""A claim that committed but whose answer was lost (the connection died right after the
commit, as with a primary killed mid-batch): the worker's retry finds the row ``running``
under its own id and must run the job, not ack the delivery as a duplicate and leave the
row to a lease nobody renews (then the reaper's hold after a failover: tens of seconds)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from coldbrew.client import Client
from coldbrew.errors import DatabaseUnavailable
from coldbrew.store import ClaimRequest, ClaimResult, ClaimStore
from tests.helpers import WorkerFactory


@pytest.mark.parametrize("claim_commit", ["async", "sync"])
async def test_a_claim_whose_answer_was_lost_still_runs_its_job(
    start_worker: WorkerFactory,
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
    claim_commit: str,
) -> None:
    original = ClaimStore._claim_batch
    lost: list[str] = []

    async def commit_then_lose_the_answer(
        self: ClaimStore, requests: Sequence[ClaimRequest]
    ) -> list[ClaimResult]:
        results = await original(self, requests)
        if not lost and any(result.claimed for result in results):
            lost.extend(result.id for result in results if result.claimed)
            raise DatabaseUnavailable("connection lost after the claim committed (simulated)")
        return results

    monkeypatch.setattr(ClaimStore, "_claim_batch", commit_then_lose_the_answer)
    # a lease far longer than the wait below: only running the job now can pass
    await start_worker(claim_commit=claim_commit, lease_seconds=120.0)
    job = await client.submit("echo", {"value": 1})
    done = await client.wait(job.id, timeout=15)
    assert lost == [job.id]
    assert done.status == "succeeded", done
    assert done.attempt == 1, done
