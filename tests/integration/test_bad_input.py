"""Messages that break the contract go to the dead letters with a reason and their bytes."""

from __future__ import annotations

import json
from typing import Any

import aio_pika
import asyncpg

from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.helpers import DATABASE_URL, WorkerFactory, read_dead_letters, wait_until

GARBAGE: list[tuple[str, bytes, str, dict[str, Any]]] = [
    ("not_json", b"\xff\xfe this is not json", "default.default", {}),
    ("not_json", b'{"type": "echo", ', "default.default", {}),
    ("not_object", b"[1, 2, 3]", "default.default", {}),
    ("no_type", b'{"args": {}}', "default.default", {}),
    ("unknown_type", b'{"type": "no_such_job", "args": {}}', "default.default", {}),
    (
        "invalid_args",
        b'{"type": "echo", "args": {"value": 1, "surprise": 2}}',
        "default.default",
        {},
    ),
    ("invalid_args", b'{"type": "cpu", "args": {"n": "lots"}}', "slow.default", {}),
    ("invalid_args", b'{"type": "echo", "args": [1]}', "default.default", {}),
    (
        "too_large",
        b'{"type": "echo", "args": {"value": "' + b"x" * 300_000 + b'"}}',
        "default.default",
        {},
    ),
    ("invalid_tenant", b'{"type": "echo", "args": {}}', "default.Not_OK!", {}),
    ("invalid_queue", b'{"type": "echo", "args": {}}', "No Such Lane.acme", {}),
    (
        "invalid_header",
        b'{"type": "echo", "args": {}}',
        "default.default",
        {"headers": {"x-max-attempts": "many"}},
    ),
    (
        "invalid_message_id",
        b'{"type": "echo", "args": {}}',
        "default.default",
        {"message_id": "x" * 129},
    ),
]


async def rejected_rows(namespace: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": namespace})
    try:
        return await conn.fetch("SELECT reason, detail, routing_key, body FROM rejected_messages")
    finally:
        await conn.close()


async def test_every_kind_of_garbage_is_dead_lettered_with_its_bytes(
    start_worker: WorkerFactory,
    client: Client,
    amqp: aio_pika.abc.AbstractChannel,
    settings: Settings,
) -> None:
    """Each violation is stored with its reason and exact bytes, and copied to <ns>.dead."""
    await start_worker()
    exchange = await amqp.get_exchange(f"{settings.namespace}.jobs")
    for index, (_, body, key, props) in enumerate(GARBAGE):
        props = {"message_id": f"garbage-{index}", **props}
        await exchange.publish(aio_pika.Message(body, **props), routing_key=key)
    good = await client.submit("echo", {"value": "after garbage"})
    assert (await client.wait(good.id, timeout=20)).status == "succeeded"

    async def all_rejected() -> bool:
        return len(await rejected_rows(settings.namespace)) == len(GARBAGE)

    await wait_until(all_rejected, timeout=20)
    rows = await rejected_rows(settings.namespace)
    stored = sorted((row["reason"], bytes(row["body"]), row["routing_key"]) for row in rows)
    expected = sorted((reason, body, key) for reason, body, key, _ in GARBAGE)
    assert stored == expected
    assert all(row["detail"] for row in rows)

    copies = await read_dead_letters(amqp, settings.namespace, len(GARBAGE))
    assert sorted((m.body, m.headers["x-coldbrew-reason"]) for m in copies) == sorted(
        (body, reason) for reason, body, _, _ in GARBAGE
    )


async def test_garbage_does_not_slow_good_jobs(
    start_worker: WorkerFactory,
    client: Client,
    amqp: aio_pika.abc.AbstractChannel,
    settings: Settings,
) -> None:
    """Interleaved garbage and good jobs: every good job succeeds, every bad one is rejected."""
    await start_worker()
    exchange = await amqp.get_exchange(f"{settings.namespace}.jobs")
    for index in range(100):
        await exchange.publish(
            aio_pika.Message(b"garbage %d" % index, message_id=f"bad-{index}"),
            routing_key="default.default",
        )
        body = json.dumps({"type": "noop", "args": {}}).encode()
        await exchange.publish(
            aio_pika.Message(body, message_id=f"good-{index}", delivery_mode=2),
            routing_key="default.default",
        )

    async def all_good_done() -> bool:
        conn = await asyncpg.connect(
            DATABASE_URL, server_settings={"search_path": settings.namespace}
        )
        try:
            return (
                await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 100
            )
        finally:
            await conn.close()

    await wait_until(all_good_done, timeout=30)
    await wait_until(lambda: _len_is(rejected_rows(settings.namespace), 100), timeout=30)


async def _len_is(rows: Any, n: int) -> bool:
    return len(await rows) == n
