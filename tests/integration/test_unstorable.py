"""Data PostgreSQL cannot store, from producers and from jobs, on the real services.

Before: a message with ``"a\\u0000b"`` in its args made the worker exit (the
claim statement's error was its fatal error) and every restarted worker took
the redelivery and died again; a job's NUL result left its row ``running``
until the lease ran out; and either failed every other job in the same group
commit. Now each is one job's failure or one message's rejection, with a
reason, and the worker and the other jobs go on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg
import pytest

from coldbrew import model
from coldbrew.client import Client
from coldbrew.errors import DataRefused
from coldbrew.settings import Settings
from coldbrew.store import ClaimRequest, CommitMark, JobStore, Outcome, RawJSON
from coldbrew.worker import Worker
from tests.apps import MISBEHAVIOURS, POOL_MISBEHAVIOURS
from tests.helpers import DATABASE_URL, WorkerFactory, wait_until


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[JobStore]:
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as opened:
        opened.configure_claims(lease_seconds=30, worker_id="test")
        yield opened


async def query(namespace: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": namespace})
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


def claim_request(job_id: str, args: dict[str, Any]) -> ClaimRequest:
    return ClaimRequest(job_id, "echo", "default", "acme", args, 0, 3, None, None)


# --- group commit through the real store: one item's data fails only that item ------------


async def test_a_refused_claim_fails_alone_and_its_batch_mates_are_claimed(
    store: JobStore, settings: Settings
) -> None:
    """NUL in one claim's args (past the checks, as a bug would let it) fails that claim only."""
    bad = {2: {"t": "a\x00b"}, 5: {"t": "\ud800"}, 6: {"n": float("nan")}}
    requests = [claim_request(f"c-{i}", bad.get(i, {"value": i})) for i in range(8)]
    # queued together: one batch
    futures = [store.claims.claim_batches.enqueue(r) for r in requests]
    results = await asyncio.gather(*futures, return_exceptions=True)
    for index, result in enumerate(results):
        if index in bad:
            assert isinstance(result, DataRefused), result
            assert result.sqlstate is not None and result.sqlstate.startswith("22")
        else:
            assert not isinstance(result, BaseException) and result.claimed, result
    assert store.claims.claim_batches.isolated >= 1
    rows = await query(settings.namespace, "SELECT id, status FROM jobs ORDER BY id")
    assert [(r["id"], r["status"]) for r in rows] == [
        (f"c-{i}", "running") for i in range(8) if i not in bad
    ]


async def test_a_refused_outcome_fails_alone_and_its_batch_mates_are_written(
    store: JobStore, settings: Settings
) -> None:
    """A NUL result and a retry delay past what an interval holds, among good outcomes."""
    claims = [await store.claims.claim(claim_request(f"o-{i}", {"value": i})) for i in range(6)]
    outcomes = [
        Outcome(c.id, c.attempt, "succeeded", result=RawJSON(json.dumps({"i": i})))
        for i, c in enumerate(claims)
    ]
    outcomes[1] = Outcome(claims[1].id, 1, "succeeded", result=RawJSON('{"t": "\\u0000"}'))
    outcomes[4] = Outcome(claims[4].id, 1, "retrying", error_kind="x", delay=1e300)
    results = await asyncio.gather(
        *[store.claims.completion_batches.enqueue(o) for o in outcomes], return_exceptions=True
    )
    assert isinstance(results[1], DataRefused) and "22P05" in str(results[1])
    assert isinstance(results[4], DataRefused) and "out of range" in str(results[4])
    # written: each answers the mark of the commit that wrote it (None would be fenced)
    assert all(isinstance(results[i], CommitMark) for i in (0, 2, 3, 5)), results
    rows = await query(settings.namespace, "SELECT id, status FROM jobs ORDER BY id")
    assert [r["status"] for r in rows] == [
        "succeeded",
        "running",
        "succeeded",
        "succeeded",
        "running",
        "succeeded",
    ]


async def test_pooled_statements_translate_refused_data_too(store: JobStore) -> None:
    """Outside group commit (the pool's _run), the same DataRefused, not a driver error."""
    claim = await store.claims.claim(claim_request("cp-1", {}))
    with pytest.raises(DataRefused, match="22P05"):
        await store.jobs.save_checkpoint(claim.id, claim.attempt, {"s": "\x00"})
    with pytest.raises(DataRefused, match="surrogates not allowed"):
        await store.jobs.request_cancel("cp-1", "\ud800")


async def test_a_rejected_message_with_nul_everywhere_is_stored(
    store: JobStore, settings: Settings
) -> None:
    """The rejected table holds what the message was rejected for; storing it cannot fail."""
    await store.dead.insert_rejected(
        [
            (
                "invalid_message_id",
                "detail \x00 \ud800",
                "id\x00",
                "default.t\x00",
                {"x-k\x00": "v\x00", "f": float("nan"), "deep": {"b": "\udfff"}},
                b'{"type": "echo\x00"}',
            )
        ]
    )
    rows = await query(settings.namespace, "SELECT * FROM rejected_messages")
    assert len(rows) == 1
    row = rows[0]
    assert (row["message_id"], row["routing_key"]) == ("id\ufffd", "default.t\ufffd")
    assert json.loads(row["headers"]) == {
        "x-k\ufffd": "v\ufffd",
        "f": "nan",
        "deep": {"b": "\ufffd"},
    }
    assert bytes(row["body"]) == b'{"type": "echo\x00"}'  # bytea: the exact bytes


# --- a worker fed garbage from outside ----------------------------------------------------

GARBAGE: list[tuple[str, bytes, dict[str, Any], str]] = [
    # (message id, body, properties, reason)
    ("g-nul-args", b'{"type":"echo","args":{"value":"a\\u0000b"}}', {}, "unstorable"),
    ("g-nul-key", b'{"type":"echo","args":{"a\\u0000":1}}', {}, "unstorable"),
    ("g-surrogate", b'{"type":"echo","args":{"value":"\\udfff"}}', {}, "unstorable"),
    ("g-raw-surrogate", b'{"type":"echo","args":{"value":"\xed\xa0\x80"}}', {}, "unstorable"),
    ("g-inf", b'{"type":"echo","args":{"value":1e999}}', {}, "unstorable"),
    ("g-nan", b'{"type":"echo","args":{"value":NaN}}', {}, "not_json"),
    (
        "g-deep",
        b'{"type":"echo","args":{"value":' + b"[" * 5000 + b"]" * 5000 + b"}}",
        {},
        "unstorable",
    ),  # noqa: E501
    ("g-type-nul", b'{"type":"echo\\u0000","args":{}}', {}, "unknown_type"),
    (
        "g-key-header",
        b'{"type":"echo","args":{}}',
        {"headers": {"x-idempotency-key": "k\x00", "x-junk\x00": "\x00"}},
        "invalid_header",
    ),
    (
        "g-key-bytes",
        b'{"type":"echo","args":{}}',
        {"headers": {"x-idempotency-key": bytearray(b"\xff")}},
        "invalid_header",
    ),  # noqa: E501
    (
        "g-timeout",
        b'{"type":"echo","args":{}}',
        {"headers": {"x-timeout-seconds": 1e-300}},
        "invalid_header",
    ),  # noqa: E501
    ("g\x00id", b'{"type":"echo","args":{}}', {}, "invalid_message_id"),
]


# (RabbitMQ itself refuses a NaN float in a header table: it closes the publisher's
# connection with 541 INTERNAL_ERROR, so none reaches a worker.)


async def publish(channel: aio_pika.abc.AbstractChannel, namespace: str, messages: Any) -> None:
    exchange = await channel.get_exchange(f"{namespace}.jobs")
    for message_id, body, props, *_ in messages:
        key = props.pop("routing_key", "default.default")
        await exchange.publish(aio_pika.Message(body, message_id=message_id, **props), key)


async def test_garbage_from_producers_is_rejected_and_the_worker_goes_on(
    start_worker: WorkerFactory,
    client: Client,
    amqp: aio_pika.abc.AbstractChannel,
    settings: Settings,
) -> None:
    """Issue #13's messages, and their kin, each end in rejected_messages with a reason."""
    worker = await start_worker()
    await publish(amqp, settings.namespace, [(*g[:2], dict(g[2])) for g in GARBAGE])
    exchange = await amqp.get_exchange(f"{settings.namespace}.jobs")
    await exchange.publish(
        aio_pika.Message(b'{"type":"echo"}', message_id="g-routing"), routing_key="default.t\x00"
    )
    good = await client.submit("echo", {"value": "after the garbage"})
    assert (await client.wait(good.id, timeout=20)).status == "succeeded"

    async def all_rejected() -> bool:
        rows = await query(settings.namespace, "SELECT count(*) AS n FROM rejected_messages")
        return bool(rows[0]["n"] == len(GARBAGE) + 1)

    await wait_until(all_rejected, timeout=20)
    rows = await query(
        settings.namespace, "SELECT message_id, reason, detail, routing_key FROM rejected_messages"
    )
    by_id = {row["message_id"]: row for row in rows}
    for message_id, _, _, reason in GARBAGE:
        row = by_id[message_id.replace("\x00", "\ufffd")]
        assert row["reason"] == reason, (message_id, row["detail"])
        assert row["detail"]
    assert by_id["g-nul-args"]["detail"] == (
        "args.value contains NUL (U+0000), which PostgreSQL text and jsonb cannot hold"
    )
    assert by_id["g-routing"]["routing_key"] == "default.t\ufffd"
    assert by_id["g-routing"]["reason"] == "invalid_tenant"
    assert worker.lifecycle.health() == (True, "ok")
    jobs = await query(settings.namespace, "SELECT id FROM jobs")
    assert [row["id"] for row in jobs] == [good.id]  # nothing of the garbage became a job


async def test_a_claim_postgresql_refuses_is_dead_lettered_not_fatal(
    start_worker: WorkerFactory,
    client: Client,
    amqp: aio_pika.abc.AbstractChannel,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the args check disabled (standing for a gap in it), PostgreSQL's own refusal at
    claim is the message's rejection, and the claims batched with it go through."""
    monkeypatch.setattr(model, "check_args", lambda args: None)
    worker = await start_worker()
    bad = [(f"bad-{i}", b'{"type":"echo","args":{"value":"\\u0000"}}', {}) for i in range(3)]
    good = [(f"good-{i}", b'{"type":"echo","args":{"value":1}}', {}) for i in range(20)]
    messages = []
    for index, message in enumerate(good):  # the bad ones among the good: shared batches
        messages.append(message)
        if index % 7 == 3:
            messages.append(bad[index // 7])
    await publish(amqp, settings.namespace, messages)

    async def settled() -> bool:
        rows = await query(
            settings.namespace,
            "SELECT (SELECT count(*) FROM jobs WHERE status = 'succeeded')"
            " + (SELECT count(*) FROM rejected_messages) AS n",
        )
        return bool(rows[0]["n"] == 23)

    await wait_until(settled, timeout=30)
    rejected = await query(
        settings.namespace, "SELECT message_id, reason, detail FROM rejected_messages"
    )
    assert sorted(r["message_id"] for r in rejected) == ["bad-0", "bad-1", "bad-2"]
    assert {r["reason"] for r in rejected} == {"unstorable"}
    assert all("PostgreSQL refused the job at claim" in r["detail"] for r in rejected)
    assert all("22P05" in r["detail"] for r in rejected)
    assert worker.lifecycle.health() == (True, "ok")


# --- a worker whose jobs produce what PostgreSQL cannot store ----------------------------


async def finals(namespace: str, ids: list[str]) -> dict[str, asyncpg.Record]:
    rows = await query(
        namespace,
        "SELECT id, status, error_kind, error_message, progress_message, result"
        " FROM jobs WHERE id = ANY($1)",
        ids,
    )
    return {row["id"]: row for row in rows}


async def test_unstorable_job_output_fails_that_job_with_a_clear_kind(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """Each misbehaviour ends as its expected status and error kind, at once (no lease
    expiry), with good jobs interleaved; the worker never stops."""
    worker: Worker = await start_worker()
    jobs: dict[str, tuple[str, str]] = {}
    for round_ in range(2):
        for kind in MISBEHAVIOURS:
            record = await client.submit("misbehave", {"kind": kind, "text": f"r{round_}"})
            jobs[record.id] = ("misbehave", kind)
            good = await client.submit("echo", {"value": kind})
            jobs[good.id] = ("echo", "ok")
        for kind in POOL_MISBEHAVIOURS:
            record = await client.submit("misbehave_in_pool", {"kind": kind, "text": "p"})
            jobs[record.id] = ("misbehave_in_pool", kind)
    ids = list(jobs)
    for job_id in ids:
        await client.wait(job_id, timeout=30)
    rows = await finals(settings.namespace, ids)
    for job_id, (job_type, kind) in jobs.items():
        row = rows[job_id]
        status, error_kind = MISBEHAVIOURS[kind]
        assert (row["status"], row["error_kind"]) == (status, error_kind), (
            job_type,
            kind,
            dict(row),
        )
        if row["error_message"] is not None:
            assert row["error_message"], (job_type, kind)
    assert worker.lifecycle.health() == (True, "ok")

    def first(job_type: str, kind: str) -> asyncpg.Record:
        return next(rows[i] for i, j in jobs.items() if j == (job_type, kind))

    message = first("misbehave", "nul")["error_message"]
    assert message.startswith("the job's return value cannot be stored: result.s contains NUL")
    assert "1048576" in first("misbehave", "big")["error_message"]
    assert "deeper than 100" in first("misbehave", "very_deep")["error_message"]
    for job_type in ("misbehave", "misbehave_in_pool"):
        error = first(job_type, "error_nul")["error_message"]
        assert error.startswith(
            "r0\ufffd went wrong [coldbrew: 1 character(s)"
        ) or error.startswith("p\ufffd went wrong [coldbrew: 1 character(s)"), error
        # the NUL progress message went to PostgreSQL with the completion (sanitized, or
        # the job's write would have failed); a succeeded job's message is then cleared
        progress_job = first(job_type, "progress_nul")
        assert (progress_job["status"], progress_job["progress_message"]) == ("succeeded", None)
        checkpoint = first(job_type, "checkpoint_nul")["error_message"]
        assert "checkpoint.s contains NUL" in checkpoint
        refused = first(job_type, "retry_far")["error_message"]
        assert refused.startswith("PostgreSQL refused this attempt's outcome (retrying)")
        assert "interval out of range" in refused or "out of range" in refused
