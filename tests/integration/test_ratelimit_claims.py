"""The single-limit claim itself (``rates.claim_one_token``) against PostgreSQL: the
lock-free peek of a contested bucket, the tokens a claim reports left, and a refusal
that is not recorded twice.

The peek exists because refusals cost the other tenants job slots: in
bench/ratelimit.py four in five limited claims were refused, each a claim rolled back
in a slot. A refusal by peek must leave the bucket and the job untouched.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest

from coldbrew.client import Client
from coldbrew.errors import JobNotFound
from coldbrew.ratelimit import Rate
from coldbrew.rates import Bucket, RateLimited, claim_one_token
from coldbrew.settings import Settings
from coldbrew.store import ClaimRequest, ClaimResult
from tests.helpers import DATABASE_URL


def request(tenant: str = "t", job_id: str | None = None) -> ClaimRequest:
    return ClaimRequest(job_id or uuid.uuid4().hex, "echo", "default", tenant, {}, 0, 3, None, None)


async def bucket_tat(namespace: str, key: str) -> object:
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        query = f'SELECT tat FROM "{namespace}".rate_buckets WHERE key = $1'
        return await conn.fetchval(query, key)
    finally:
        await conn.close()


async def test_a_peek_refuses_without_claiming_and_records_the_job_once(
    client: Client, settings: Settings
) -> None:
    caps = client.store.caps
    bucket = Bucket("tenant", "tenant:t", Rate(1, 1))  # one token a second
    first = await claim_one_token(caps, request(), bucket, peek=True)  # no bucket yet: claims
    assert isinstance(first, ClaimResult) and first.claimed
    assert first.rate_spare == {bucket.key: 0}
    assert first.rate_waits is not None and 0.9 < first.rate_waits[bucket.key] <= 1.0
    tat = await bucket_tat(settings.namespace, bucket.key)

    waiting = request()
    refused = await claim_one_token(caps, waiting, bucket, peek=True)
    assert isinstance(refused, RateLimited) and refused.key == bucket.key
    assert 0.5 < refused.wait <= 1.0
    assert (await client.store.jobs.get_job(waiting.id)).status == "queued"  # recorded

    unrecorded = request()  # recorded=True: an earlier refusal recorded it; nothing is sent
    again = await claim_one_token(caps, unrecorded, bucket, peek=True, recorded=True)
    assert isinstance(again, RateLimited)
    with pytest.raises(JobNotFound):
        await client.store.jobs.get_job(unrecorded.id)
    assert await bucket_tat(settings.namespace, bucket.key) == tat  # refusals take nothing


async def test_a_peek_refusal_of_a_duplicate_answers_its_row(client: Client) -> None:
    """A delivery of a job running elsewhere, refused by the peek: its row's answer (acked
    as a duplicate by the runner), not a wait."""
    caps = client.store.caps
    bucket = Bucket("tenant", "tenant:t", Rate(1, 1))
    running = request()
    claimed = await claim_one_token(caps, running, bucket)
    assert isinstance(claimed, ClaimResult) and claimed.claimed
    duplicate = await claim_one_token(caps, request(job_id=running.id), bucket, peek=True)
    assert isinstance(duplicate, ClaimResult)
    assert not duplicate.claimed and duplicate.status == "running"


async def test_a_claim_reports_the_tokens_its_bucket_has_left(client: Client) -> None:
    caps = client.store.caps
    bucket = Bucket("tenant", "tenant:t", Rate(2, 3))  # T = 0.5 s, tau = 1 s
    spare = []
    for _ in range(3):
        result = await claim_one_token(caps, request(), bucket, peek=True)
        assert isinstance(result, ClaimResult) and result.claimed and result.rate_spare
        spare.append(result.rate_spare[bucket.key])
    assert spare == [2, 1, 0]
    refused = await claim_one_token(caps, request(), bucket, peek=True)
    assert isinstance(refused, RateLimited)  # the peek saw none left
    refused = await claim_one_token(caps, request(), bucket)  # and so does the locked take
    assert isinstance(refused, RateLimited)


async def test_a_peek_refusal_does_not_wait_for_the_bucket_lock(
    client: Client, settings: Settings
) -> None:
    """Another worker's claim holds the bucket's row lock (from its token upsert to its
    commit): the locked take would wait for it, the peek reads past it and refuses."""
    caps = client.store.caps
    bucket = Bucket("tenant", "tenant:t", Rate(1, 1))
    assert isinstance(await claim_one_token(caps, request(), bucket), ClaimResult)
    holder = await asyncpg.connect(DATABASE_URL)
    try:
        await holder.execute("BEGIN")
        await holder.execute(
            f'SELECT 1 FROM "{settings.namespace}".rate_buckets WHERE key = $1 FOR UPDATE',
            bucket.key,
        )
        began = time.perf_counter()
        refused = await asyncio.wait_for(
            claim_one_token(caps, request(), bucket, peek=True, recorded=True), timeout=5
        )
        assert isinstance(refused, RateLimited)
        assert time.perf_counter() - began < 1.0
    finally:
        await holder.close()


async def test_a_contested_claim_refuses_while_another_claim_takes_the_token(
    client: Client, settings: Settings
) -> None:
    """A token is due but another worker's claim holds the bucket's row (it is taking that
    token): the contested claim takes the token first with SKIP LOCKED, so it refuses at
    once, told to come back an interval later, instead of waiting in its job slot."""
    caps = client.store.caps
    bucket = Bucket("tenant", "tenant:t", Rate(1, 1))
    holder = await asyncpg.connect(DATABASE_URL)
    try:
        table = f'"{settings.namespace}".rate_buckets'
        await holder.execute(f"INSERT INTO {table} (key, tat) VALUES ($1, now())", bucket.key)
        await holder.execute("BEGIN")
        await holder.execute(f"SELECT 1 FROM {table} WHERE key = $1 FOR UPDATE", bucket.key)
        waiting = request()
        began = time.perf_counter()
        refused = await asyncio.wait_for(
            claim_one_token(caps, waiting, bucket, peek=True), timeout=5
        )
        assert time.perf_counter() - began < 1.0
        assert isinstance(refused, RateLimited) and 0.5 < refused.wait <= 1.0
        assert (await client.store.jobs.get_job(waiting.id)).status == "queued"
    finally:
        await holder.close()
    claimed = await claim_one_token(caps, waiting, bucket, peek=True, recorded=True)
    assert isinstance(claimed, ClaimResult) and claimed.claimed  # the lock gone: the token


async def test_a_contested_duplicate_gives_its_token_back(
    client: Client, settings: Settings
) -> None:
    """The contested claim takes the token before it claims: a duplicate delivery (its job
    runs elsewhere) rolls the token back, as the claim-first order never took it."""
    caps = client.store.caps
    bucket = Bucket("tenant", "tenant:t", Rate(100, 1))
    running = request()
    assert isinstance(await claim_one_token(caps, running, bucket), ClaimResult)
    await asyncio.sleep(0.05)  # the next token is due
    tat = await bucket_tat(settings.namespace, bucket.key)
    duplicate = await claim_one_token(caps, request(job_id=running.id), bucket, peek=True)
    assert isinstance(duplicate, ClaimResult)
    assert not duplicate.claimed and duplicate.status == "running"
    assert await bucket_tat(settings.namespace, bucket.key) == tat
    other = await claim_one_token(caps, request(), bucket, peek=True)
    assert isinstance(other, ClaimResult) and other.claimed  # the token was still there
