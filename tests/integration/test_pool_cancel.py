"""A cancel reaches a process-pool job that is still waiting for a free child."""

from __future__ import annotations

from coldbrew.client import Client
from coldbrew.model import Status
from tests.helpers import WorkerFactory, status_is, wait_until


async def test_cancel_of_a_pool_job_waiting_for_a_child(
    start_worker: WorkerFactory, client: Client
) -> None:
    """One child, busy with a 3 s job; a second pool job is claimed and waits for it. Its
    cancel ends the wait: it is cancelled without running (it used to run to its end)."""
    await start_worker(processes=1)
    busy = await client.submit("cpu_sleep", {"seconds": 3})
    await wait_until(lambda: status_is(client, busy.id, "running"), timeout=20)
    waiting = await client.submit("cpu_sleep", {"seconds": 0.1})
    await wait_until(lambda: status_is(client, waiting.id, "running"), timeout=20)
    await client.cancel(waiting.id, "not needed")
    final = await client.wait(waiting.id, timeout=10)
    assert final.status is Status.CANCELLED, final
    assert final.result is None
    assert (await client.get(busy.id)).status is Status.RUNNING  # it never had the child
    assert (await client.wait(busy.id, timeout=20)).status is Status.SUCCEEDED
