"""Conflicts PostgreSQL settles by rolling a statement back: a retry, never a crash.

The PostgreSQL restart fault test once ended with a worker dead of an
unhandled ``DeadlockDetectedError``: its relay's ``mark_published`` and another
worker's claim batch locked the same just-published rows in opposite orders.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from coldbrew.client import Client
from coldbrew.errors import TransientDatabaseError
from coldbrew.settings import Settings
from tests.helpers import DATABASE_URL


async def test_a_deadlock_is_a_transient_error_and_the_store_goes_on(
    client: Client, settings: Settings
) -> None:
    first = (await client.submit("echo", {}, tenant="t1")).id
    second = (await client.submit("echo", {}, tenant="t1")).id
    table = f'"{settings.namespace}".jobs'
    update = f"UPDATE {table} SET priority = $2 WHERE id = $1"
    other = await asyncpg.connect(DATABASE_URL)
    try:
        held = other.transaction()
        await held.start()
        await other.execute(update, second, 1)  # the other side holds the second row

        async def first_then_second(conn: asyncpg.Connection) -> None:
            async with conn.transaction():
                await conn.execute(update, first, 2)
                await conn.execute(update, second, 2)  # waits for the other side

        store_side = asyncio.create_task(client.store._run(first_then_second))
        await asyncio.sleep(0.3)
        # now the other side waits for the first row: a cycle; the store's backend,
        # waiting longer, finds it after deadlock_timeout (1 s) and is rolled back
        other_side = asyncio.create_task(other.execute(update, first, 3))
        with pytest.raises(TransientDatabaseError, match="40P01"):
            await asyncio.wait_for(store_side, timeout=15)
        await asyncio.wait_for(other_side, timeout=15)
        await held.commit()
    finally:
        await other.close()
    # nothing of the rolled-back transaction was written, and the store still works
    assert (await client.store.jobs.get_job(first)).priority == 3
    assert (await client.store.jobs.get_job(second)).priority == 1


async def test_mark_published_skips_a_row_another_transaction_holds(
    client: Client, settings: Settings
) -> None:
    ids = [(await client.submit("echo", {}, tenant="t1")).id for _ in range(2)]
    table = f'"{settings.namespace}".jobs'
    other = await asyncpg.connect(DATABASE_URL)
    try:
        marks = [
            (row["id"], row["publish_after"])
            for row in await other.fetch(
                f"UPDATE {table} SET publish_after = now() + interval '1 minute' "
                "WHERE id = ANY($1) RETURNING id, publish_after",
                ids,
            )
        ]
        held = other.transaction()
        await held.start()
        await other.execute(f"SELECT 1 FROM {table} WHERE id = $1 FOR UPDATE", ids[0])
        # a claim holds the first row: the relay's mark must not wait for it
        await asyncio.wait_for(client.store.outbox.mark_published(marks), timeout=5)
        await held.commit()
        after = dict(
            await other.fetch(f"SELECT id, publish_after FROM {table} WHERE id = ANY($1)", ids)
        )
    finally:
        await other.close()
    assert after[ids[1]] is None  # cleared
    assert after[ids[0]] == dict(marks)[ids[0]]  # skipped, left for clear_stale_publish_marks
