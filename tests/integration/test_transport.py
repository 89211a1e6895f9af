"""What the transport gives its callers: settled deliveries, and clear results in an outage.

The outage is this test's own: a TCP proxy sits between the ``Broker`` and
RabbitMQ, and cutting it drops only the connection through it (RabbitMQ
itself is never stopped or reconfigured). During it, every call a worker
makes either raises ``BrokerUnavailable`` or answers False, never a raw
aiormq error: the services wait out the one, the other means the broker
requeued the delivery.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aio_pika
import pytest

from coldbrew.errors import BrokerUnavailable
from coldbrew.model import JobFields
from coldbrew.topology import Topology
from coldbrew.transport import Broker, Inbound
from tests.failover_proxy import TcpProxy
from tests.helpers import AMQP_URL, drop_broker_entities, read_dead_letters, wait_until

UPSTREAM = urlsplit(AMQP_URL)


def proxied_url(proxy: TcpProxy) -> str:
    """``AMQP_URL`` with its host and port replaced by the proxy's."""
    user, at, _ = UPSTREAM.netloc.rpartition("@")
    return UPSTREAM._replace(netloc=f"{user}{at}127.0.0.1:{proxy.port}").geturl()


@pytest.fixture
async def proxy() -> AsyncIterator[TcpProxy]:
    cuttable = await TcpProxy(UPSTREAM.hostname or "127.0.0.1", UPSTREAM.port or 5672).start()
    yield cuttable
    await cuttable.close()


@pytest.fixture
async def broker(namespace: str, proxy: TcpProxy) -> AsyncIterator[Broker]:
    broker = Broker(
        proxied_url(proxy),
        Topology(namespace),
        name=f"transport-{namespace}",
        reconnect_interval=0.3,
    )
    await broker.connect(prefetch=10)
    await broker.declare_job_queue("default", "t1")
    yield broker
    await broker.close()
    await drop_broker_entities(namespace, [("default", "t1")])


def job(index: int) -> JobFields:
    return JobFields(f"j{index}", "noop", "default", "t1", {}, 0, None, None, None)


async def consume(broker: Broker) -> asyncio.Queue[Inbound]:
    got: asyncio.Queue[Inbound] = asyncio.Queue()

    async def on_delivery(message: Inbound) -> None:
        await got.put(message)

    topo = broker.topology
    await broker.consume(topo.job_queue("default", "t1"), topo.job_queue_arguments(), on_delivery)
    return got


async def publish_once_restored(broker: Broker, message: JobFields) -> None:
    """Publish as the relay does: a publish can fail while aio-pika still restores the
    publishing channel after the consuming ones (SEMANTICS §5), so retry until it is back."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        try:
            await broker.publish_job(message)
        except BrokerUnavailable:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)
        else:
            return


async def test_reject_sends_a_delivery_to_the_dead_letter_exchange(
    broker: Broker, namespace: str
) -> None:
    got = await consume(broker)
    await broker.publish_job(job(0))
    message = await asyncio.wait_for(got.get(), timeout=10)
    assert await message.reject()
    assert await message.ack()  # settled already: a no-op, not a channel error
    connection = await aio_pika.connect(AMQP_URL)
    async with connection:
        [dead] = await read_dead_letters(await connection.channel(), namespace, 1)
    assert dead.message_id == "j0"
    assert dead.headers["x-death"][0]["reason"] == "rejected"  # type: ignore[index]
    assert got.empty()  # not requeued


async def test_in_an_outage_calls_raise_broker_unavailable_or_answer_false(
    broker: Broker, proxy: TcpProxy
) -> None:
    got = await consume(broker)
    for index in range(3):
        await broker.publish_job(job(index))
    held = [await asyncio.wait_for(got.get(), timeout=10) for _ in range(3)]

    await proxy.cut()

    async def down() -> bool:
        return not broker.connected

    await wait_until(down, timeout=10)
    assert await held[0].ack() is False
    assert await held[1].requeue() is False
    assert await held[2].reject() is False
    with pytest.raises(BrokerUnavailable):
        await broker.publish_job(job(9))
    with pytest.raises(BrokerUnavailable):  # opening its channel: a bare RuntimeError inside
        await asyncio.wait_for(
            broker.sweep_queue(broker.topology.job_queue("default", "t1"), limit=5), timeout=10
        )

    await proxy.start()  # the same port again
    redelivered = [await asyncio.wait_for(got.get(), timeout=20) for _ in range(3)]
    assert sorted(m.message_id or "" for m in redelivered) == ["j0", "j1", "j2"]
    assert all(m.redelivered for m in redelivered)
    for message in redelivered:
        assert await message.ack()
    await publish_once_restored(broker, job(3))
    fresh = await asyncio.wait_for(got.get(), timeout=10)
    assert fresh.message_id == "j3"
    assert got.empty()  # each delivery once: nothing settled twice, nothing lost
    assert await fresh.ack()
